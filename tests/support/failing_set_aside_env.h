// FailingSetAsideEnv: a FileEnv for fault-injection tests whose first rename
// of a checkpoint step directory aside as abandoned (".abandoned.",
// common/checkpoint_catalog.h: a rollback's) fails PERMISSION_DENIED, as on
// a shared checkpoint root where this server's user may not rename a
// directory another shard's user made; every later one, and every other
// operation, passes through to the wrapped FileEnv. Thread-safe (as its
// target).
#ifndef SHARDOPT_TESTS_SUPPORT_FAILING_SET_ASIDE_ENV_H_
#define SHARDOPT_TESTS_SUPPORT_FAILING_SET_ASIDE_ENV_H_

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"

namespace shardopt::testing {

class FailingSetAsideEnv : public FileEnvWrapper {
 public:
  explicit FailingSetAsideEnv(FileEnv* target) : FileEnvWrapper(target) {}

  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (to.find("/.abandoned.") != std::string::npos && !failed_.exchange(true)) {
      return absl::PermissionDeniedError(
          absl::StrCat("renaming ", from, " (a fault injected by the test)"));
    }
    return FileEnvWrapper::Rename(from, to);
  }

 private:
  std::atomic<bool> failed_{false};
};

}  // namespace shardopt::testing

#endif  // SHARDOPT_TESTS_SUPPORT_FAILING_SET_ASIDE_ENV_H_
