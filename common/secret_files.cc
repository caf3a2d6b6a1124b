#include "common/secret_files.h"

#include <unistd.h>

#include <algorithm>
#include <vector>

#include "common/logging.h"

namespace shardopt {
namespace {

// Whether this process is in group `gid` (effective or supplementary): a
// file only its own group may read is how a Kubernetes Secret reaches a
// non-root container (mode 0440, the pod's fsGroup).
bool InOwnGroups(gid_t gid) {
  if (gid == ::getegid()) return true;
  const int count = ::getgroups(0, nullptr);
  if (count <= 0) return false;
  std::vector<gid_t> groups(static_cast<size_t>(count));
  const int got = ::getgroups(count, groups.data());
  return got > 0 && std::find(groups.begin(), groups.begin() + got, gid) != groups.begin() + got;
}

}  // namespace

void WarnIfSecretReadableByOthers(FileEnv* env, absl::string_view what, const std::string& path) {
  absl::StatusOr<FileInfo> info = env->Stat(path);
  if (info.ok() && (info->other_readable ||
                    (info->group_readable && !InOwnGroups(static_cast<gid_t>(info->group))))) {
    LogWarning("%s %s is readable by other users of this machine: chmod 600 it", what, path);
  }
}

}  // namespace shardopt
