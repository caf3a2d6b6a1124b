#include "server/stream_watchdog.h"

#include <algorithm>

#include "common/logging.h"

namespace shardopt {

StreamWatchdog::StreamWatchdog(absl::Duration idle_timeout) : idle_timeout_(idle_timeout) {
  if (idle_timeout_ > absl::ZeroDuration()) thread_ = std::thread([this] { Loop(); });
}

StreamWatchdog::~StreamWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void StreamWatchdog::Loop() {
  // Checking a few times per timeout cancels a stream at most ~25% late.
  const absl::Duration period =
      std::clamp(idle_timeout_ / 4, absl::Milliseconds(10), absl::Seconds(1));
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), period);
    const absl::Time now = absl::Now();
    for (auto& [id, entry] : streams_) {
      if (entry.context != nullptr && now - entry.last_activity > idle_timeout_) {
        LogWarning("cancelling a stream from %s idle for %s", entry.context->peer(),
                   absl::FormatDuration(now - entry.last_activity));
        entry.context->TryCancel();
        entry.context = nullptr;  // Cancelled once; the handler ends soon.
      }
    }
  }
}

StreamWatchdog::Watch::Watch(StreamWatchdog* watchdog, grpc::ServerContextBase* context)
    : watchdog_(watchdog) {
  absl::MutexLock lock(&watchdog_->mu_);
  id_ = watchdog_->next_id_++;
  watchdog_->streams_[id_] = Entry{context, absl::Now()};
}

StreamWatchdog::Watch::~Watch() {
  absl::MutexLock lock(&watchdog_->mu_);
  watchdog_->streams_.erase(id_);
}

void StreamWatchdog::Watch::Stop() {
  absl::MutexLock lock(&watchdog_->mu_);
  watchdog_->streams_.erase(id_);
}

void StreamWatchdog::Watch::Touch() {
  absl::MutexLock lock(&watchdog_->mu_);
  auto it = watchdog_->streams_.find(id_);
  if (it != watchdog_->streams_.end()) it->second.last_activity = absl::Now();
}

}  // namespace shardopt
