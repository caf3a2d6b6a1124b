#include "client/shard_fanout.h"

#include <algorithm>
#include <optional>
#include <set>

#include "absl/cleanup/cleanup.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace shardopt {

namespace {

// A call to one shard that has failed for this long (or whose attempt ran
// out its deadline) is reported in the log, then at most every interval.
// (Shorter failures are routine: an attach waiting for rank 0 to register.)
constexpr absl::Duration kRetryReportAfter = absl::Seconds(5);
constexpr absl::Duration kRetryReportInterval = absl::Seconds(10);

}  // namespace

// The calls of one Run to its shards. When one shard fails for good, the
// attempts to the others are cancelled: a pull waiting for a version that
// can no longer come would otherwise sit out its whole deadline.
class ShardFanOutOperation {
 public:
  ShardFanOutOperation(const ShardFanOut::Call& call, const ShardFanOut::AttemptFn& attempt)
      : call(call), attempt(attempt) {}

  const ShardFanOut::Call& call;
  const ShardFanOut::AttemptFn& attempt;

  // Registers an attempt's context; false once the operation has failed.
  bool Begin(grpc::ClientContext* context) {
    absl::MutexLock lock(&mu_);
    if (failed_) return false;
    contexts_.insert(context);
    return true;
  }
  void End(grpc::ClientContext* context) {
    absl::MutexLock lock(&mu_);
    contexts_.erase(context);
  }
  // Records shard `index`'s result; the first failure cancels the rest.
  void Finish(absl::Status status) {
    absl::MutexLock lock(&mu_);
    if (!status.ok() && !failed_) {
      failed_ = true;
      first_failure_ = std::move(status);
      for (grpc::ClientContext* c : contexts_) c->TryCancel();
    }
    --running_;
  }
  // Fails the operation as if a shard had failed with `status`.
  void Cancel(absl::Status status) {
    absl::MutexLock lock(&mu_);
    if (failed_) return;
    failed_ = true;
    first_failure_ = std::move(status);
    for (grpc::ClientContext* c : contexts_) c->TryCancel();
  }
  bool failed() {
    absl::MutexLock lock(&mu_);
    return failed_;
  }
  // Sleeps for `d`, or less when the operation fails meanwhile.
  void SleepUnlessFailed(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&failed_), d);
  }
  void Expect(int n) {
    absl::MutexLock lock(&mu_);
    running_ = n;
  }
  absl::Status Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* running) { return *running == 0; }, &running_));
    return first_failure_;
  }

 private:
  absl::Mutex mu_;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status first_failure_ ABSL_GUARDED_BY(mu_);
  std::set<grpc::ClientContext*> contexts_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;
};

namespace {
// The operation whose attempts this thread runs (a worker inside
// RunOnShard): what a FollowUpContext joins.
thread_local ShardFanOutOperation* current_operation = nullptr;
}  // namespace

ShardFanOut::FollowUpContext::FollowUpContext(absl::Duration timeout) {
  context_.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (current_operation == nullptr) return;
  if (current_operation->Begin(&context_)) {
    op_ = current_operation;
  } else {
    context_.TryCancel();  // (The run already failed: its call ends CANCELLED.)
  }
}

ShardFanOut::FollowUpContext::~FollowUpContext() {
  if (op_ != nullptr) op_->End(&context_);
}

struct ShardFanOut::Worker {
  ShardConnection* shard = nullptr;
  absl::Mutex mu;
  Operation* task ABSL_GUARDED_BY(mu) = nullptr;
  bool stop ABSL_GUARDED_BY(mu) = false;
  std::thread thread;
};

ShardFanOut::ShardFanOut(std::vector<ShardConnection*> shards) : shards_(std::move(shards)) {
  for (ShardConnection* shard : shards_) {
    auto worker = std::make_unique<Worker>();
    worker->shard = shard;
    workers_.push_back(std::move(worker));
  }
  for (auto& worker : workers_) {
    worker->thread = std::thread([this, w = worker.get()] { WorkerLoop(w); });
  }
}

ShardFanOut::~ShardFanOut() {
  for (auto& worker : workers_) {
    absl::MutexLock lock(&worker->mu);
    worker->stop = true;
  }
  for (auto& worker : workers_) worker->thread.join();
}

void ShardFanOut::WorkerLoop(Worker* worker) {
  for (;;) {
    Operation* op = nullptr;
    {
      absl::MutexLock lock(&worker->mu);
      worker->mu.Await(absl::Condition(
          +[](Worker* w) ABSL_NO_THREAD_SAFETY_ANALYSIS { return w->stop || w->task != nullptr; },
          worker));
      if (worker->task == nullptr) return;  // Stopping.
      op = worker->task;
      worker->task = nullptr;
    }
    absl::Status status = RunOnShard(*op, *worker->shard);
    op->Finish(worker->shard->Annotate(status, op->call.what));
  }
}

std::vector<uint32_t> ShardFanOut::Targets(const std::vector<uint32_t>& which) const {
  std::vector<uint32_t> targets = which;
  if (targets.empty()) {
    for (uint32_t i = 0; i < shards_.size(); ++i) targets.push_back(i);
  }
  return targets;
}

void RunCanceller::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (op_ != nullptr) op_->Cancel(absl::CancelledError("cancelled by the trainer"));
}

void RunCanceller::Reset() {
  absl::MutexLock lock(&mu_);
  cancelled_ = false;
}

absl::Status ShardFanOut::Run(const Call& call, const AttemptFn& attempt,
                              const std::vector<uint32_t>& which) {
  if (running_.exchange(true)) {
    // (INTERNAL: a caller's bug, which no caller takes for a step's state.)
    return absl::InternalError(
        absl::StrCat(call.what,
                     ": another call to the shards is still running on this connection "
                     "(calls of one TrainerClient overlapped)"));
  }
  const absl::Cleanup done = [this] { running_.store(false); };
  const std::vector<uint32_t> targets = Targets(which);
  Operation op(call, attempt);
  if (call.canceller != nullptr) {
    absl::MutexLock lock(&call.canceller->mu_);
    if (call.canceller->cancelled_) return absl::CancelledError("cancelled by the trainer");
    call.canceller->op_ = &op;
  }
  op.Expect(static_cast<int>(targets.size()));
  for (uint32_t i : targets) {
    Worker& worker = *workers_[i];
    absl::MutexLock lock(&worker.mu);
    worker.task = &op;
  }
  absl::Status status = op.Wait();
  if (call.canceller != nullptr) {
    absl::MutexLock lock(&call.canceller->mu_);
    call.canceller->op_ = nullptr;
  }
  return status;
}

absl::Status ShardFanOut::RunOnShard(Operation& op, ShardConnection& shard) {
  current_operation = &op;
  const absl::Cleanup left = [] { current_operation = nullptr; };
  const Call& call = op.call;
  thread_local absl::BitGen random;
  absl::Duration backoff = std::max(call.policy.initial_backoff, absl::Milliseconds(1));
  std::optional<absl::Time> give_up;  // Set by the first failure.
  absl::Time next_report = absl::InfiniteFuture();  // Set by the first failure.
  for (;;) {
    const absl::Time deadline = absl::Now() + call.attempt_timeout;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    if (!op.Begin(&context)) return absl::CancelledError("cancelled: another shard failed");
    shard.PrepareAttempt();
    const absl::Status status = op.attempt(shard, context);
    op.End(&context);
    const bool deadline_passed = absl::Now() >= deadline;
    shard.RecordAttempt(status, deadline_passed);
    if (status.ok()) return status;
    if (!give_up) {
      give_up = absl::Now() + call.policy.budget;
      next_report = deadline_passed ? absl::Now() : absl::Now() + kRetryReportAfter;
    }
    if (IsWaitReport(status, deadline)) {
      // The shard's report that it still waits (for other trainers).
      if (call.on_wait) {
        call.on_wait(absl::StrCat("shard ", shard.index(), " (", shard.address(),
                                  "): ", call.what, ": ", status.message()));
      }
      if (call.end_on_wait_report || absl::Now() >= *give_up) return status;
      if (call.on_wait_check) {
        if (absl::Status check = call.on_wait_check(); !check.ok()) return check;
      }
      continue;
    }
    // CANCELLED that this client did not ask for (no other shard failed): a
    // shard shutting down (SIGTERM) cancels the calls gRPC had not yet handed
    // to the service. It is back soon (a rolling restart): retried when the
    // call retries UNAVAILABLE.
    const bool cancelled_by_shard =
        absl::IsCancelled(status) && !op.failed() &&
        call.retryable(absl::UnavailableError("cancelled by the shard"));
    if (!call.retryable(status) && !cancelled_by_shard) return status;
    const absl::Duration sleep = backoff * absl::Uniform(random, 0.75, 1.25);
    if (absl::Now() + sleep > *give_up) return status;
    // A call that keeps failing (an attempt that ran out its deadline
    // above all) shows in the log while it retries, not only once its
    // budget is spent.
    if (absl::Now() >= next_report || deadline_passed) {
      LogWarning("shard %d (%s): %s: attempt failed after %.1f s (%s); retrying for up to %.0f s",
                 shard.index(), shard.address(), call.what,
                 absl::ToDoubleSeconds(absl::Now() - (deadline - call.attempt_timeout)),
                 status.ToString(), absl::ToDoubleSeconds(*give_up - absl::Now()));
      next_report = absl::Now() + kRetryReportInterval;
    }
    op.SleepUnlessFailed(sleep);
    backoff = std::min(backoff * 2, std::max(call.policy.max_backoff, absl::Milliseconds(1)));
  }
}

}  // namespace shardopt
