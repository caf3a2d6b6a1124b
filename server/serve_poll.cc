#include "server/serve_poll.h"

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/time/clock.h"
#include "common/logging.h"

namespace shardopt {

ServePoll::Result ServePoll::Poll(std::vector<pollfd>& watched, int timeout_ms) {
  if (poll(watched.data(), watched.size(), timeout_ms) >= 0) {
    if (failing_) LogInfo("%s: poll works again; serving", what_);
    failing_ = false;
    return Result::kReady;
  }
  const int error = errno;
  if (error == EINTR) return Result::kAgain;
  if (!failing_) {
    LogWarning("%s: poll of %zu descriptors failed: %s; trying again every 100 ms", what_,
               watched.size(), strerror(error));
  }
  failing_ = true;
  absl::SleepFor(absl::Milliseconds(100));
  uint64_t woken = 0;
  if (read(wake_fd_, &woken, sizeof(woken)) == static_cast<ssize_t>(sizeof(woken))) {
    return Result::kStop;
  }
  return Result::kAgain;
}

}  // namespace shardopt
