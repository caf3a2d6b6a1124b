// Retries of idempotent calls with capped exponential backoff.
#ifndef SHARDOPT_CLIENT_RETRY_H_
#define SHARDOPT_CLIENT_RETRY_H_

#include <functional>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace shardopt {

struct RetryPolicy {
  absl::Duration budget = absl::Seconds(60);  // Total time spent retrying.
  absl::Duration initial_backoff = absl::Milliseconds(20);
  absl::Duration max_backoff = absl::Seconds(2);
};

// True for failures after which repeating an idempotent call can succeed:
// the server was unreachable, asked for a retry, or one attempt ran out of
// time.
bool IsRetryable(const absl::Status& status);

// Calls `attempt` until it returns OK, a status `retryable` rejects, or the
// budget is spent (then the last status is returned). `retryable` defaults to
// IsRetryable.
absl::Status RetryWithBackoff(const RetryPolicy& policy,
                              const std::function<absl::Status()>& attempt,
                              const std::function<bool(const absl::Status&)>& retryable =
                                  IsRetryable);

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_RETRY_H_
