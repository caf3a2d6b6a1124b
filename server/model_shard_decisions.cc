// ModelShard's decisions of synchronous steps with gradient control or
// trust norms: the statistics a decision is taken from, and the decision
// itself (with trust norms, in two halves: see common/step_protocol.h).
#include <cassert>

#include "absl/strings/str_cat.h"
#include "server/model_shard.h"

namespace shardopt {
namespace {

absl::Status NoDecisionsError(const std::string& model_id, const char* what) {
  return absl::FailedPreconditionError(absl::StrCat(
      "model '", model_id, "' has no gradient clipping or loss scaling: its steps ", what));
}

}  // namespace

absl::StatusOr<StepStats> ModelShard::WaitForStepStats(int64_t step, absl::Time deadline,
                                                       const std::function<bool()>& cancelled,
                                                       std::optional<PushedBy> pushed,
                                                       const StepDecision* clip_decision) {
  if (step <= 0) return absl::InvalidArgumentError(absl::StrCat("step ", step, " is not positive"));
  if (asynchronous()) return NotInAsyncMode("step statistics are");
  if (!options_.needs_decision()) return NoDecisionsError(options_.model_id, "need no decision");
  if (clip_decision != nullptr && !options_.needs_trust_norms()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model '", options_.model_id,
        "' gathers no trust norms (LAMB on the flat partition over several shards does): a "
        "statistics request carries no decision"));
  }
  if (clip_decision != nullptr && clip_decision->skip) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", step, " is skipped: a skip needs no trust norms"));
  }
  if (pushed) {
    if (absl::Status s = CheckRank(pushed->rank); !s.ok()) return s;
  }
  absl::MutexLock lock(&mu_);
  if (step > state_.version() + 1) {
    // It cannot come without earlier steps (a restarted shard is behind).
    return absl::OutOfRangeError(
        absl::StrCat("step ", step, " is ahead of the shard (version ", state_.version(), ")"));
  }
  const auto lost = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return pushed && !state_.CheckHoldsPush(pushed->rank, pushed->step).ok();
  };
  const absl::Status waited =
      AwaitState([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return state_.StatsKnown(step) || lost(); },
                 deadline, cancelled);
  if (state_.failed()) return state_.failure();
  if (shutdown_) return absl::UnavailableError("the shard server is shutting down");
  if (lost()) return state_.CheckHoldsPush(pushed->rank, pushed->step);
  std::optional<absl::StatusOr<StepStats>> stats = state_.StatsOf(step);
  if (!stats) {
    if (absl::IsDeadlineExceeded(waited)) {
      return WaitExpired(absl::StrCat("the gradients of step ", step), step);
    }
    return waited;
  }
  if (!stats->ok()) return *stats;
  if (clip_decision == nullptr) {
    // (The first half's answer: the partials are the second half's.)
    StepStats first_half = **stats;
    first_half.trust_partials.clear();
    return first_half;
  }
  if (absl::Status s = MeasureUnderClip(step, *clip_decision, deadline, cancelled); !s.ok()) {
    return s;
  }
  return *state_.TrustStatsOf(step);
}

absl::Status ModelShard::AwaitDecisionRoom(int64_t step, absl::Time deadline,
                                           const std::function<bool()>& cancelled) {
  // Another trainer's decision for this step may be being taken right now:
  // wait for it, then this one is a repeat to compare. A checkpoint of the
  // current version holds the next step: wait for it first too, so that
  // everything below is checked against the state that will be used. (A
  // decision that comes while its step is still being reduced, e.g. resent
  // to a restarted shard, waits for the pushes that step lacks: bounded.)
  const absl::Status waited = AwaitOrCancel(absl::Condition(
                                                +[](ModelShard* s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                                  return s->state_.DecisionMayProceed(s->shutdown_);
                                                },
                                                this),
                                            deadline, cancelled);
  if (absl::IsDeadlineExceeded(waited)) {
    return WaitExpired(absl::StrCat("room for the decision of step ", step), step);
  }
  return waited;
}

absl::Status ModelShard::MeasureUnderClip(int64_t step, const StepDecision& clip,
                                          absl::Time deadline,
                                          const std::function<bool()>& cancelled) {
  if (absl::Status s = AwaitDecisionRoom(step, deadline, cancelled); !s.ok()) return s;
  // (nullopt: a repeat of the clip half already taken, or of an applied step.)
  absl::StatusOr<std::optional<StepState::Update>> begun = state_.BeginDecision(step, clip);
  if (!begun.ok()) return begun.status();
  // Whoever waits runs the measuring (a range claim, like any other work).
  const absl::Status waited =
      AwaitState([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return state_.TrustStatsKnown(step); },
                 deadline, cancelled);
  if (state_.failed()) return state_.failure();
  if (state_.TrustStatsKnown(step)) return state_.TrustStatsOf(step)->status();
  if (shutdown_) return absl::UnavailableError("the shard server is shutting down");
  if (absl::IsDeadlineExceeded(waited)) {
    return WaitExpired(absl::StrCat("the trust partials of step ", step), step);
  }
  return waited;
}

absl::Status ModelShard::Decide(int64_t step, const StepDecision& decision, bool wait,
                                absl::Time deadline, const std::function<bool()>& cancelled) {
  if (asynchronous()) return NotInAsyncMode("step decisions are");
  if (!options_.needs_decision()) return NoDecisionsError(options_.model_id, "take no decision");
  if (absl::Status s = CheckDecision(decision, options_.max_grad_norm); !s.ok()) return s;
  const bool trust = options_.needs_trust_norms() && !decision.skip;
  if (trust && decision.tensor_norms.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model '", options_.model_id, "' runs LAMB on the flat partition over ",
        options_.layout.shard_count(), " shards: the decision of step ", step,
        " must carry every tensor's norms (ask GetStepStats with its clip half for the shards' "
        "trust partials, then combine them)"));
  }
  if (trust) {
    // Before the clip half is taken (the first one counts): a malformed
    // decision changes nothing.
    if (absl::Status s =
            CheckTensorNorms(decision.tensor_norms, options_.layout.tensors().size(), /*own=*/{});
        !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("step ", step, " on shard ", options_.shard_index, ": ", s.message()));
    }
  }
  if (!options_.needs_trust_norms() && !decision.tensor_norms.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("model '", options_.model_id,
                                                   "' gathers no trust norms: the decision of "
                                                   "step ",
                                                   step, " carries tensor norms"));
  }
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::optional<StepState::Update>> begun;
  if (trust) {
    if (absl::Status s = MeasureUnderClip(step, decision, deadline, cancelled); !s.ok()) return s;
    if (absl::Status s = AwaitDecisionRoom(step, deadline, cancelled); !s.ok()) return s;
    begun = state_.BeginNorms(step, decision);
  } else {
    if (absl::Status s = AwaitDecisionRoom(step, deadline, cancelled); !s.ok()) return s;
    begun = state_.BeginDecision(step, decision);
  }
  if (!begun.ok()) return begun.status();
  if (!wait) return absl::OkStatus();
  AwaitState([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return state_.version() >= step; },
             absl::InfiniteFuture(), nullptr, /*stop_at_shutdown=*/false)
      .IgnoreError();  // (Its outcome is read from the state.)
  if (state_.failed()) return state_.failure();
  return absl::OkStatus();
}

}  // namespace shardopt
