// How a bearer token travels in a call's metadata: the one rule the client
// (which sends it) and the server (which checks it) share.
//
// `authorization: Bearer <token>`, as gRPC's own AccessTokenCredentials and
// grpcurl's `-H 'authorization: Bearer ...'` send it.
#ifndef SHARDOPT_COMMON_AUTH_METADATA_H_
#define SHARDOPT_COMMON_AUTH_METADATA_H_

#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace shardopt {

// gRPC metadata keys are lower case.
inline constexpr char kAuthorizationMetadataKey[] = "authorization";
inline constexpr char kBearerPrefix[] = "Bearer ";

inline std::string BearerMetadataValue(absl::string_view token) {
  return absl::StrCat(kBearerPrefix, token);
}

// The token of an `authorization` value, if it is a bearer token.
inline std::optional<absl::string_view> TokenOfBearerValue(absl::string_view value) {
  if (!absl::StartsWithIgnoreCase(value, kBearerPrefix)) return std::nullopt;
  return value.substr(sizeof(kBearerPrefix) - 1);
}

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_AUTH_METADATA_H_
