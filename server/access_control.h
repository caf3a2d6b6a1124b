// AccessControl: who may call what on a shard server, from bearer tokens.
//
// Without --auth_token_file every call is allowed (plaintext on loopback
// stays the default). With it, each call must carry `authorization: Bearer
// <token>` (common/auth_metadata.h) naming one of the file's tokens:
//   - a `trainer` token may call everything;
//   - a `readonly` token may call only what reads (Inspect, GetServerInfo;
//     gRPC's health and reflection services never need a token, so that
//     probes and `grpcurl list` work; server/reflection_limits.h bounds
//     the threads reflection's streams can hold);
//   - no token, or one not in the file: UNAUTHENTICATED; a read-only token
//     calling a write: PERMISSION_DENIED. Refused calls change nothing.
// The token file holds one `ROLE TOKEN` pair per line (ROLE `trainer` or
// `readonly`; a `#` at the start of a line or after a space starts a
// comment); tokens are at least 16 bytes of
// printable ASCII without spaces. Tokens are compared in constant time.
// Immutable after construction, so thread-safe.
#ifndef SHARDOPT_SERVER_ACCESS_CONTROL_H_
#define SHARDOPT_SERVER_ACCESS_CONTROL_H_

#include <grpcpp/server_context.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardopt {

enum class Access { kRead, kWrite };

class AccessControl {
 public:
  // Allows every call.
  AccessControl() = default;
  // From the contents of a token file; INVALID_ARGUMENT naming the line
  // that is not `ROLE TOKEN`, and for a file without tokens.
  static absl::StatusOr<AccessControl> FromTokenFileContents(absl::string_view contents);

  bool enabled() const { return !tokens_.empty(); }
  // OK when the call's metadata may do `access`; otherwise the status to
  // answer, before anything is touched.
  absl::Status Check(const grpc::ServerContext& context, Access access) const;
  // The same from the call's `authorization` value (nullopt: none sent).
  absl::Status Check(std::optional<absl::string_view> authorization, Access access) const;

 private:
  struct Token {
    std::string value;
    bool may_write = false;
  };
  std::vector<Token> tokens_;
};

// The smallest token length accepted, so that a guessable word is no token.
inline constexpr size_t kMinTokenBytes = 16;

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_ACCESS_CONTROL_H_
