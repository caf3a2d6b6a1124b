// StepState's second half of a decision with trust norms (LAMB on the flat
// partition; see step_state.h): the norms, and the partials they are
// checked against.
#include <cassert>

#include "absl/strings/str_cat.h"
#include "server/step_state.h"

namespace shardopt {

bool StepState::Repeats(const StepDecision& taken, const StepDecision& decision) const {
  if (options_.needs_trust_norms && !decision.skip && decision.tensor_norms.empty()) {
    return taken.SameClip(decision);
  }
  return taken == decision;
}

absl::StatusOr<std::optional<StepState::Update>> StepState::BeginNorms(
    int64_t step, const StepDecision& decision) {
  if (failed()) return failure_;
  if (step <= version_ || (phase_ == Phase::kUpdating && decided_ && step == version_ + 1)) {
    return BeginDecision(step, decision);  // A repeat: compared in full.
  }
  if (phase_ != Phase::kAwaitingNorms || step != version_ + 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", step, " is not awaiting its tensor norms: the shard is at version ",
                     version_, phase_ == Phase::kMeasuring ? " and still measuring the step" : ""));
  }
  if (!decided_->SameClip(decision)) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", step,
                     "'s tensor norms come with another clip decision than the one "
                     "they were measured under"));
  }
  if (absl::Status s = CheckTensorNorms(decision.tensor_norms, options_.trust_tensor_count,
                                        pending_stats_.trust_partials);
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", step, " on shard ", options_.shard_index, ": ", s.message()));
  }
  phase_ = Phase::kUpdating;
  decided_ = decision;
  decided_update_.config = schedule_.TakeEffect(step);  // (What the measuring used.)
  decided_update_.measure = false;
  decided_update_.tensor_norms = decision.tensor_norms;
  claimed_ = finished_ = 0;
  return std::optional<Update>(decided_update_);
}

bool StepState::TrustStatsKnown(int64_t step) const {
  if (failed()) return true;
  if (step == version_ + 1) {
    return phase_ == Phase::kAwaitingNorms || (phase_ == Phase::kUpdating && decided_);
  }
  return StatsKnown(step);
}

std::optional<absl::StatusOr<StepStats>> StepState::TrustStatsOf(int64_t step) const {
  if (failed()) return absl::StatusOr<StepStats>(failure_);
  if (step == version_ + 1) {
    const bool measured = phase_ == Phase::kAwaitingNorms ||
                          (phase_ == Phase::kUpdating && decided_ && !decided_->skip);
    if (measured) return absl::StatusOr<StepStats>(pending_stats_);
    if (phase_ == Phase::kUpdating && decided_) {
      return absl::StatusOr<StepStats>(absl::FailedPreconditionError(
          absl::StrCat("step ", step, " is being skipped: it has no trust norms")));
    }
    return std::nullopt;
  }
  if (step <= version_ && step == last_step_.step && last_step_.decision.skip) {
    return absl::StatusOr<StepStats>(absl::FailedPreconditionError(
        absl::StrCat("step ", step, " was skipped: it has no trust norms")));
  }
  return StatsOf(step);
}

}  // namespace shardopt
