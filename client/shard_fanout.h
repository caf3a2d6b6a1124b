// ShardFanOut: one call made to every shard (or some of them) at once, each
// on the shard's own long-lived worker thread (no threads are made per
// call), with retries, and cancellation of the others when one shard fails
// for good.
//
// Each attempt gets a fresh context with a deadline of `attempt_timeout`.
// A failure `retryable` accepts is retried with capped exponential backoff
// (RetryPolicy) until the budget is spent. A shard's report that it is still
// waiting (DEADLINE_EXCEEDED before the attempt's own deadline: the server's
// max_wait ran out) is passed to `on_wait` and retried at once; those waits
// count against the same budget. A CANCELLED this client did not cause (a
// shard shutting down cancels calls not yet handed to its service) is
// retried like UNAVAILABLE, if `retryable` accepts that. The first shard to
// fail for good cancels
// the attempts in flight to the others, and its error (annotated with the
// shard, its address and `what`) is the result.
//
// Run() is called by one thread at a time (the trainer's, or a streamed
// push's while the trainer's makes no call), never from inside an attempt;
// a Run() that overlaps another is refused (INTERNAL) rather than taking its
// workers (both would wait forever).
#ifndef SHARDOPT_CLIENT_SHARD_FANOUT_H_
#define SHARDOPT_CLIENT_SHARD_FANOUT_H_

#include <grpcpp/client_context.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/retry.h"
#include "client/shard_connection.h"

namespace shardopt {

// Ends the Run of a Call that names it (and later ones, until Reset) from
// another thread: its attempts are cancelled and it returns CANCELLED.
class RunCanceller {
 public:
  void Cancel();
  void Reset();

 private:
  friend class ShardFanOut;
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  class ShardFanOutOperation* op_ ABSL_GUARDED_BY(mu_) = nullptr;
};

class ShardFanOut {
 public:
  using AttemptFn = std::function<absl::Status(ShardConnection&, grpc::ClientContext&)>;
  struct Call {
    std::string what;  // For errors: "PushGradients step 12".
    RetryPolicy policy;
    absl::Duration attempt_timeout = absl::Seconds(60);
    std::function<bool(const absl::Status&)> retryable = IsRetryable;
    // Receives "shard i (address): what: <the shard's report>".
    std::function<void(const std::string&)> on_wait;
    // End the call at the first such report instead of waiting on (the
    // report is then the result): for callers that look again first.
    bool end_on_wait_report = false;
    // Asked after each such report (from the waiting shard's worker): a
    // status that is not OK ends the call with it instead of waiting on
    // (what is waited for may never come, e.g. another shard lost this
    // trainer's push and the trainers wait for each other across shards).
    std::function<absl::Status()> on_wait_check;
    RunCanceller* canceller = nullptr;  // Not owned; may be null.
  };

  // Starts one worker per connection; `shards` must outlive the fan-out.
  explicit ShardFanOut(std::vector<ShardConnection*> shards);
  ~ShardFanOut();
  ShardFanOut(const ShardFanOut&) = delete;
  ShardFanOut& operator=(const ShardFanOut&) = delete;

  // A context for a call an attempt makes besides its own (an attempt that
  // sends several requests, a check between attempts): a deadline of
  // `timeout`, and cancelled with the attempt's own (the run's canceller,
  // another shard's failure). On a thread that runs no attempt it is a
  // plain context with that deadline.
  class FollowUpContext {
   public:
    explicit FollowUpContext(absl::Duration timeout);
    ~FollowUpContext();
    FollowUpContext(const FollowUpContext&) = delete;
    FollowUpContext& operator=(const FollowUpContext&) = delete;
    grpc::ClientContext& get() { return context_; }

   private:
    grpc::ClientContext context_;
    ShardFanOutOperation* op_ = nullptr;
  };

  // Runs `attempt` against the shards in `which` (all when empty).
  absl::Status Run(const Call& call, const AttemptFn& attempt,
                   const std::vector<uint32_t>& which = {});
  // The shards `which` names, in its order: every shard when it is empty.
  std::vector<uint32_t> Targets(const std::vector<uint32_t>& which) const;

  size_t size() const { return shards_.size(); }
  const std::vector<ShardConnection*>& shards() const { return shards_; }

 private:
  using Operation = ShardFanOutOperation;
  struct Worker;
  void WorkerLoop(Worker* worker);
  absl::Status RunOnShard(Operation& op, ShardConnection& shard);

  std::vector<ShardConnection*> shards_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::atomic<bool> running_{false};
};

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_SHARD_FANOUT_H_
