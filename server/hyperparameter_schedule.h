// HyperparameterSchedule: which optimizer hyperparameters and lr schedule a
// shard uses at each step. Pure state (no locks, no I/O); StepState owns one
// and tells it where the step protocol stands.
//
// A change names the step it starts at. It may be scheduled while that step
// has not started on this shard; it takes effect when the step starts
// (TakeEffect); an identical repeat is harmless before and after it took
// effect (a retry after a lost reply, a restarted shard's trainers sending
// what it lost), a different change for the same step is refused, and a
// change still to come can be cancelled.
#ifndef SHARDOPT_SERVER_HYPERPARAMETER_SCHEDULE_H_
#define SHARDOPT_SERVER_HYPERPARAMETER_SCHEDULE_H_

#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "common/lr_schedule.h"
#include "common/optimizer_config.h"

namespace shardopt {

// The optimizer's hyperparameters and lr schedule from some step on.
struct Hyperparameters {
  OptimizerConfig optimizer;
  LrSchedule lr_schedule;
  bool operator==(const Hyperparameters& o) const {
    return optimizer == o.optimizer && lr_schedule == o.lr_schedule;
  }
  bool operator!=(const Hyperparameters& o) const { return !(*this == o); }
};

class HyperparameterSchedule {
 public:
  explicit HyperparameterSchedule(Hyperparameters initial) : current_(std::move(initial)) {}

  // `version`: the shard's version; `next_started`: step version + 1 has
  // started (is being reduced, awaits its decision or is being applied).
  // FAILED_PRECONDITION for a step applied or started, or one with another
  // change scheduled or in force; RESOURCE_EXHAUSTED for a new one when
  // kMaxPendingHyperparameterChanges are scheduled. `next` has been
  // validated by the caller.
  absl::Status Schedule(int64_t effective_step, const Hyperparameters& next, int64_t version,
                        bool next_started);
  // OK when there is nothing to cancel; FAILED_PRECONDITION once the change
  // has taken effect (or its step has started).
  absl::Status Cancel(int64_t effective_step, int64_t version, bool next_started);

  // A change a trainer carries in a push: scheduled when this shard has
  // nothing for its step (it lost it with a restart), the step is still to
  // come here, and this shard has not seen it cancelled. Never replaces or
  // removes anything: trainers disagreeing would otherwise make the shards'
  // schedules depend on arrival order. `next` has been validated.
  // True when it scheduled the change.
  bool Adopt(int64_t effective_step, const Hyperparameters& next, int64_t version,
             bool next_started);
  // Takes back a change Adopt scheduled (nothing else relies on it: the
  // push that carried it was refused before its step started), leaving the
  // schedule as it was before; nothing when none is scheduled there.
  void Withdraw(int64_t effective_step) { scheduled_.erase(effective_step); }
  // How many new entries Adopt of changes for `effective_steps` would add.
  size_t WouldAdopt(const std::vector<int64_t>& effective_steps, int64_t version,
                    bool next_started) const;

  // The config step `step` runs with (its lr from the schedule): the changes
  // scheduled up to `step` take effect first.
  OptimizerConfig TakeEffect(int64_t step);
  // What TakeEffect(step) would return, changing nothing (a step whose
  // first half runs before its changes take effect: trust norms).
  OptimizerConfig ConfigFor(int64_t step) const;
  // The hyperparameters step `step` runs with: the last change scheduled up
  // to it, else the current ones.
  const Hyperparameters& InForceAt(int64_t step) const;

  const Hyperparameters& current() const { return current_; }  // For the next step.
  const std::map<int64_t, Hyperparameters>& scheduled() const { return scheduled_; }
  const std::map<int64_t, Hyperparameters>& took_effect() const { return took_effect_; }
  std::vector<int64_t> ScheduledSteps() const;

  // Replaces everything (a restored shard).
  void Restore(Hyperparameters current, std::map<int64_t, Hyperparameters> scheduled,
               std::map<int64_t, Hyperparameters> took_effect);

 private:
  // Whether Adopt of a change for `effective_step` would schedule it: its
  // step is still to come, nothing is scheduled for it, it was not cancelled.
  bool Adopts(int64_t effective_step, int64_t version, bool next_started) const;

  Hyperparameters current_;
  std::map<int64_t, Hyperparameters> scheduled_;
  // Changes already in force, so that repeats of them stay harmless.
  std::map<int64_t, Hyperparameters> took_effect_;
  // Steps whose change was cancelled here (until scheduled again): a
  // trainer that still carries it does not bring it back.
  std::set<int64_t> cancelled_;
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_HYPERPARAMETER_SCHEDULE_H_
