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
      activity_(options_.num_trainers),
      delivered_(options_.num_trainers, 0),
      first_inf_(options_.num_trainers) {
  // (Trust steps measure and update the slice at once: one range.)
  range_elements_ = options_.range_elements == 0 || options_.range_elements > options_.size ||
                            options_.needs_trust_norms
                        ? std::max<uint64_t>(options_.size, 1)
                        : options_.range_elements;
  range_count_ = std::max<uint64_t>(1, (options_.size + range_elements_ - 1) / range_elements_);
  block_sums_.resize(range_count_);
}

uint64_t StepState::RangeEnd(size_t index) const {
  return std::min<uint64_t>(options_.size, (index + 1) * range_elements_);
}

uint64_t StepState::ConsumedElements() const {
  return InStageOne() && claimed_ > 0 ? RangeEnd(claimed_ - 1) : 0;
}

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
  // Fixed by the first push admitted: a pipelined step reduces ranges (with
  // this scale) before any push is committed.
  pending_loss_scale_ = loss_scale;
  pending_stats_.loss_scale = loss_scale;
  pushed_ = true;
  return Admission::kStart;
}

void StepState::AbortPush(uint32_t rank, int64_t step) {
  if (version_ + 1 != step || slots_[rank] != Slot::kReceiving) return;
  slots_[rank] = Slot::kEmpty;
  // What claimed ranges consumed stays; the rest is resent.
  const uint64_t consumed = ConsumedElements();
  delivered_[rank] = std::min(delivered_[rank], consumed);
  if (first_inf_[rank] && *first_inf_[rank] >= consumed) first_inf_[rank].reset();
  const bool any_push =
      std::any_of(slots_.begin(), slots_.end(), [](Slot s) { return s != Slot::kEmpty; });
  if (!any_push && consumed == 0) {
    pending_loss_scale_.reset();
    pending_stats_.loss_scale = 1;
  }
  WithdrawChangesOf(rank);
}

void StepState::WithdrawChangesOf(uint32_t rank) {
  if (StepStarted() || ConsumedElements() > 0) return;  // (What it carried may be in use.)
  for (auto it = adopted_by_.begin(); it != adopted_by_.end();) {
    it->second.erase(rank);
    if (it->second.empty()) {
      schedule_.Withdraw(it->first);
      it = adopted_by_.erase(it);
    } else {
      ++it;
    }
  }
}

void StepState::RecordDelivered(uint32_t rank, int64_t step, uint64_t delivered,
                                std::optional<uint64_t> first_inf) {
  assert(step == version_ + 1 && slots_[rank] == Slot::kReceiving);
  (void)step;
  delivered_[rank] = std::max(delivered_[rank], delivered);
  if (first_inf && (!first_inf_[rank] || *first_inf < *first_inf_[rank])) {
    first_inf_[rank] = first_inf;
  }
}

size_t StepState::RangesArrived() const {
  if (!options_.pipelined || phase_ == Phase::kAwaitingDecision || BetweenHalves() ||
      (phase_ == Phase::kUpdating && decided_)) {
    return Pending() == 0 ? range_count_ : 0;
  }
  const uint64_t least = *std::min_element(delivered_.begin(), delivered_.end());
  if (least >= options_.size) return range_count_;
  return least / range_elements_;
}

bool StepState::CanClaim(bool shutting_down) const {
  if (failed() || claimed_ != finished_ || claimed_ >= range_count_) return false;
  if (phase_ == Phase::kUpdating && decided_) return true;  // Stage two.
  if (phase_ == Phase::kMeasuring) return true;             // (Reads only: holds allow it.)
  if (phase_ != Phase::kCollecting && phase_ != Phase::kReducing && phase_ != Phase::kUpdating) {
    return false;
  }
  if (HeldAt(version_) && !shutting_down) return false;
  if (!options_.pipelined) return Pending() == 0;
  const uint64_t end = RangeEnd(claimed_);
  return std::all_of(delivered_.begin(), delivered_.end(), [end](uint64_t d) { return d >= end; });
}

std::optional<StepState::RangeWork> StepState::ClaimRange(bool shutting_down) {
  if (!CanClaim(shutting_down)) return std::nullopt;
  if (phase_ == Phase::kCollecting) {
    const StartedStep started = StartStep();
    step_config_ = started.config;
  }
  RangeWork work;
  work.step = version_ + 1;
  work.index = claimed_;
  work.begin = claimed_ * range_elements_;
  work.end = RangeEnd(claimed_);
  if ((phase_ == Phase::kUpdating && decided_) || phase_ == Phase::kMeasuring) {
    work.kind = phase_ == Phase::kMeasuring ? RangeWork::Kind::kMeasure : RangeWork::Kind::kUpdate;
    work.config = decided_update_.config;
    work.skip = decided_update_.skip;
    work.optimizer_step = decided_update_.optimizer_step;
    work.multiplier = decided_update_.multiplier;
    work.tensor_norms = decided_update_.tensor_norms;
  } else {
    work.kind = phase_ == Phase::kReducing ? RangeWork::Kind::kReduce : RangeWork::Kind::kApply;
    work.config = step_config_;
    work.optimizer_step = optimizer_steps_ + 1;
    work.loss_scale = pending_loss_scale_.value_or(1.0);
    // An overflow in consumed elements stays with the step even if the push
    // that carried it breaks off.
    for (const std::optional<uint64_t>& inf : first_inf_) {
      if (inf && *inf >= work.begin && *inf < work.end) pending_stats_.found_inf = true;
    }
  }
  ++claimed_;
  return work;
}

void StepState::FinishRange(const RangeWork& work, std::vector<double> block_sums,
                            std::vector<TrustPartial> trust_partials) {
  assert(work.index == finished_ && claimed_ == finished_ + 1);
  if (work.kind == RangeWork::Kind::kReduce) block_sums_[work.index] = std::move(block_sums);
  if (work.kind == RangeWork::Kind::kMeasure) {
    pending_stats_.trust_partials = std::move(trust_partials);
  }
  ++finished_;
}

StepState::Completion StepState::CompleteStepIfDone() {
  if (failed() || finished_ != range_count_) return Completion::kNone;
  if (phase_ == Phase::kMeasuring) {
    phase_ = Phase::kAwaitingNorms;
    claimed_ = finished_ = 0;
    return Completion::kMeasured;
  }
  if (phase_ == Phase::kUpdating && decided_) {
    FinishStep(Ending{decided_update_.config.lr, *decided_, decided_update_.loss_scale});
    return Completion::kApplied;
  }
  if (Pending() != 0) return Completion::kNone;
  if (phase_ == Phase::kUpdating) {
    FinishStep(Ending{step_config_.lr, std::nullopt, pending_loss_scale_.value_or(1.0)});
    return Completion::kApplied;
  }
  if (phase_ == Phase::kReducing) {
    // Block by block in order: the same sum as one pass over the slice.
    double total = 0;
    for (const std::vector<double>& range : block_sums_) {
      for (double b : range) total += b;
    }
    FinishReduce(total);
    return Completion::kReduced;
  }
  return Completion::kNone;
}

int64_t StepState::RangeVersion(size_t index) const {
  return phase_ == Phase::kUpdating && index < finished_ ? version_ + 1 : version_;
}

std::optional<double> StepState::LrOf(int64_t version) const {
  if (version == version_) return version_lr_;
  if (version == version_ + 1 && phase_ == Phase::kUpdating) {
    return decided_ ? decided_update_.config.lr : step_config_.lr;
  }
  return std::nullopt;
}

bool StepState::PartlyRun() const {
  return InStageOne() && claimed_ > 0 && Pending() > 0 &&
         std::count(slots_.begin(), slots_.end(), Slot::kReceiving) == 0;
}

std::string StepState::DescribePartlyRun() const {
  std::vector<std::string> missing;
  for (uint32_t r = 0; r < slots_.size(); ++r) {
    if (slots_[r] != Slot::kComplete) missing.push_back(absl::StrCat(r));
  }
  return absl::StrCat("shard ", options_.shard_index, " ran ", finished_, " of ", range_count_,
                      " ranges of step ", version_ + 1, " (pipelined) with what trainer(s) ",
                      absl::StrJoin(missing, ", "),
                      " pushed before their push broke off: the step ends only when they push it "
                      "again (a trainer with a journal, journal_path, does so by itself), and "
                      "version ",
                      version_, " no longer exists whole on this shard");
}

absl::Status StepState::DiscardPending() {
  if (failed()) return failure_;
  if (PartlyRun()) {
    // Its ranges cannot be taken back: only a reload can give this version.
    return absl::FailedPreconditionError(DescribePartlyRun());
  }
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
    WithdrawChangesOf(rank);
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

StepState::StartedStep StepState::StartStep() {
  assert(phase_ == Phase::kCollecting && (Pending() == 0 || options_.pipelined));
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
  // A decision being applied range by range (or measured under its clip
  // half) can be compared with at once.
  if ((phase_ == Phase::kUpdating && decided_) || phase_ == Phase::kMeasuring) return true;
  return failed() || (!running() && (!HeldAt(version_) || shutting_down));
}

absl::StatusOr<std::optional<StepState::Update>> StepState::BeginDecision(
    int64_t step, const StepDecision& decision) {
  if (failed()) return failure_;
  if (step <= version_) {
    if (step == last_step_.step && Repeats(last_step_.decision, decision)) {
      return std::optional<Update>();
    }
    return absl::FailedPreconditionError(
        absl::StrCat("step ", step, " was already decided differently (or long ago)"));
  }
  if (phase_ == Phase::kUpdating && decided_ && step == version_ + 1) {
    if (Repeats(*decided_, decision)) return std::optional<Update>();
    return absl::FailedPreconditionError(
        absl::StrCat("step ", step, " is being applied as decided differently"));
  }
  if (BetweenHalves() && step == version_ + 1) {
    // (The norms of a full decision are BeginNorms's to check.)
    if (decided_->SameClip(decision)) return std::optional<Update>();
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", step, " is being decided differently (its clip half says ",
        decided_->skip ? "skip" : absl::StrCat("multiplier ", decided_->clip_coef), ")"));
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
  Update update;
  update.skip = decision.skip;
  update.measure = options_.needs_trust_norms && !decision.skip;
  // (Between the halves the step has started: no change for it can come,
  // and BeginNorms makes this config take effect. Until then a checkpoint
  // of this version still saves its own schedule.)
  update.config = update.measure ? schedule_.ConfigFor(step) : schedule_.TakeEffect(step);
  update.optimizer_step = optimizer_steps_ + 1;
  update.multiplier = GradientMultiplier(decision, pending_stats_.loss_scale);
  update.loss_scale = pending_stats_.loss_scale;
  phase_ = update.measure ? Phase::kMeasuring : Phase::kUpdating;
  decided_ = decision;
  if (update.measure) decided_->tensor_norms.clear();  // (The clip half.)
  decided_update_ = update;
  claimed_ = finished_ = 0;  // Stage two counts its ranges afresh.
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
  adopted_by_.clear();
  std::fill(slots_.begin(), slots_.end(), Slot::kEmpty);
  pending_loss_scale_.reset();
  pending_stats_ = StepStats();
  std::fill(delivered_.begin(), delivered_.end(), 0);
  std::fill(first_inf_.begin(), first_inf_.end(), std::nullopt);
  claimed_ = finished_ = 0;
  decided_.reset();
  for (std::vector<double>& sums : block_sums_) sums.clear();
}

absl::Status StepState::Fail(int64_t step, const absl::Status& cause) {
  failure_ = absl::InternalError(absl::StrCat("shard ", options_.shard_index, " of model '",
                                              options_.model_id, "' failed at step ", step,
                                              " and stopped: ", cause.message()));
  phase_ = Phase::kFailed;
  return failure_;
}

bool StepState::StatsKnown(int64_t step) const {
  return failed() ||
         ((phase_ == Phase::kAwaitingDecision || BetweenHalves()) && pending_stats_.step == step) ||
         version_ >= step || step > version_ + 1;
}

std::optional<absl::StatusOr<StepStats>> StepState::StatsOf(int64_t step) const {
  if (failed()) return absl::StatusOr<StepStats>(failure_);
  if ((phase_ == Phase::kAwaitingDecision || BetweenHalves()) && pending_stats_.step == step) {
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
    case Phase::kMeasuring:
      return absl::StrCat(where, ", measuring the trust norms of step ", next);
    case Phase::kAwaitingNorms:
      return absl::StrCat(where, ", waiting for a trainer to send the tensor norms of step ", next,
                          " (gathered from every shard's trust partials)");
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
  absl::Status s = schedule_.Schedule(effective_step, next, version_, StepStarted());
  if (s.ok()) adopted_by_.erase(effective_step);  // Asked for: no push takes it back.
  return s;
}

absl::Status StepState::CancelChange(int64_t effective_step) {
  absl::Status s = schedule_.Cancel(effective_step, version_, StepStarted());
  if (s.ok()) adopted_by_.erase(effective_step);
  return s;
}

absl::Status StepState::CheckCanAdopt(const std::vector<CarriedChange>& changes) const {
  std::vector<int64_t> steps;
  for (const CarriedChange& c : changes) steps.push_back(c.effective_step);
  const size_t added = schedule_.WouldAdopt(steps, version_, StepStarted());
  if (added > 0 && schedule_.scheduled().size() + added > kMaxPendingHyperparameterChanges) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the push carries ", added, " hyperparameter changes this shard does not hold, and ",
        schedule_.scheduled().size(), " are scheduled (at most ",
        kMaxPendingHyperparameterChanges, " not yet in force)"));
  }
  return absl::OkStatus();
}

void StepState::AdoptChanges(std::optional<uint32_t> pushing_rank,
                             const std::vector<CarriedChange>& changes) {
  for (const CarriedChange& c : changes) {
    const bool scheduled = schedule_.Adopt(c.effective_step, c.next, version_, StepStarted());
    if (!pushing_rank) {
      adopted_by_.erase(c.effective_step);
    } else if (scheduled) {
      adopted_by_[c.effective_step] = {*pushing_rank};
    } else if (auto carried = adopted_by_.find(c.effective_step); carried != adopted_by_.end()) {
      carried->second.insert(*pushing_rank);
    }
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
