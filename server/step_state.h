// StepState: one shard's synchronous step protocol as an explicit state
// machine. Pure transitions: no locks, no I/O, no clock (callers pass the
// time); ModelShard drives it under its lock and does the work each
// transition hands out (reducing, updating, reading) with the lock released.
//
// The shard is at `version` v and collects step v + 1. Phases of that step:
//
//   kCollecting --last push committed, no checkpoint hold on v--> StartStep
//     without gradient control:           --> kUpdating
//     with gradient control:              --> kReducing --FinishReduce--> kAwaitingDecision
//                                              --BeginDecision--> kUpdating
//     with trust norms (LAMB on the flat partition) and no skip, the
//     decision comes in two halves (see common/step_protocol.h):
//       kAwaitingDecision --BeginDecision(clip half)--> kMeasuring
//         --kMeasure work done--> kAwaitingNorms --BeginNorms--> kUpdating
//   kUpdating --FinishStep--> kCollecting (version v + 1, slots empty)
//   any phase --Fail--> kFailed (terminal: the backend's state is unknown)
//
// Per trainer there is one push slot for step v + 1: kEmpty, kReceiving (a
// PushWriter owns it) or kComplete. A step's arithmetic never depends on
// arrival order.
//
// Ranges (pipelined steps): the shard's slice is cut into ranges of
// `range_elements`; each trainer's push delivers its elements in order, and
// `delivered` (per trainer) says how far. Work on a range is claimed
// (ClaimRange) by whichever thread needs progress, one claim at a time and
// ranges in ascending order, so every element is reduced and updated exactly
// as in a whole step (the arithmetic per element, and the fixed blocks of the
// norm, do not change). Pipelined, a range is claimable once every trainer
// delivered it; otherwise only once every push is committed. Stages:
//   without gradient control: kApply per range (the step starts at the first
//     claim); the step ends when every range is applied and every push is
//     committed;
//   with it: kReduce per range (reduction and this shard's blocks of the
//     norm), FinishReduce once every range is reduced and every push
//     committed; after the decision, kUpdate per range, then the step ends.
// A range's parameters are at version v + 1 once its update finished
// (RangeVersion), which lets pulls stream a version range by range.
// Elements of a range already claimed were consumed: a trainer whose push
// broke off after that keeps them (Delivered) and its next push of the step
// resends only the rest, so nothing is applied twice.
//
// Checkpoint holds: while a hold on version v exists, step v + 1 does not
// start, so every shard asked for step v saves exactly that boundary.
#ifndef SHARDOPT_SERVER_STEP_STATE_H_
#define SHARDOPT_SERVER_STEP_STATE_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/loss_scaler.h"
#include "common/optimizer_config.h"
#include "common/step_protocol.h"
#include "server/hyperparameter_schedule.h"

namespace shardopt {

// What happened at a step, for inspection.
struct StepRecord {
  int64_t step = 0;
  StepDecision decision;
  double loss_scale = 1;
  double lr = 0;
};

// The step protocol's state besides the numbers: what a checkpoint keeps so
// that a restored shard continues exactly where the saved one was.
struct ShardProgress {
  int64_t version = 0;
  int64_t optimizer_steps = 0;  // Updates applied (skips excluded).
  int64_t skipped_steps = 0;
  Hyperparameters current;                         // In force for step version + 1.
  std::map<int64_t, Hyperparameters> scheduled;    // Changes still to come.
  std::map<int64_t, Hyperparameters> took_effect;  // Changes in force, for repeats.
  // (Asynchronous modes: last_lr is the newest trainer step's, which every
  // shard has at a cut, see ModelShard::RunOneAsyncApply.)
  double last_lr = 0;     // Of the last applied step.
  double version_lr = 0;  // Of step `version`, applied or skipped.
  StepRecord last_step;   // With gradient control.
  std::string run_id;     // The training run.
  StepStats last_stats;   // This shard's part of the last decided step's statistics.
  std::optional<LossScaler::State> loss_scaler;  // The replica, if any.
  // Asynchronous modes (not StepState's): each trainer's last applied step;
  // `version` is their sum.
  std::vector<int64_t> trainer_steps;
};

// What one trainer has done, as this shard saw it.
struct TrainerActivity {
  int64_t last_pushed_step = 0;  // Highest step whose push this shard committed.
  std::optional<absl::Time> last_push_time;  // Unknown after a restore.
};

struct StepStateOptions {
  std::string model_id;
  uint32_t shard_index = 0;
  uint32_t num_trainers = 1;
  bool needs_decision = false;  // Clipping or loss scaling, or trust norms.
  // LAMB on the flat partition over several shards: decisions come in two
  // halves, the second with the norms of all `trust_tensor_count` tensors.
  // (Implies needs_decision; the step runs as one range.)
  bool needs_trust_norms = false;
  size_t trust_tensor_count = 0;
  Hyperparameters initial;
  std::string run_id;
  std::optional<LossScalerOptions> loss_scaler;  // The trainers' scaler, replicated.
  // Ranges (see the header comment): the slice's size, the elements per
  // range (0: one range), and whether ranges are claimed as they arrive.
  uint64_t size = 0;
  uint64_t range_elements = 0;
  bool pipelined = false;
};

// The ranges [first, last) of `range_elements` elements each (the last may
// be short; `range_count` in all) that elements [offset, offset + count)
// touch; an empty piece touches none.
inline std::pair<size_t, size_t> RangesCovering(uint64_t offset, uint64_t count,
                                                uint64_t range_elements, size_t range_count) {
  const size_t first = std::min<uint64_t>(offset / range_elements, range_count - 1);
  if (count == 0) return {first, first};
  return {first, std::min<uint64_t>((offset + count - 1) / range_elements + 1, range_count)};
}

class StepState {
 public:
  enum class Phase {
    kCollecting,
    kReducing,
    kAwaitingDecision,
    kMeasuring,      // Trust norms: this shard's partials under the clip half.
    kAwaitingNorms,  // Trust norms: partials known, the norms not yet.
    kUpdating,
    kFailed
  };
  enum class Slot { kEmpty, kReceiving, kComplete };

  explicit StepState(StepStateOptions options);

  // ---- Pushes.
  enum class Admission { kStart, kDuplicate, kAlreadyApplied };
  // Admits `rank`'s push of `step` (arguments validated by the caller):
  // kAlreadyApplied for an applied step, kDuplicate for a push this rank
  // already completed, kStart (the slot becomes kReceiving) for the next
  // step. OUT_OF_RANGE for a step ahead of the shard, ABORTED while the
  // rank's push of the step is in progress, FAILED_PRECONDITION for a loss
  // scale that is not the replica's or another trainer's of the step; the
  // failure after Fail().
  absl::StatusOr<Admission> BeginPush(uint32_t rank, int64_t step, double loss_scale);
  // A push that ended before committing: its slot is free again.
  void AbortPush(uint32_t rank, int64_t step);
  // Drops every push of step version + 1 (a rollback to this version gives
  // up the steps they belong to). ABORTED while one is still streaming, or
  // once every push is in (the step is as good as started);
  // FAILED_PRECONDITION (DescribePartlyRun) when PartlyRun().
  absl::Status DiscardPending();
  // A pipelined step ran ranges with what a push that broke off delivered,
  // and no push of it streams now: version `version` no longer exists whole
  // and the step waits for those trainers to push again.
  bool PartlyRun() const;
  std::string DescribePartlyRun() const;
  // The rank's whole gradient arrived clean (found_inf: with loss scaling, it
  // held inf/NaN). Returns the ranks still pending; 0 means the step can
  // start. FAILED_PRECONDITION (slot freed) for a loss scale another
  // trainer's push of the step contradicts.
  absl::StatusOr<uint32_t> CommitPush(uint32_t rank, int64_t step, bool found_inf,
                                      double loss_scale, absl::Time now);

  // ---- Running a step.
  struct StartedStep {
    int64_t step = 0;
    bool reduce_first = false;  // Gradient control: Reduce, then a decision.
    OptimizerConfig config;     // Without gradient control: what to apply.
    double loss_scale = 1;
  };
  // From kCollecting with every push in, or (pipelined) the first range
  // (ClaimRange calls it): kReducing or kUpdating.
  StartedStep StartStep();
  // kReducing -> kAwaitingDecision with this shard's sum of squares.
  void FinishReduce(double sum_of_squares);

  struct Update {
    bool skip = false;
    OptimizerConfig config;      // With this step's lr.
    int64_t optimizer_step = 0;  // The optimizer's own step count (skips excluded).
    float multiplier = 1;        // Unscale and clip in one.
    double loss_scale = 1;       // The step's gradients carried it.
    bool measure = false;        // Trust norms: kMeasuring, not kUpdating.
    std::vector<TensorNorms> tensor_norms;  // Trust norms: BeginNorms's.
  };
  // True when a decision may be taken now: no step is being reduced or
  // applied, and no hold keeps the next step back (holds stop holding once
  // the shard shuts down).
  bool DecisionMayProceed(bool shutting_down) const;
  // With gradient control, once DecisionMayProceed(): nullopt for an
  // identical repeat of the last decision (nothing to do); the update to run
  // (phase kUpdating) for the first decision of the step awaiting one.
  // FAILED_PRECONDITION for a different repeat, a step that is not awaiting
  // a decision, or a non-skip when a gradient had inf/NaN. `decision` passed
  // CheckDecision.
  // With trust norms a non-skip decision's clip half moves to kMeasuring
  // instead (Update.measure; its tensor norms are not looked at), and a
  // repeat of that half compares SameClip while the norms are pending.
  absl::StatusOr<std::optional<Update>> BeginDecision(int64_t step, const StepDecision& decision);
  // Trust norms, once DecisionMayProceed(): from kAwaitingNorms, the update
  // with `decision`'s norms (phase kUpdating); nullopt for an identical
  // repeat of the step's full decision. INVALID_ARGUMENT (state untouched)
  // when CheckTensorNorms refuses the norms against this shard's partials;
  // FAILED_PRECONDITION for another clip half, or a step not awaiting norms.
  absl::StatusOr<std::optional<Update>> BeginNorms(int64_t step, const StepDecision& decision);

  // Every way a step ends: applied without a decision, applied or skipped by
  // one. From kUpdating: version becomes the step, the slots empty.
  struct Ending {
    double lr = 0;                        // The step's lr (applied or skipped).
    std::optional<StepDecision> decision;  // With gradient control.
    double loss_scale = 1;
  };
  void FinishStep(const Ending& ending);
  // The backend failed at `step`: the shard refuses all later work with the
  // returned INTERNAL status.
  absl::Status Fail(int64_t step, const absl::Status& cause);

  // ---- Ranges (see the header comment).
  struct RangeWork {
    enum class Kind { kApply, kReduce, kUpdate, kMeasure };
    Kind kind = Kind::kApply;
    int64_t step = 0;
    size_t index = 0;
    uint64_t begin = 0, end = 0;  // Range-local elements.
    OptimizerConfig config;       // kApply and kUpdate: with the step's lr.
    double loss_scale = 1;        // kReduce: the norm is of g / loss_scale.
    bool skip = false;            // kUpdate: nothing changes.
    // The optimizer's step count (skipped steps left out; Adam's bias
    // correction): kApply, kUpdate and kMeasure.
    int64_t optimizer_step = 0;
    float multiplier = 1;         // kUpdate and kMeasure.
    std::vector<TensorNorms> tensor_norms;  // kUpdate with trust norms.
  };
  // `rank`'s push of `step` (in progress) has delivered its first
  // `delivered` elements clean; `first_inf`: the first inf/NaN among them
  // (with loss scaling), if any.
  void RecordDelivered(uint32_t rank, int64_t step, uint64_t delivered,
                       std::optional<uint64_t> first_inf);
  // The leading elements of every trainer's push of step version + 1 that
  // claimed ranges consumed: a new push of that step skips them.
  uint64_t Consumed() const { return ConsumedElements(); }
  // Ranges of step version + 1 every trainer delivered (with pipelining;
  // else all of them once every push is committed), counted from the first.
  size_t RangesArrived() const;
  // True when ClaimRange would hand out work.
  bool CanClaim(bool shutting_down) const;
  // The next range's work, or nullopt. The first claim of a step starts it
  // (StartStep). Holds keep stage-one work back unless `shutting_down`.
  std::optional<RangeWork> ClaimRange(bool shutting_down);
  // The claimed work is done; `block_sums`: a kReduce range's sums of
  // squares, one per norm block in order; `trust_partials`: kMeasure's.
  void FinishRange(const RangeWork& work, std::vector<double> block_sums = {},
                   std::vector<TrustPartial> trust_partials = {});
  // Ends the stage whose work and pushes are all done: kApplied (version
  // moved on), kReduced (now kAwaitingDecision), kMeasured (now
  // kAwaitingNorms), or kNone.
  enum class Completion { kNone, kApplied, kReduced, kMeasured };
  Completion CompleteStepIfDone();
  // The version range `index`'s parameters are at.
  int64_t RangeVersion(size_t index) const;
  size_t range_count() const { return range_count_; }
  uint64_t range_elements() const { return range_elements_; }
  // The ranges [first, last) that elements [offset, offset + count) touch.
  std::pair<size_t, size_t> RangesCovering(uint64_t offset, uint64_t count) const {
    return shardopt::RangesCovering(offset, count, range_elements_, range_count_);
  }
  // The lr of the step that makes `version`, when known (the current
  // version, or the next once it is being applied).
  std::optional<double> LrOf(int64_t version) const;

  // ---- Questions waiters ask.
  int64_t version() const { return version_; }
  Phase phase() const { return phase_; }
  const absl::Status& failure() const { return failure_; }
  bool failed() const { return phase_ == Phase::kFailed; }
  // Parameters are being changed (a checkpoint of the version cannot be taken).
  bool updating() const { return phase_ == Phase::kUpdating; }
  // A step is being reduced, measured or applied (work runs outside the lock).
  bool running() const {
    return phase_ == Phase::kReducing || phase_ == Phase::kMeasuring || phase_ == Phase::kUpdating;
  }
  // With gradient control: this shard's statistics of `step` once known
  // (the awaited step, or the last decided one); nullopt while they may
  // still come. FAILED_PRECONDITION for an older step.
  std::optional<absl::StatusOr<StepStats>> StatsOf(int64_t step) const;
  // Trust norms: the same with this shard's trust partials of `step` under
  // its clip half, once measured; FAILED_PRECONDITION for an older step or
  // one that was skipped.
  std::optional<absl::StatusOr<StepStats>> TrustStatsOf(int64_t step) const;
  // StatsOf(step).has_value() and TrustStatsOf's, without copying the
  // statistics (wait conditions ask them over and over).
  bool StatsKnown(int64_t step) const;
  bool TrustStatsKnown(int64_t step) const;
  // OK when the shard applied `step` or holds `rank`'s complete push of it;
  // OUT_OF_RANGE otherwise (it lost the push: restarted).
  absl::Status CheckHoldsPush(uint32_t rank, int64_t step) const;
  // What the shard waits for to reach `min_version`, for a status message:
  // "waiting for trainer 1 (last pushed step 11) to push step 12".
  std::string DescribeWait(int64_t min_version) const;

  // ---- Checkpoint holds (counted; see the header comment).
  void AddHold(int64_t step) { ++holds_[step]; }
  void ReleaseHold(int64_t step);
  bool HeldAt(int64_t version) const { return holds_.count(version) > 0; }

  // ---- Hyperparameters (see HyperparameterSchedule); `next` validated.
  absl::Status ScheduleChange(int64_t effective_step, const Hyperparameters& next);
  absl::Status CancelChange(int64_t effective_step);
  // The changes a push carries (see HyperparameterSchedule::Adopt).
  struct CarriedChange {
    int64_t effective_step = 0;
    Hyperparameters next;
  };
  // RESOURCE_EXHAUSTED when adopting `changes` would schedule more than
  // kMaxPendingHyperparameterChanges (nothing is adopted then).
  absl::Status CheckCanAdopt(const std::vector<CarriedChange>& changes) const;
  // Adopted for `pushing_rank`'s push of the step collected, which just
  // began. What it scheduled is taken back when that push is aborted before
  // the step started and no other push carried it, nor a SetHyperparameters
  // asked for it: a refused push schedules nothing. Without a rank (a push
  // answered at once, accepted), what it carried stays.
  void AdoptChanges(std::optional<uint32_t> pushing_rank,
                    const std::vector<CarriedChange>& changes);
  const HyperparameterSchedule& schedule() const { return schedule_; }

  // ---- Saving and restoring.
  ShardProgress Progress() const;
  // Before the first push: FAILED_PRECONDITION after one; INVALID_ARGUMENT
  // for inconsistent counts. Restore() only after CheckRestore() passed.
  absl::Status CheckRestore(const ShardProgress& progress) const;
  void Restore(const ShardProgress& progress);

  // ---- Inspection.
  std::vector<uint32_t> TrainersPushed() const;  // Complete for step version + 1.
  const std::vector<TrainerActivity>& trainers() const { return activity_; }
  const StepRecord& last_step() const { return last_step_; }
  double last_lr() const { return last_lr_; }
  double version_lr() const { return version_lr_; }
  int64_t optimizer_steps() const { return optimizer_steps_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  const std::string& run_id() const { return run_id_; }
  std::optional<LossScaler::State> loss_scaler_state() const;
  uint32_t Pending() const;

 private:
  bool StepStarted() const {
    return phase_ == Phase::kReducing || phase_ == Phase::kAwaitingDecision ||
           phase_ == Phase::kMeasuring || phase_ == Phase::kAwaitingNorms ||
           phase_ == Phase::kUpdating;
  }
  // Between a trust step's two halves (the clip half taken, not yet applying).
  bool BetweenHalves() const {
    return phase_ == Phase::kMeasuring || phase_ == Phase::kAwaitingNorms;
  }
  // Whether `decision` repeats `taken`: a clip half (trust norms, no skip,
  // no norms) matches on SameClip, anything else on ==.
  bool Repeats(const StepDecision& taken, const StepDecision& decision) const;
  void ClearStep();
  // A push of `rank` refused after its admission: what only it scheduled
  // (AdoptChanges) is taken back while nothing of the step has run.
  void WithdrawChangesOf(uint32_t rank);
  // Stage one of a started step: ranges applied (no gradient control) or
  // reduced, from pushes that may still be streaming.
  bool InStageOne() const {
    return phase_ == Phase::kReducing || (phase_ == Phase::kUpdating && !decided_);
  }
  uint64_t RangeEnd(size_t index) const;
  // Elements of every trainer's push consumed by claimed stage-one ranges.
  uint64_t ConsumedElements() const;

  const StepStateOptions options_;
  int64_t version_ = 0;
  Phase phase_ = Phase::kCollecting;
  absl::Status failure_;
  std::vector<Slot> slots_;
  // Of the step collected: the loss scale its pushes carry, any inf/NaN,
  // and (once reduced) this shard's sum of squares.
  std::optional<double> pending_loss_scale_;
  StepStats pending_stats_;
  StepRecord last_step_;
  StepStats last_stats_;
  int64_t optimizer_steps_ = 0;
  int64_t skipped_steps_ = 0;
  double last_lr_ = 0;
  double version_lr_ = 0;
  HyperparameterSchedule schedule_;
  // Changes pushes of the step collected scheduled (AdoptChanges), by
  // effective step: the ranks whose pushes carried them. Cleared with the
  // step; an entry goes when SetHyperparameters asks for it too.
  std::map<int64_t, std::set<uint32_t>> adopted_by_;
  std::map<int64_t, int> holds_;
  bool pushed_ = false;  // Some push has begun.
  std::string run_id_;
  std::optional<LossScaler> loss_scaler_;
  std::vector<TrainerActivity> activity_;

  // Ranges of the step collected (see the header comment).
  uint64_t range_elements_ = 1;
  size_t range_count_ = 1;
  std::vector<uint64_t> delivered_;                 // Per trainer.
  std::vector<std::optional<uint64_t>> first_inf_;  // Per trainer.
  size_t claimed_ = 0;                              // Ranges handed out in the current stage.
  size_t finished_ = 0;                             // Ranges done in the current stage.
  OptimizerConfig step_config_;                     // Stage one without gradient control.
  std::optional<StepDecision> decided_;             // Stage two: the decision applied
                                                    // (between halves: the clip half).
  Update decided_update_;
  std::vector<std::vector<double>> block_sums_;  // Per range, with gradient control.
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_STEP_STATE_H_
