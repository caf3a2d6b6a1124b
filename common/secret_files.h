// Secrets read from files (bearer tokens, TLS private keys) by the server and
// the client: a file other users of the machine may read is still used (a
// deployment may share it on purpose, as a Kubernetes Secret mounted 0440
// is), with a warning that names it, as ssh does for a key.
#ifndef SHARDOPT_COMMON_SECRET_FILES_H_
#define SHARDOPT_COMMON_SECRET_FILES_H_

#include <string>

#include "absl/strings/string_view.h"
#include "common/file.h"

namespace shardopt {

// Logs a warning naming `what` (a flag, "token file") and `path` when users
// other than its owner may read it: everyone, or a group this process is not
// in (its own group may: a Kubernetes Secret, mode 0440 in the pod's
// fsGroup); nothing when it cannot be stat'ed.
void WarnIfSecretReadableByOthers(FileEnv* env, absl::string_view what, const std::string& path);

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_SECRET_FILES_H_
