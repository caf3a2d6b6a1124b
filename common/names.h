// Names and paths that arrive in requests: the bounds every part of shardopt
// holds them to, and the one form in which an error message quotes them.
//
// A request may carry anything (a 1 MiB model id, a NUL byte in a path);
// what a server logs or echoes back of it must stay small, or the reply's
// metadata outgrows gRPC's limits and the caller sees RESOURCE_EXHAUSTED
// instead of the real status. Client and server both check ids with these
// functions, so a name the client accepts is one every shard accepts.
#ifndef SHARDOPT_COMMON_NAMES_H_
#define SHARDOPT_COMMON_NAMES_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace shardopt {

// Model ids name checkpoint directories; run ids are written into them.
inline constexpr size_t kMaxIdBytes = 128;
inline constexpr size_t kMaxTensorNameBytes = 256;
// Checkpoint directories sent in requests (well under PATH_MAX).
inline constexpr size_t kMaxPathBytes = 1024;
// Most bytes of a request's string that an error message repeats.
inline constexpr size_t kMaxQuotedBytes = 64;
// The label a trainer gives itself when it opens a device pair (logs, errors).
inline constexpr size_t kMaxPeerLabelBytes = 256;

// 'text' for an error message or a log line: at most kMaxQuotedBytes of it,
// then "...' (N bytes)"; bytes outside printable ASCII as \xNN.
std::string Quoted(absl::string_view text);

// INVALID_ARGUMENT unless `id` is 1..kMaxIdBytes of letters, digits, '_',
// '-' and '.', not starting with '.' (a plain file name). `what` names the
// field ("model_id").
absl::Status CheckId(absl::string_view what, absl::string_view id);
// INVALID_ARGUMENT unless `name` is 1..kMaxTensorNameBytes bytes without NUL.
absl::Status CheckTensorName(absl::string_view name);
// INVALID_ARGUMENT unless `path` is a usable file system path: not empty, at
// most kMaxPathBytes, no NUL byte (the system would cut the name there), no
// component longer than 255 bytes (NAME_MAX).
absl::Status CheckPath(absl::string_view what, absl::string_view path);
// PERMISSION_DENIED unless `path` lies inside directory `root` (a
// CheckPath-valid path, with no "." or ".." component, below root).
absl::Status CheckPathInside(absl::string_view what, absl::string_view path,
                             absl::string_view root);

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_NAMES_H_
