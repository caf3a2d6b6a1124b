// UnlistableDirectoryEnv: a FileEnv for fault-injection tests in which
// every directory named `name` cannot be listed (PERMISSION_DENIED), as a
// root-owned `lost+found` (mode 0700) at the top of a shared checkpoint
// filesystem is for a server that does not run as root; every other
// operation passes through to the wrapped FileEnv. Thread-safe (as its
// target).
#ifndef SHARDOPT_TESTS_SUPPORT_UNLISTABLE_DIRECTORY_ENV_H_
#define SHARDOPT_TESTS_SUPPORT_UNLISTABLE_DIRECTORY_ENV_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"

namespace shardopt::testing {

class UnlistableDirectoryEnv : public FileEnvWrapper {
 public:
  UnlistableDirectoryEnv(FileEnv* target, std::string name)
      : FileEnvWrapper(target), name_(std::move(name)) {}

  absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& path) override {
    if (BaseName(path) == name_) {
      return absl::PermissionDeniedError(
          absl::StrCat("listing ", path, ": permission denied (a fault injected by the test)"));
    }
    return FileEnvWrapper::ListDirectory(path);
  }

 private:
  const std::string name_;
};

}  // namespace shardopt::testing

#endif  // SHARDOPT_TESTS_SUPPORT_UNLISTABLE_DIRECTORY_ENV_H_
