#include "server/hyperparameter_schedule.h"

#include "absl/strings/str_cat.h"

namespace shardopt {
namespace {

// Whether `step` is applied or being applied on a shard at `version`. A step
// waiting for its decision counts as being applied: some shards may have
// decided it already.
bool Started(int64_t step, int64_t version, bool next_started) {
  return step <= version || (step == version + 1 && next_started);
}

}  // namespace

absl::Status HyperparameterSchedule::Schedule(int64_t effective_step, const Hyperparameters& next,
                                              int64_t version, bool next_started) {
  if (auto done = took_effect_.find(effective_step); done != took_effect_.end()) {
    // A repeat (e.g. a retry after a lost reply) of a change already in force.
    if (done->second == next) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("a different hyperparameter change took effect at step ", effective_step));
  }
  // An identical repeat of a scheduled change (a restarted shard's trainers
  // send what it lost) is harmless even while its step is being applied.
  if (auto pending = scheduled_.find(effective_step);
      pending != scheduled_.end() && pending->second == next) {
    return absl::OkStatus();
  }
  if (Started(effective_step, version, next_started)) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", effective_step, " is already ",
                     effective_step <= version ? "applied" : "being applied", " (version ",
                     version, "); choose a later step"));
  }
  if (scheduled_.count(effective_step) == 0 &&
      scheduled_.size() >= kMaxPendingHyperparameterChanges) {
    return absl::ResourceExhaustedError(absl::StrCat(
        scheduled_.size(), " hyperparameter changes are scheduled and not yet in force (at most ",
        kMaxPendingHyperparameterChanges, "): schedule more once some took effect, or use an lr "
        "schedule"));
  }
  // (An identical one returned above.)
  if (!scheduled_.emplace(effective_step, next).second) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a different hyperparameter change is already scheduled for step ", effective_step));
  }
  cancelled_.erase(effective_step);
  return absl::OkStatus();
}

absl::Status HyperparameterSchedule::Cancel(int64_t effective_step, int64_t version,
                                            bool next_started) {
  if (took_effect_.count(effective_step) > 0 ||
      (effective_step == version + 1 && next_started && scheduled_.count(effective_step) > 0)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the change for step ", effective_step, " has already taken effect"));
  }
  if (scheduled_.erase(effective_step) > 0) cancelled_.insert(effective_step);
  return absl::OkStatus();
}

bool HyperparameterSchedule::Adopts(int64_t effective_step, int64_t version,
                                    bool next_started) const {
  return !Started(effective_step, version, next_started) && cancelled_.count(effective_step) == 0 &&
         scheduled_.count(effective_step) == 0;
}

size_t HyperparameterSchedule::WouldAdopt(const std::vector<int64_t>& effective_steps,
                                         int64_t version, bool next_started) const {
  std::set<int64_t> added;
  for (int64_t step : effective_steps) {
    if (Adopts(step, version, next_started)) added.insert(step);
  }
  return added.size();
}

bool HyperparameterSchedule::Adopt(int64_t effective_step, const Hyperparameters& next,
                                   int64_t version, bool next_started) {
  // (Never replaces what is there.)
  if (!Adopts(effective_step, version, next_started)) return false;
  scheduled_.emplace(effective_step, next);
  return true;
}

OptimizerConfig HyperparameterSchedule::TakeEffect(int64_t step) {
  while (!scheduled_.empty() && scheduled_.begin()->first <= step) {
    current_ = scheduled_.begin()->second;
    took_effect_.insert(*scheduled_.begin());
    scheduled_.erase(scheduled_.begin());
  }
  OptimizerConfig config = current_.optimizer;
  config.lr = current_.lr_schedule.LearningRate(current_.optimizer.lr, step);
  return config;
}

const Hyperparameters& HyperparameterSchedule::InForceAt(int64_t step) const {
  const Hyperparameters* in_force = &current_;
  for (const auto& [effective, change] : scheduled_) {
    if (effective > step) break;
    in_force = &change;
  }
  return *in_force;
}

OptimizerConfig HyperparameterSchedule::ConfigFor(int64_t step) const {
  const Hyperparameters& in_force = InForceAt(step);
  OptimizerConfig config = in_force.optimizer;
  config.lr = in_force.lr_schedule.LearningRate(in_force.optimizer.lr, step);
  return config;
}

std::vector<int64_t> HyperparameterSchedule::ScheduledSteps() const {
  std::vector<int64_t> steps;
  for (const auto& [step, change] : scheduled_) steps.push_back(step);
  return steps;
}

void HyperparameterSchedule::Restore(Hyperparameters current,
                                     std::map<int64_t, Hyperparameters> scheduled,
                                     std::map<int64_t, Hyperparameters> took_effect) {
  current_ = std::move(current);
  scheduled_ = std::move(scheduled);
  took_effect_ = std::move(took_effect);
}

}  // namespace shardopt
