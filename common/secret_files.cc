#include "common/secret_files.h"

#include "common/logging.h"

namespace shardopt {

void WarnIfSecretReadableByOthers(FileEnv* env, absl::string_view what, const std::string& path) {
  absl::StatusOr<FileInfo> info = env->Stat(path);
  if (info.ok() && info->readable_by_others) {
    LogWarning("%s %s is readable by other users of this machine: chmod 600 it", what, path);
  }
}

}  // namespace shardopt
