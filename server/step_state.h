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
//   kUpdating --FinishStep--> kCollecting (version v + 1, slots empty)
//   any phase --Fail--> kFailed (terminal: the backend's state is unknown)
//
// Per trainer there is one push slot for step v + 1: kEmpty, kReceiving (a
// PushWriter owns it) or kComplete. A step's arithmetic never depends on
// arrival order: the reduction runs only once every slot is complete.
// (Progress is per whole range today; a slot is where per-range progress of
// a pipelined step would be kept.)
//
// Checkpoint holds: while a hold on version v exists, step v + 1 does not
// start, so every shard asked for step v saves exactly that boundary.
#ifndef SHARDOPT_SERVER_STEP_STATE_H_
#define SHARDOPT_SERVER_STEP_STATE_H_

#include <cstdint>
#include <map>
#include <optional>
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
  double last_lr = 0;                              // Of the last applied step.
  double version_lr = 0;                           // Of step `version`, applied or skipped.
  StepRecord last_step;                            // With gradient control.
  std::string run_id;                              // The training run.
  StepStats last_stats;  // This shard's part of the last decided step's statistics.
  std::optional<LossScaler::State> loss_scaler;  // The replica, if any.
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
  bool needs_decision = false;  // Clipping or loss scaling.
  Hyperparameters initial;
  std::string run_id;
  std::optional<LossScalerOptions> loss_scaler;  // The trainers' scaler, replicated.
};

class StepState {
 public:
  enum class Phase { kCollecting, kReducing, kAwaitingDecision, kUpdating, kFailed };
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
  // once every push is in (the step is as good as started).
  absl::Status DiscardPending();
  // The rank's whole gradient arrived clean (found_inf: with loss scaling, it
  // held inf/NaN). Returns the ranks still pending; 0 means the step can
  // start. FAILED_PRECONDITION (slot freed) for a loss scale another
  // trainer's push of the step contradicts.
  absl::StatusOr<uint32_t> CommitPush(uint32_t rank, int64_t step, bool found_inf,
                                      double loss_scale, absl::Time now);

  // ---- Running a step.
  // True when step version + 1 has every push and no hold keeps it back.
  bool ReadyToStart() const;
  struct StartedStep {
    int64_t step = 0;
    bool reduce_first = false;  // Gradient control: Reduce, then a decision.
    OptimizerConfig config;     // Without gradient control: what to apply.
    double loss_scale = 1;
  };
  // From kCollecting with every push in (normally once ReadyToStart(); a
  // shard shutting down no longer honours holds): kReducing or kUpdating.
  StartedStep StartStep();
  // kReducing -> kAwaitingDecision with this shard's sum of squares.
  void FinishReduce(double sum_of_squares);

  struct Update {
    bool skip = false;
    OptimizerConfig config;      // With this step's lr.
    int64_t optimizer_step = 0;  // The optimizer's own step count (skips excluded).
    float multiplier = 1;        // Unscale and clip in one.
    double loss_scale = 1;       // The step's gradients carried it.
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
  absl::StatusOr<std::optional<Update>> BeginDecision(int64_t step, const StepDecision& decision);

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

  // ---- Questions waiters ask.
  int64_t version() const { return version_; }
  Phase phase() const { return phase_; }
  const absl::Status& failure() const { return failure_; }
  bool failed() const { return phase_ == Phase::kFailed; }
  // Parameters are being changed (a checkpoint of the version cannot be taken).
  bool updating() const { return phase_ == Phase::kUpdating; }
  // A step is being reduced or applied (work runs outside the lock).
  bool running() const { return phase_ == Phase::kReducing || phase_ == Phase::kUpdating; }
  // With gradient control: this shard's statistics of `step` once known
  // (the awaited step, or the last decided one); nullopt while they may
  // still come. FAILED_PRECONDITION for an older step.
  std::optional<absl::StatusOr<StepStats>> StatsOf(int64_t step) const;
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
  void AdoptChanges(const std::vector<CarriedChange>& changes);
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
           phase_ == Phase::kUpdating;
  }
  void ClearStep();

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
  std::map<int64_t, int> holds_;
  bool pushed_ = false;  // Some push has begun.
  std::string run_id_;
  std::optional<LossScaler> loss_scaler_;
  std::vector<TrainerActivity> activity_;
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_STEP_STATE_H_
