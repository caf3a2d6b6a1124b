#include "client/retry.h"

#include <algorithm>

#include "absl/random/random.h"
#include "absl/time/clock.h"

namespace shardopt {

bool IsRetryable(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsAborted(status) || absl::IsDeadlineExceeded(status);
}

absl::Status RetryWithBackoff(const RetryPolicy& policy,
                              const std::function<absl::Status()>& attempt,
                              const std::function<bool(const absl::Status&)>& retryable) {
  absl::Status status = attempt();
  const absl::Time give_up = absl::Now() + policy.budget;
  absl::Duration backoff = std::max(policy.initial_backoff, absl::Milliseconds(1));
  thread_local absl::BitGen random;
  while (!status.ok() && retryable(status)) {
    const absl::Duration sleep = backoff * absl::Uniform(random, 0.75, 1.25);
    if (absl::Now() + sleep > give_up) break;
    absl::SleepFor(sleep);
    backoff = std::min(backoff * 2, std::max(policy.max_backoff, absl::Milliseconds(1)));
    status = attempt();
  }
  return status;
}

bool IsWaitReport(const absl::Status& status, absl::Time deadline) {
  return absl::IsDeadlineExceeded(status) && absl::Now() < deadline;
}

absl::Duration DoubledBackoff(absl::Duration previous, absl::Duration first, absl::Duration cap) {
  return std::min(cap, std::max(first, 2 * previous));
}

}  // namespace shardopt
