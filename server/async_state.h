// AsyncState: one shard's step protocol in the asynchronous and
// bounded-staleness consistency modes (the first part of issue 14; not yet
// driven by ModelShard), as pure transitions: no locks, no I/O, no clock, in
// the manner of StepState.
//
// Each trainer's push of its own step k (1, 2, ...) is an optimizer step of
// its own, applied alone (no reduction across trainers), one at a time, in
// the order the pushes were committed (CommitPush) among those eligible. The
// shard's version counts the pushes it applied. The exactly-once record is
// the per-trainer vector `applied` (the last step of each trainer applied
// here), which checkpoints keep: trainer r's push of step k <= applied[r] is
// acknowledged and ignored, k == applied[r] + 1 is admitted (one push of it
// at a time), and a later k is OUT_OF_RANGE naming the steps missing (the
// trainer re-pushes them first, as after a restore from an older
// checkpoint).
//
// A committed push waits (kQueued) until it is eligible:
//  - bounded staleness s >= 1: trainer r's step k, until every other
//    trainer's step k - s or later is applied here (applied, not only
//    queued: a queued push may be withdrawn); Laggards() names the trainers
//    it waits for;
//  - a hold of step N (AddHold: a checkpoint as a consistent cut; periodic
//    checkpoints take the next one's hold before they release their own):
//    a push of a step beyond N, so that the shard reaches exactly "every
//    trainer's step N" (UniformCutReached) and every shard's checkpoint of
//    it holds the same pushes; several may be held (the lowest counts).
// Per trainer one slot: kEmpty, kReceiving (a writer owns it), kQueued,
// kApplying. A failed application makes the state terminal (kFailed), as in
// StepState: the backend's numbers are then unknown.
#ifndef SHARDOPT_SERVER_ASYNC_STATE_H_
#define SHARDOPT_SERVER_ASYNC_STATE_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardopt {

struct AsyncOptions {
  uint32_t num_trainers = 1;
  // Bounded staleness s >= 1; 0: asynchronous without a bound.
  int64_t staleness = 0;
};

// What BeginPush decided.
enum class AsyncAdmission {
  kAccepted,        // The trainer's slot is now receiving this push.
  kAlreadyApplied,  // Applied before: acknowledge, ignore the payload.
};

// The exactly-once record a checkpoint keeps.
struct AsyncProgress {
  std::vector<int64_t> applied;  // Per trainer: its last step applied here.
  int64_t version = 0;           // Pushes applied (the sum of `applied`).
};

class AsyncState {
 public:
  enum class Slot { kEmpty, kReceiving, kQueued, kApplying };

  explicit AsyncState(AsyncOptions options);

  // ---- A push's life.
  // INVALID_ARGUMENT for a rank out of range or a step < 1; ABORTED while
  // this trainer's push of the step is already open or waiting;
  // OUT_OF_RANGE for a step beyond the next one; FAILED_PRECONDITION once
  // failed.
  absl::StatusOr<AsyncAdmission> BeginPush(uint32_t rank, int64_t step);
  // The receiving push broke off or was refused: the slot is empty again.
  void AbortPush(uint32_t rank, int64_t step);
  // The committed push's call gave up before it was applied (its deadline,
  // a shutdown): out of the queue, the slot empty again; false when it is
  // not queued (being applied, or applied).
  bool WithdrawQueued(uint32_t rank, int64_t step);
  // The whole push arrived clean: queued behind the pushes committed before.
  absl::Status CommitPush(uint32_t rank, int64_t step);

  // ---- Applying, one push at a time.
  struct Claim {
    uint32_t rank = 0;
    int64_t step = 0;
    int64_t version = 0;    // The shard's version once it is applied.
    // How far `step` is ahead of the slowest other trainer's applied step
    // (0 when every trainer is level; at most the bound).
    int64_t staleness = 0;
  };
  // The first eligible queued push (now kApplying); nullopt while one is
  // being applied, or none is eligible.
  std::optional<Claim> ClaimApply();
  // ClaimApply would claim one now.
  bool CanClaim() const { return CanClaimCommittedBefore(commits_); }
  // The same among the pushes committed before the `commit`-th (see
  // commits()): a pull waits for those only, so that later commits cannot
  // keep it waiting.
  bool CanClaimCommittedBefore(uint64_t commit) const;
  // Pushes committed so far.
  uint64_t commits() const { return commits_; }
  bool applying() const { return applying_; }
  void FinishApply(const Claim& claim);
  // The backend failed while applying: terminal.
  void FailApply(const Claim& claim, absl::Status failure);

  // ---- Questions.
  // Pushes applied: the sum of `applied`.
  int64_t version() const;
  const std::vector<int64_t>& applied() const { return applied_; }
  // The highest step of `rank` committed here (queued or applied).
  int64_t pushed(uint32_t rank) const;
  Slot slot(uint32_t rank) const { return slots_[rank]; }
  bool IsApplied(uint32_t rank, int64_t step) const { return step <= applied_[rank]; }
  bool failed() const { return !failure_.ok(); }
  const absl::Status& failure() const { return failure_; }
  // Bounded staleness: the other trainers whose applied step is below
  // step - s, as (rank, applied step); empty when trainer `rank`'s step
  // `step` may go.
  std::vector<std::pair<uint32_t, int64_t>> Laggards(uint32_t rank, int64_t step) const;
  // What trainer `rank`'s step `step` waits for, in words (for errors and
  // wait reports); empty when it is not waiting.
  std::string DescribeWait(uint32_t rank, int64_t step) const;
  // The last pushes applied, oldest first (at most kRecentOrder): the order
  // this shard applied them in, for tests and Inspect.
  static constexpr size_t kRecentOrder = 4096;
  // The largest Claim::staleness applied so far (since the last restore).
  int64_t max_staleness() const { return max_staleness_; }
  // The staleness of `rank`'s last push applied (0 before any).
  int64_t last_staleness(uint32_t rank) const { return last_staleness_[rank]; }
  const std::deque<std::pair<uint32_t, int64_t>>& recent_order() const { return recent_order_; }

  // ---- Consistent cuts (checkpoints).
  // Holds of the uniform cut at step `step` (see the class comment). A hold
  // below a step some trainer already applied holds nothing back (the
  // caller checks with UniformCutReachable first).
  void AddHold(int64_t step) { holds_.insert(step); }
  void ReleaseHold(int64_t step);
  // No trainer's applied (or applying) step is past `step`.
  bool UniformCutReachable(int64_t step) const;
  // Every trainer's step `step` and no later one is applied, none applying.
  bool UniformCutReached(int64_t step) const;
  // The lowest step every trainer has applied.
  int64_t slowest_applied() const;

  // ---- Checkpoints.
  AsyncProgress Progress() const { return {applied_, version()}; }
  // INVALID_ARGUMENT for a record of another trainer count or whose
  // version is not the sum of its steps; FAILED_PRECONDITION while a push is
  // open, queued or applying.
  absl::Status CheckRestore(const AsyncProgress& progress) const;
  void Restore(const AsyncProgress& progress);

 private:
  bool Eligible(uint32_t rank, int64_t step) const;

  const AsyncOptions options_;
  std::vector<int64_t> applied_;
  std::vector<Slot> slots_;
  // Committed, not yet applied, in commit order.
  struct Queued {
    uint32_t rank;
    int64_t step;
    uint64_t seq;  // Its place among all commits.
  };
  std::deque<Queued> queue_;
  uint64_t commits_ = 0;
  bool applying_ = false;
  std::multiset<int64_t> holds_;
  std::deque<std::pair<uint32_t, int64_t>> recent_order_;
  int64_t max_staleness_ = 0;
  std::vector<int64_t> last_staleness_;
  absl::Status failure_;
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_ASYNC_STATE_H_
