// Retries of idempotent calls with capped exponential backoff.
#ifndef SHARDOPT_CLIENT_RETRY_H_
#define SHARDOPT_CLIENT_RETRY_H_

#include <functional>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace shardopt {

struct RetryPolicy {
  // How long to keep retrying, counted from the end of the first attempt (so
  // an attempt that used its whole deadline can still be retried).
  absl::Duration budget = absl::Seconds(60);
  absl::Duration initial_backoff = absl::Milliseconds(20);  // At least 1 ms is used.
  absl::Duration max_backoff = absl::Seconds(2);
};

// Whether `status`, the answer of a call whose deadline is `deadline`, is a
// shard's "still waiting" report: DEADLINE_EXCEEDED while the call had time
// left (its wait was bounded by the request's max_wait_ms). After the
// deadline it is the call's own timeout. (The data planes' own timeouts
// reach the trainer as UNAVAILABLE: server/service_replies.h.)
bool IsWaitReport(const absl::Status& status, absl::Time deadline);

// True for failures after which repeating an idempotent call can succeed:
// the server was unreachable, asked for a retry, or one attempt ran out of
// time.
bool IsRetryable(const absl::Status& status);

// Calls `attempt` until it returns OK, a status `retryable` rejects, or the
// budget is spent (then the last status is returned). Sleeps between attempts
// grow from initial_backoff to max_backoff, each with up to +-25% random
// jitter so that trainers refused together do not retry in lockstep.
// `retryable` defaults to IsRetryable.
absl::Status RetryWithBackoff(
    const RetryPolicy& policy, const std::function<absl::Status()>& attempt,
    const std::function<bool(const absl::Status&)>& retryable = IsRetryable);

// The next wait of a backoff that starts at `first` and doubles up to `cap`
// (`previous`: the wait before, zero for none): the transports' waits
// before they try a shard's data plane again.
absl::Duration DoubledBackoff(absl::Duration previous, absl::Duration first, absl::Duration cap);

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_RETRY_H_
