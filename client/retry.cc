#include "client/retry.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace shardopt {

bool IsRetryable(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsAborted(status) ||
         absl::IsDeadlineExceeded(status);
}

absl::Status RetryWithBackoff(const RetryPolicy& policy,
                              const std::function<absl::Status()>& attempt,
                              const std::function<bool(const absl::Status&)>& retryable) {
  const absl::Time give_up = absl::Now() + policy.budget;
  absl::Duration backoff = policy.initial_backoff;
  while (true) {
    absl::Status status = attempt();
    if (status.ok() || !retryable(status)) return status;
    const absl::Time now = absl::Now();
    if (now + backoff > give_up) return status;
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, policy.max_backoff);
  }
}

}  // namespace shardopt
