#include "server/access_control.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/auth_metadata.h"

namespace shardopt {
namespace {

// Equal in time that depends only on the lengths, not on where they differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

bool IsTokenText(absl::string_view token) {
  for (char c : token) {
    if (c <= ' ' || c > '~') return false;
  }
  return token.size() >= kMinTokenBytes;
}

}  // namespace

absl::StatusOr<AccessControl> AccessControl::FromTokenFileContents(absl::string_view contents) {
  AccessControl control;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(contents, '\n')) {
    ++line_number;
    // A comment starts at a '#' that begins the line or follows a space, so
    // that a token may hold '#'.
    for (size_t hash = line.find('#'); hash != absl::string_view::npos;
         hash = line.find('#', hash + 1)) {
      if (hash == 0 || line[hash - 1] == ' ' || line[hash - 1] == '\t') {
        line = line.substr(0, hash);
        break;
      }
    }
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() != 2 || (fields[0] != "trainer" && fields[0] != "readonly") ||
        !IsTokenText(fields[1])) {
      // The line itself is not repeated: it may hold a token.
      return absl::InvalidArgumentError(
          absl::StrCat("token file line ", line_number,
                       " is not `trainer TOKEN` or `readonly TOKEN` with a "
                       "token of at least ",
                       kMinTokenBytes, " printable bytes without spaces"));
    }
    control.tokens_.push_back(Token{std::string(fields[1]), fields[0] == "trainer"});
  }
  if (control.tokens_.empty()) {
    return absl::InvalidArgumentError("the token file holds no tokens");
  }
  return control;
}

absl::Status AccessControl::Check(const grpc::ServerContext& context, Access access) const {
  if (!enabled()) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find(kAuthorizationMetadataKey);
  if (it == metadata.end()) return Check(std::nullopt, access);
  return Check(absl::string_view(it->second.data(), it->second.size()), access);
}

absl::Status AccessControl::Check(std::optional<absl::string_view> authorization,
                                  Access access) const {
  if (!enabled()) return absl::OkStatus();
  if (!authorization) {
    return absl::UnauthenticatedError(
        "this shard server requires a bearer token (call metadata `authorization: Bearer "
        "<token>`)");
  }
  const std::optional<absl::string_view> presented = TokenOfBearerValue(*authorization);
  if (!presented) {
    return absl::UnauthenticatedError(
        "the call's `authorization` metadata is not `Bearer <token>`");
  }
  // Every token is compared, so the time does not tell which one matched.
  const Token* match = nullptr;
  for (const Token& t : tokens_) {
    if (ConstantTimeEquals(t.value, *presented)) match = &t;
  }
  if (match == nullptr) return absl::UnauthenticatedError("the bearer token is not valid here");
  if (access == Access::kWrite && !match->may_write) {
    return absl::PermissionDeniedError(
        "a read-only token may call only Inspect, GetServerInfo and the health service");
  }
  return absl::OkStatus();
}

}  // namespace shardopt
