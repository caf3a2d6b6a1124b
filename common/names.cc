#include "common/names.h"

#include <cctype>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace shardopt {

std::string Quoted(absl::string_view text) {
  std::string out = "'";
  const absl::string_view shown = text.substr(0, kMaxQuotedBytes);
  for (char c : shown) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f && c != '\\') {
      out.push_back(c);
    } else {
      absl::StrAppendFormat(&out, "\\x%02x", u);
    }
  }
  if (shown.size() < text.size()) {
    absl::StrAppend(&out, "...' (", text.size(), " bytes)");
  } else {
    out.push_back('\'');
  }
  return out;
}

absl::Status CheckId(absl::string_view what, absl::string_view id) {
  if (id.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  if (id.size() > kMaxIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", Quoted(id), " is longer than ", kMaxIdBytes, " bytes"));
  }
  for (char c : id) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", Quoted(id), " may hold only letters, digits, '_', '-' and '.'"));
    }
  }
  if (id[0] == '.') {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", Quoted(id), " starts with '.'"));
  }
  return absl::OkStatus();
}

absl::Status CheckTensorName(absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("a tensor has an empty name");
  if (name.size() > kMaxTensorNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("tensor name ", Quoted(name), " is longer than ",
                                                   kMaxTensorNameBytes, " bytes"));
  }
  if (name.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor name ", Quoted(name), " holds a NUL byte"));
  }
  return absl::OkStatus();
}

absl::Status CheckPath(absl::string_view what, absl::string_view path) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  if (path.size() > kMaxPathBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", Quoted(path), " is longer than ", kMaxPathBytes, " bytes"));
  }
  if (path.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", Quoted(path), " holds a NUL byte"));
  }
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part.size() > 255) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", Quoted(path), " has a component longer than 255 bytes"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckPathInside(absl::string_view what, absl::string_view path,
                             absl::string_view root) {
  if (absl::Status s = CheckPath(what, path); !s.ok()) return s;
  absl::string_view prefix = root;
  while (prefix.size() > 1 && prefix.back() == '/') prefix.remove_suffix(1);
  const bool below = path.size() > prefix.size() + 1 && absl::StartsWith(path, prefix) &&
                     (prefix == "/" || path[prefix.size()] == '/');
  bool climbs = false;
  for (absl::string_view part : absl::StrSplit(path, '/')) climbs |= part == "." || part == "..";
  if (!below || climbs) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, " ", Quoted(path), " is not inside ", Quoted(root)));
  }
  return absl::OkStatus();
}

}  // namespace shardopt
