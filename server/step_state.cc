#include "server/step_state.h"

#include <algorithm>
#include <cassert>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardopt {

StepState::StepState(StepStateOptions options)
    : options_(std::move(options)),
      slots_(options_.num_trainers, Slot::kEmpty),
      schedule_(options_.initial),
      run_id_(options_.run_id),
      loss_scaler_(options_.loss_scaler ? std::optional<LossScaler>(*options_.loss_scaler)
                                        : std::nullopt),
      activity_(options_.num_trainers) {}

uint32_t StepState::Pending() const {
  return static_cast<uint32_t>(
      std::count_if(slots_.begin(), slots_.end(), [](Slot s) { return s != Slot::kComplete; }));
}

absl::StatusOr<StepState::Admission> StepState::BeginPush(uint32_t rank, int64_t step,
                                                          double loss_scale) {
  assert(rank < slots_.size());
  if (failed()) return failure_;
  switch (PositionOfStep(version_, step)) {
    case StepPosition::kApplied:
      return Admission::kAlreadyApplied;
    case StepPosition::kAhead:
      // OUT_OF_RANGE: the trainer can fix it by pushing the missing steps (a
      // shard restarted from a checkpoint is behind its trainers).
      return absl::OutOfRangeError(absl::StrCat("step ", step,
                                                " is ahead of the shard: it is at version ",
                                                version_, " and waits for step ", version_ + 1));
    case StepPosition::kNext:
      break;
  }
  switch (slots_[rank]) {
    case Slot::kComplete:
      return Admission::kDuplicate;
    case Slot::kReceiving:
      return absl::AbortedError(absl::StrCat("a push from trainer ", rank, " for step ", step,
                                             " is already in progress; retry"));
    case Slot::kEmpty:
      break;
  }
  if (loss_scaler_ && loss_scale != loss_scaler_->scale()) {
    // The replica says what every trainer's scaler holds now: a trainer
    // that disagrees restarted or diverged.
    return absl::FailedPreconditionError(
        absl::StrCat("trainer ", rank, " pushes step ", step, " with loss scale ", loss_scale,
                     " but the model's loss scaler is at ", loss_scaler_->scale(),
                     " (re-attach to take the scaler's state)"));
  }
  if (pending_loss_scale_ && loss_scale != *pending_loss_scale_) {
    // Refused before any byte is streamed (CommitPush checks again).
    return absl::FailedPreconditionError(
        absl::StrCat("trainer ", rank, " pushes step ", step, " with loss scale ", loss_scale,
                     " but another trainer's push of it used ", *pending_loss_scale_,
                     "; all trainers must run identical scalers"));
  }
  slots_[rank] = Slot::kReceiving;
  pushed_ = true;
  return Admission::kStart;
}

void StepState::AbortPush(uint32_t rank, int64_t step) {
  if (version_ + 1 == step && slots_[rank] == Slot::kReceiving) slots_[rank] = Slot::kEmpty;
}

absl::Status StepState::DiscardPending() {
  if (failed()) return failure_;
  // Every push in (Pending() == 0) is a step already under way: the thread
  // that committed the last one waits to start it.
  if (phase_ != Phase::kCollecting || Pending() == 0 ||
      std::count(slots_.begin(), slots_.end(), Slot::kReceiving) > 0) {
    return absl::AbortedError(absl::StrCat("shard ", options_.shard_index,
                                           " is taking or applying step ", version_ + 1,
                                           ": look again"));
  }
  ClearStep();
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> StepState::CommitPush(uint32_t rank, int64_t step, bool found_inf,
                                               double loss_scale, absl::Time now) {
  assert(step == version_ + 1 && slots_[rank] == Slot::kReceiving);
  if (pending_loss_scale_ && loss_scale != *pending_loss_scale_) {
    slots_[rank] = Slot::kEmpty;
    return absl::FailedPreconditionError(
        absl::StrCat("trainer ", rank, " pushed step ", step, " with loss scale ", loss_scale,
                     " but another trainer used ", *pending_loss_scale_));
  }
  pending_loss_scale_ = loss_scale;
  pending_stats_.loss_scale = loss_scale;
  pending_stats_.found_inf = pending_stats_.found_inf || found_inf;
  slots_[rank] = Slot::kComplete;
  TrainerActivity& activity = activity_[rank];
  activity.last_pushed_step = std::max(activity.last_pushed_step, step);
  activity.last_push_time = now;
  return Pending();
}

bool StepState::ReadyToStart() const {
  return phase_ == Phase::kCollecting && Pending() == 0 && !HeldAt(version_);
}

StepState::StartedStep StepState::StartStep() {
  assert(phase_ == Phase::kCollecting && Pending() == 0);
  StartedStep started;
  started.step = version_ + 1;
  started.reduce_first = options_.needs_decision;
  started.loss_scale = pending_stats_.loss_scale;
  if (options_.needs_decision) {
    phase_ = Phase::kReducing;
  } else {
    phase_ = Phase::kUpdating;
    started.config = schedule_.TakeEffect(started.step);
  }
  return started;
}

void StepState::FinishReduce(double sum_of_squares) {
  assert(phase_ == Phase::kReducing);
  pending_stats_.step = version_ + 1;
  pending_stats_.sum_of_squares = sum_of_squares;
  phase_ = Phase::kAwaitingDecision;
}

bool StepState::DecisionMayProceed(bool shutting_down) const {
  return failed() || (!running() && (!HeldAt(version_) || shutting_down));
}

absl::StatusOr<std::optional<StepState::Update>> StepState::BeginDecision(
    int64_t step, const StepDecision& decision) {
  if (failed()) return failure_;
  if (step <= version_) {
    if (step == last_step_.step && last_step_.decision == decision) {
      return std::optional<Update>();
    }
    return absl::FailedPreconditionError(
        absl::StrCat("step ", step, " was already decided differently (or long ago)"));
  }
  const bool awaiting = phase_ == Phase::kAwaitingDecision;
  if (step != version_ + 1 || !awaiting) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", step, " cannot be decided: the shard is at version ", version_,
                     awaiting ? "" : " and not every trainer's gradient is in"));
  }
  if (pending_stats_.found_inf && !decision.skip) {
    return absl::FailedPreconditionError(absl::StrCat("step ", step,
                                                      " must be skipped: a gradient on shard ",
                                                      options_.shard_index, " had inf or NaN"));
  }
  phase_ = Phase::kUpdating;
  Update update;
  update.skip = decision.skip;
  update.config = schedule_.TakeEffect(step);
  update.optimizer_step = optimizer_steps_ + 1;
  update.multiplier = GradientMultiplier(decision, pending_stats_.loss_scale);
  update.loss_scale = pending_stats_.loss_scale;
  return std::optional<Update>(update);
}

void StepState::FinishStep(const Ending& ending) {
  assert(phase_ == Phase::kUpdating);
  const int64_t step = version_ + 1;
  version_ = step;
  version_lr_ = ending.lr;
  const bool skipped = ending.decision && ending.decision->skip;
  if (skipped) {
    ++skipped_steps_;
  } else {
    ++optimizer_steps_;
    last_lr_ = ending.lr;
  }
  if (ending.decision) {
    last_step_ = StepRecord{step, *ending.decision, ending.loss_scale, ending.lr};
    last_stats_ = pending_stats_;
    if (loss_scaler_) loss_scaler_->Update(skipped);
  }
  ClearStep();
  phase_ = Phase::kCollecting;
}

void StepState::ClearStep() {
  std::fill(slots_.begin(), slots_.end(), Slot::kEmpty);
  pending_loss_scale_.reset();
  pending_stats_ = StepStats();
}

absl::Status StepState::Fail(int64_t step, const absl::Status& cause) {
  failure_ = absl::InternalError(absl::StrCat("shard ", options_.shard_index, " of model '",
                                              options_.model_id, "' failed at step ", step,
                                              " and stopped: ", cause.message()));
  phase_ = Phase::kFailed;
  return failure_;
}

std::optional<absl::StatusOr<StepStats>> StepState::StatsOf(int64_t step) const {
  if (failed()) return absl::StatusOr<StepStats>(failure_);
  if (phase_ == Phase::kAwaitingDecision && pending_stats_.step == step) {
    return absl::StatusOr<StepStats>(pending_stats_);
  }
  if (version_ >= step) {
    if (last_stats_.step == step) return absl::StatusOr<StepStats>(last_stats_);
    return absl::StatusOr<StepStats>(absl::FailedPreconditionError(
        absl::StrCat("step ", step, " was decided before the last one (", last_stats_.step, ")")));
  }
  if (step > version_ + 1) {
    return absl::StatusOr<StepStats>(absl::FailedPreconditionError(
        absl::StrCat("step ", step, " is ahead of the shard (version ", version_, ")")));
  }
  return std::nullopt;
}

absl::Status StepState::CheckHoldsPush(uint32_t rank, int64_t step) const {
  assert(rank < slots_.size());
  if (step <= version_ || (step == version_ + 1 && slots_[rank] == Slot::kComplete)) {
    return absl::OkStatus();
  }
  return absl::OutOfRangeError(
      absl::StrCat("shard ", options_.shard_index, " does not hold trainer ", rank,
                   "'s push of step ", step, ": it is at version ", version_,
                   " (restarted from a checkpoint?); push the steps after it again"));
}

std::string StepState::DescribeWait(int64_t min_version) const {
  if (failed()) return failure_.ToString();
  if (version_ >= min_version) return absl::StrCat("at version ", version_);
  const int64_t next = version_ + 1;
  std::string where = absl::StrCat("shard ", options_.shard_index, " is at version ", version_);
  if (min_version > next) {
    absl::StrAppend(&where, " (version ", min_version, " needs steps ", next, "..", min_version,
                    ")");
  }
  std::vector<std::string> waiting;
  for (uint32_t r = 0; r < slots_.size(); ++r) {
    if (slots_[r] == Slot::kComplete) continue;
    std::string who = absl::StrCat("trainer ", r, " (last pushed step ",
                                   activity_[r].last_pushed_step);
    if (slots_[r] == Slot::kReceiving) absl::StrAppend(&who, ", its push of step ", next,
                                                       " is in progress");
    absl::StrAppend(&who, ")");
    waiting.push_back(std::move(who));
  }
  if (!waiting.empty()) {
    return absl::StrCat(where, ", waiting for ", absl::StrJoin(waiting, ", "), " to push step ",
                        next);
  }
  switch (phase_) {
    case Phase::kAwaitingDecision:
      return absl::StrCat(where, ", waiting for a trainer to send the decision of step ", next,
                          " (every gradient is in)");
    case Phase::kReducing:
    case Phase::kUpdating:
      return absl::StrCat(where, ", applying step ", next);
    default:
      break;
  }
  if (HeldAt(version_)) {
    return absl::StrCat(where, ", waiting for the checkpoint of step ", version_,
                        " to be written before applying step ", next);
  }
  return absl::StrCat(where, ", about to apply step ", next);
}

void StepState::ReleaseHold(int64_t step) {
  auto it = holds_.find(step);
  if (it != holds_.end() && --it->second == 0) holds_.erase(it);
}

absl::Status StepState::ScheduleChange(int64_t effective_step, const Hyperparameters& next) {
  if (failed()) return failure_;
  return schedule_.Schedule(effective_step, next, version_, StepStarted());
}

absl::Status StepState::CancelChange(int64_t effective_step) {
  return schedule_.Cancel(effective_step, version_, StepStarted());
}

void StepState::AdoptChanges(const std::vector<CarriedChange>& changes) {
  for (const CarriedChange& c : changes) {
    schedule_.Adopt(c.effective_step, c.next, version_, StepStarted());
  }
}

ShardProgress StepState::Progress() const {
  ShardProgress progress;
  progress.version = version_;
  progress.optimizer_steps = optimizer_steps_;
  progress.skipped_steps = skipped_steps_;
  progress.current = schedule_.current();
  progress.scheduled = schedule_.scheduled();
  progress.took_effect = schedule_.took_effect();
  progress.last_lr = last_lr_;
  progress.version_lr = version_lr_;
  progress.last_step = last_step_;
  progress.run_id = run_id_;
  progress.last_stats = last_stats_;
  progress.loss_scaler = loss_scaler_state();
  return progress;
}

absl::Status StepState::CheckRestore(const ShardProgress& progress) const {
  if (pushed_ || version_ != 0) {
    return absl::FailedPreconditionError("a shard that has taken pushes cannot be restored");
  }
  if (progress.version < 0 || progress.optimizer_steps < 0 || progress.skipped_steps < 0 ||
      progress.optimizer_steps + progress.skipped_steps > progress.version) {
    return absl::InvalidArgumentError(absl::StrCat(
        "inconsistent progress: version ", progress.version, ", ", progress.optimizer_steps,
        " updates and ", progress.skipped_steps, " skipped steps"));
  }
  return absl::OkStatus();
}

void StepState::Restore(const ShardProgress& progress) {
  assert(CheckRestore(progress).ok());
  version_ = progress.version;
  optimizer_steps_ = progress.optimizer_steps;
  skipped_steps_ = progress.skipped_steps;
  schedule_.Restore(progress.current, progress.scheduled, progress.took_effect);
  last_lr_ = progress.last_lr;
  version_lr_ = progress.version_lr;
  last_step_ = progress.last_step;
  run_id_ = progress.run_id;
  last_stats_ = progress.last_stats;
  if (loss_scaler_ && progress.loss_scaler) loss_scaler_->set_state(*progress.loss_scaler);
  // The trainers pushed every step up to the saved version; when is unknown.
  for (TrainerActivity& a : activity_) a = TrainerActivity{progress.version, std::nullopt};
}

std::vector<uint32_t> StepState::TrainersPushed() const {
  std::vector<uint32_t> ranks;
  for (uint32_t r = 0; r < slots_.size(); ++r) {
    if (slots_[r] == Slot::kComplete) ranks.push_back(r);
  }
  return ranks;
}

std::optional<LossScaler::State> StepState::loss_scaler_state() const {
  if (!loss_scaler_) return std::nullopt;
  return loss_scaler_->state();
}

}  // namespace shardopt
