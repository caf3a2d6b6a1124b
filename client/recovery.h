// Recovery: brings every shard of a model to a common step after some of
// them came back from older checkpoints (or a trainer restarted in the
// middle of a step). One procedure over all shards at once, entered when any
// shard answers OUT_OF_RANGE (it lacks an earlier step, or this trainer's
// push) or a (re)attaching trainer finds the shards at different versions.
//
// BringTo(target) repeats, until every shard is at `target`: survey every
// shard's version; for the step s after the lowest, re-push s from the
// trainer's PushHistory (with the hyperparameter changes for steps >= s it
// made, which a shard restored from before them lost) to every shard below
// s, and wait until they apply it (sending s's decision with gradient
// control). Each shard applies s once, when every trainer has re-pushed it;
// every trainer recovers the same way, since each of its calls reaches every
// shard. A fresh survey for every step follows shards that go back again
// meanwhile, and a shard's report that it still waits for other trainers
// ends the round too (they may wait for this one at another shard): no two
// trainers stay waiting for each other. It gives up after the retry budget
// without progress, saying what it last waited for.
//
// When a behind shard needs a push this trainer no longer holds (its
// history does not reach back that far: no journal, or a trainer restart
// without one), replay is impossible: the whole job rolls back to the
// newest committed checkpoint every shard holds (RollBack on every shard at
// or above it) and the call ends with RolledBackError, which says why and from
// which version to resume. Without such a checkpoint it ends with
// FAILED_PRECONDITION saying exactly what is missing.
//
// Waits are bounded by the retry budget and report what they wait for (see
// ShardFanOut). Not thread-safe: the trainer's thread drives it.
#ifndef SHARDOPT_CLIENT_RECOVERY_H_
#define SHARDOPT_CLIENT_RECOVERY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/push_history.h"
#include "client/retry.h"
#include "client/shard_connection.h"
#include "client/shard_fanout.h"
#include "client/step_calls.h"
#include "common/layout.h"
#include "proto/shardopt/v1/shard_service.pb.h"

namespace shardopt {

struct RecoveryContext {
  bool needs_decision = false;
  // How its calls are made (the label is set to "recovery: ").
  StepCallsContext calls;
};

// ABORTED, naming the version every shard is at now; the trainer pulls it
// and continues with the next step.
absl::Status RolledBackError(int64_t version, const std::string& why);
// The version of a RolledBackError; nullopt for any other status.
std::optional<int64_t> RolledBackTo(const absl::Status& status);

class Recovery {
 public:
  // `fanout` (over the shards, whose ranges are set) and `history` must
  // outlive this.
  Recovery(ShardFanOut* fanout, PushHistory* history, RecoveryContext context);

  // Every shard's summary of the model, in shard order (shards that are
  // down are retried within the budget). FAILED_PRECONDITION for a shard
  // that came back without the model.
  absl::StatusOr<std::vector<v1::ModelSummary>> Survey();

  // Every shard at version >= target (see the class comment).
  absl::Status BringTo(int64_t target);

  // For a trainer restarted without its push of the step after `version`
  // (no journal) while some shard ran part of that step with pushes that
  // broke off (ModelSummary.partly_run): `version` is gone there, and the
  // trainer whose push broke off may have lost it too, so the job rolls back
  // to the newest committed checkpoint every shard holds (RolledBackError, as
  // in BringTo); FAILED_PRECONDITION saying what is missing without one.
  // RolledBackError too when another trainer already rolled every shard back
  // below `version`; OK when no shard is in that state (pull again).
  absl::Status RollBackOverLostPush(int64_t version);
  // RolledBackError when another trainer rolled every shard back below
  // `version` (waiting, within the retry budget, while that rollback is
  // under way: some shards there, the others not yet); OK when none did.
  absl::Status FollowRollBackBelow(int64_t version);
  // For a trainer (re)attaching at `version` (synchronous) with journaled
  // pushes past it: when every shard sits at `version` because the job was
  // rolled back there (ModelSummary.rolled_back_to), which may have
  // happened while this trainer was away, its pushes of the steps after
  // version + 1 belong to the steps given up (a shard takes step version +
  // 1 only, and the parameters they were computed from are gone). Its push
  // of version + 1 stays: a shard may hold some of it (one still arriving
  // shows nowhere), and it was computed from version's parameters, which
  // the rollback restored. The newest step of its history to keep then
  // (`version` + 1); nullopt when the shards do not sit at a rollback.
  absl::StatusOr<std::optional<int64_t>> NewestPushAfterRollBackAt(int64_t version);

  // Pushes re-sent to shards that lacked them, so far.
  int64_t replayed_pushes() const { return replayed_pushes_.load(); }

 private:
  // Replays `step` (the lowest version + 1 in `shards`) onto the shards
  // below it and waits until they apply it. OUT_OF_RANGE when a shard went
  // back further meanwhile, DEADLINE_EXCEEDED when one still waits for other
  // trainers (survey again, both); NOT_FOUND (from the history) when this
  // trainer's push is needed and gone.
  absl::Status ReplayStep(const std::vector<v1::ModelSummary>& shards, int64_t step);
  absl::Status PushTo(const PushedStep& entry, const ShardSubset& which);
  // Sends this trainer's last word on each change after its version to
  // every shard below `target` it has not sent them to in its current
  // incarnation (a cancel or a replacement made after the shard's
  // checkpoint is not carried by pushes).
  absl::Status SendLastWords(const std::vector<v1::ModelSummary>& shards, int64_t target);
  absl::Status AwaitStep(int64_t step, const std::optional<StepDecision>& decision, bool pushed,
                         const ShardSubset& which);
  absl::Status RollBackJob(const std::vector<v1::ModelSummary>& shards, const std::string& why);
  // Every shard's summary, unless another trainer rolled the shards back
  // below `version`: then RolledBackError once every shard is there (waiting
  // within the retry budget while that rollback is under way).
  absl::StatusOr<std::vector<v1::ModelSummary>> SurveyUnlessRolledBackBelow(int64_t version);
  ShardFanOut::Call CallFor(const std::string& what) const;

  ShardFanOut* const fanout_;
  PushHistory* const history_;
  const RecoveryContext context_;
  StepCalls calls_;
  std::map<uint32_t, uint64_t> last_words_sent_;  // Shard -> incarnation.
  std::atomic<int64_t> replayed_pushes_{0};
};

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_RECOVERY_H_
