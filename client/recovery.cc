#include "client/recovery.h"

#include <algorithm>
#include <limits>
#include <set>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/proto_convert.h"

namespace shardopt {
namespace {

constexpr char kRolledBackPayload[] = "type.shardopt.dev/rolled_back_to";
// Prefixes what recovery's calls say in errors and wait reports.
constexpr char kLabel[] = "recovery: ";

bool Holds(const v1::ModelSummary& summary, uint32_t rank) {
  return std::find(summary.trainers_pushed().begin(), summary.trainers_pushed().end(), rank) !=
         summary.trainers_pushed().end();
}

int64_t LowestVersion(const std::vector<v1::ModelSummary>& shards) {
  int64_t lowest = shards[0].version();
  for (const v1::ModelSummary& s : shards) lowest = std::min(lowest, s.version());
  return lowest;
}

std::string Versions(const std::vector<v1::ModelSummary>& shards) {
  std::vector<std::string> each;
  for (size_t i = 0; i < shards.size(); ++i) {
    each.push_back(absl::StrCat("shard ", i, " at ", shards[i].version()));
  }
  return absl::StrJoin(each, ", ");
}

}  // namespace

absl::Status RolledBackError(int64_t version, const std::string& why) {
  absl::Status status = absl::AbortedError(absl::StrCat(
      "the job rolled back to step ", version, " (the newest checkpoint every shard holds): ", why,
      "; resume from step ", version + 1, " with the parameters of version ", version));
  status.SetPayload(kRolledBackPayload, absl::Cord(absl::StrCat(version)));
  return status;
}

std::optional<int64_t> RolledBackTo(const absl::Status& status) {
  auto payload = status.GetPayload(kRolledBackPayload);
  int64_t version = 0;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &version)) return std::nullopt;
  return version;
}

namespace {

StepCallsContext Labelled(StepCallsContext calls) {
  calls.label = kLabel;
  // A shard still waiting for other trainers is a reason to look again (they
  // may wait for this one at another shard), not to wait on.
  calls.end_on_wait_report = true;
  return calls;
}

}  // namespace

Recovery::Recovery(ShardFanOut* fanout, PushHistory* history, RecoveryContext context)
    : fanout_(fanout),
      history_(history),
      context_(std::move(context)),
      calls_(fanout, Labelled(context_.calls)) {}

ShardFanOut::Call Recovery::CallFor(const std::string& what) const {
  // Not calls_' own: these wait on no other trainer.
  return CallFrom(context_.calls, kLabel + what);
}

absl::StatusOr<std::vector<v1::ModelSummary>> Recovery::Survey() {
  std::vector<v1::ModelSummary> summaries(fanout_->size());
  absl::Status status =
      fanout_->Run(CallFor("asking the shard's version"),
                   [&](ShardConnection& shard, grpc::ClientContext& context) -> absl::Status {
                     const std::string& model_id = context_.calls.model_id;
                     absl::Status s = shard.Summary(context, model_id, &summaries[shard.index()]);
                     if (absl::IsNotFound(s)) {
                       return absl::FailedPreconditionError(absl::StrCat(
                           "the shard came back without model '", model_id,
                           "' (started without --restore_from?): it cannot rejoin the job"));
                     }
                     return s;
                   });
  if (!status.ok()) return status;
  return summaries;
}

absl::Status Recovery::BringTo(int64_t target) {
  // One step at a time, each on a fresh survey: the shards may go back again
  // (restart, roll back) while this runs, and other trainers recover at the
  // same time from what they saw. Bounded by the retry budget without
  // progress.
  absl::Time give_up = absl::Now() + context_.calls.policy.budget;
  int64_t best = std::numeric_limits<int64_t>::min();
  absl::Status last;
  for (;;) {
    absl::StatusOr<std::vector<v1::ModelSummary>> shards = Survey();
    if (!shards.ok()) return shards.status();
    const int64_t lowest = LowestVersion(*shards);
    if (lowest >= target) return absl::OkStatus();
    if (lowest > best) {
      best = lowest;
      give_up = absl::Now() + context_.calls.policy.budget;
    } else if (absl::Now() >= give_up) {
      return absl::DeadlineExceededError(
          absl::StrCat("recovery of model '", context_.calls.model_id, "' made no progress for ",
                       absl::FormatDuration(context_.calls.policy.budget), " (", Versions(*shards),
                       "); last: ", last.message()));
    }
    if (absl::Status s = SendLastWords(*shards, target); !s.ok()) return s;
    last = ReplayStep(*shards, lowest + 1);
    // Look again: a shard went back meanwhile (OUT_OF_RANGE), or it still
    // waits for other trainers (DEADLINE_EXCEEDED: its report).
    if (last.ok() || absl::IsOutOfRange(last) || absl::IsDeadlineExceeded(last) ||
        absl::IsUnavailable(last)) {
      continue;
    }
    if (absl::IsNotFound(last)) {
      last = RollBackJob(*shards, absl::StrCat(Versions(*shards), "; ", last.message()));
      if (RolledBackTo(last)) return last;
      // ABORTED: a shard changed since the survey (it restarted, or another
      // trainer rolled it back); DATA_LOSS / NOT_FOUND: the checkpoint chosen
      // is damaged (now set aside) or gone: look again.
      if (absl::IsAborted(last) || absl::IsDataLoss(last) || absl::IsNotFound(last)) continue;
    }
    return last;
  }
}

absl::StatusOr<std::vector<v1::ModelSummary>> Recovery::SurveyUnlessRolledBackBelow(
    int64_t version) {
  const absl::Time give_up = absl::Now() + context_.calls.policy.budget;
  for (;;) {
    absl::StatusOr<std::vector<v1::ModelSummary>> shards = Survey();
    if (!shards.ok()) return shards.status();
    const int64_t lowest = LowestVersion(*shards);
    const auto there = [&](const v1::ModelSummary& s) {
      return s.version() == lowest && s.rolled_back_to() == lowest;
    };
    if (lowest >= version || std::none_of(shards->begin(), shards->end(), there)) return shards;
    if (std::all_of(shards->begin(), shards->end(), there)) {
      return RolledBackError(
          lowest, absl::StrCat("another trainer rolled the job back below version ", version));
    }
    // Under way: some shards there, the others not yet.
    if (absl::Now() >= give_up) {
      return absl::DeadlineExceededError(absl::StrCat(
          "model '", context_.calls.model_id, "': another trainer's rollback to step ", lowest,
          " did not reach every shard within the retry budget (", Versions(*shards), ")"));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

absl::Status Recovery::FollowRollBackBelow(int64_t version) {
  return SurveyUnlessRolledBackBelow(version).status();
}

absl::StatusOr<std::optional<int64_t>> Recovery::NewestPushAfterRollBackAt(int64_t version) {
  absl::StatusOr<std::vector<v1::ModelSummary>> shards = Survey();
  if (!shards.ok()) return shards.status();
  for (const v1::ModelSummary& s : *shards) {
    if (s.version() != version || s.rolled_back_to() != version) return std::nullopt;
  }
  return version + 1;
}

absl::Status Recovery::RollBackOverLostPush(int64_t version) {
  // A few rollback attempts: a shard may change between the survey and the
  // rollback (another trainer rolled it back first, or it restarted).
  absl::Status last;
  for (int attempt = 0; attempt < 5; ++attempt) {
    absl::StatusOr<std::vector<v1::ModelSummary>> shards = SurveyUnlessRolledBackBelow(version);
    if (!shards.ok()) return shards.status();
    std::vector<std::string> stuck;
    for (size_t i = 0; i < shards->size(); ++i) {
      // (Also where this trainer's own push was complete: it cannot tell
      // whether the trainer whose push broke off still holds it.)
      if ((*shards)[i].partly_run() && (*shards)[i].version() == version) {
        stuck.push_back(absl::StrCat(i));
      }
    }
    if (stuck.empty()) return absl::OkStatus();
    last = RollBackJob(
        *shards,
        absl::StrCat("shard(s) ", absl::StrJoin(stuck, ", "), " ran part of step ", version + 1,
                     " (pipelined) with pushes that then broke off, and "
                     "trainer ",
                     context_.calls.trainer_rank,
                     " restarted without its push of it (no journal): version ", version,
                     " no longer exists whole there"));
    if (RolledBackTo(last)) return last;
    if (!absl::IsAborted(last) && !absl::IsDataLoss(last) && !absl::IsNotFound(last)) return last;
  }
  return last;
}

absl::Status Recovery::SendLastWords(const std::vector<v1::ModelSummary>& shards, int64_t target) {
  std::vector<uint32_t> which;
  for (uint32_t i = 0; i < shards.size(); ++i) {
    auto sent = last_words_sent_.find(i);
    if (shards[i].version() < target &&
        (sent == last_words_sent_.end() || sent->second != shards[i].incarnation())) {
      which.push_back(i);
    }
  }
  if (which.empty()) return absl::OkStatus();
  absl::Status status = fanout_->Run(
      CallFor("re-sending hyperparameter changes"),
      [&](ShardConnection& shard, grpc::ClientContext& context) -> absl::Status {
        const int64_t version = shards[shard.index()].version();
        for (v1::SetHyperparametersRequest change : history_->LastWordsAfter(version)) {
          change.set_model_id(context_.calls.model_id);
          // Each on a context of its own (one attempt sends several), which
          // Ctrl-C and another shard's failure cancel as they do the attempt.
          auto send = [&](const v1::SetHyperparametersRequest& r) {
            ShardFanOut::FollowUpContext follow_up(context_.calls.rpc_timeout);
            return shard.SetHyperparameters(follow_up.get(), r);
          };
          absl::Status s = send(change);
          if (absl::IsFailedPrecondition(s) && !change.cancel()) {
            // The shard still holds a change for that step that was
            // cancelled or replaced after its checkpoint: remove it, then
            // schedule this one. (Refused again once the step has started:
            // some shard may have applied it.)
            v1::SetHyperparametersRequest cancel = change;
            cancel.set_cancel(true);
            if (send(cancel).ok()) s = send(change);
          }
          if (!s.ok() && !absl::IsFailedPrecondition(s)) return s;
        }
        return absl::OkStatus();
      },
      which);
  if (!status.ok()) return status;
  for (uint32_t i : which) last_words_sent_[i] = shards[i].incarnation();
  return absl::OkStatus();
}

absl::Status Recovery::ReplayStep(const std::vector<v1::ModelSummary>& shards, int64_t step) {
  std::vector<uint32_t> behind;
  bool mine_needed = false;
  for (uint32_t i = 0; i < shards.size(); ++i) {
    if (shards[i].version() >= step) continue;
    behind.push_back(i);
    // The shards below `step` are at step - 1 (it is the lowest version + 1).
    mine_needed = mine_needed || !Holds(shards[i], context_.calls.trainer_rank);
  }
  absl::StatusOr<PushedStep> entry = history_->Find(step);
  if (!entry.ok() && mine_needed) return entry.status();
  if (entry.ok()) {
    if (absl::Status s = PushTo(*entry, behind); !s.ok()) return s;
  }
  const std::optional<StepDecision> decision =
      entry.ok() ? entry->decision : std::optional<StepDecision>();
  return AwaitStep(step, decision, entry.ok(), behind);
}

absl::Status Recovery::PushTo(const PushedStep& entry, const ShardSubset& which) {
  const uint64_t elements = fanout_->shards().back()->range().end;
  if (entry.payload->size() != elements * DTypeSize(entry.dtype)) {
    return absl::InternalError(absl::StrCat("the kept push of step ", entry.step, " has ",
                                            entry.payload->size(), " bytes; the layout has ",
                                            elements, " ", DTypeName(entry.dtype), " elements"));
  }
  // The changes a shard restored from before them lost come back with the
  // pushes (see PushHeader.hyperparameter_changes).
  std::vector<v1::PushGradientsResponse> responses;
  absl::Status pushed =
      calls_.Push(entry.step, entry.payload->data(), entry.dtype, entry.loss_scale,
                  history_->ChangesAfter(entry.step - 1), &responses, which);
  for (uint32_t i : which) {
    const v1::PushGradientsResponse::Outcome outcome = responses[i].outcome();
    if (outcome != v1::PushGradientsResponse::OUTCOME_UNSPECIFIED &&
        outcome != v1::PushGradientsResponse::OUTCOME_DUPLICATE &&
        outcome != v1::PushGradientsResponse::OUTCOME_ALREADY_APPLIED) {
      replayed_pushes_.fetch_add(1);
    }
  }
  return pushed;
}

absl::Status Recovery::AwaitStep(int64_t step, const std::optional<StepDecision>& decision,
                                 bool pushed, const ShardSubset& which) {
  const int64_t pushed_step = pushed ? step : 0;
  const bool decide = context_.needs_decision && decision.has_value();
  if (decide) {
    // The decision is taken only once every trainer's gradient is in.
    absl::StatusOr<std::vector<StepStats>> all_in = calls_.Stats(step, pushed_step, which);
    if (!all_in.ok()) return all_in.status();
  }
  return calls_.Pull(step, pushed_step, decide ? &*decision : nullptr, nullptr, which).status();
}

absl::Status Recovery::RollBackJob(const std::vector<v1::ModelSummary>& shards,
                                   const std::string& why) {
  // The newest checkpoint every shard lists, no later than the lowest
  // version (every shard can go back to it).
  const int64_t lowest = LowestVersion(shards);
  std::set<int64_t> common(shards[0].committed_checkpoints().begin(),
                           shards[0].committed_checkpoints().end());
  for (const v1::ModelSummary& s : shards) {
    const std::set<int64_t> mine(s.committed_checkpoints().begin(),
                                 s.committed_checkpoints().end());
    std::set<int64_t> both;
    std::set_intersection(common.begin(), common.end(), mine.begin(), mine.end(),
                          std::inserter(both, both.begin()));
    common = std::move(both);
  }
  int64_t to_step = -1;
  for (int64_t step : common) {
    if (step <= lowest) to_step = std::max(to_step, step);
  }
  if (to_step < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("model '", context_.calls.model_id, "' cannot recover: ", why,
                     "; and no committed checkpoint at or below version ", lowest,
                     " is held by every shard to roll the job back to (start the servers with "
                     "--checkpoint_dir and --checkpoint_every, and give trainers a journal_path)"));
  }
  // Every shard at or above it: one above reloads it, one at it drops what
  // it holds of the next step (pushes of the steps given up); each sets
  // aside the later step directories.
  // (A shard some trainer already rolled back to it is left alone: it may
  // hold what the trainers pushed since.)
  std::vector<uint32_t> above;
  for (uint32_t i = 0; i < shards.size(); ++i) {
    const bool done = shards[i].version() == to_step && shards[i].rolled_back_to() == to_step;
    if (shards[i].version() >= to_step && !done) above.push_back(i);
  }
  if (!above.empty()) {
    ShardFanOut::Call call = CallFor(absl::StrCat("rolling the job back to step ", to_step));
    call.retryable = [](const absl::Status& s) {
      return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
    };
    absl::Status rolled = fanout_->Run(
        call,
        [&](ShardConnection& shard, grpc::ClientContext& context) -> absl::Status {
          v1::RollBackRequest request;
          request.set_model_id(context_.calls.model_id);
          request.set_shard_index(shard.index());
          request.set_to_step(to_step);
          request.set_expected_incarnation(shards[shard.index()].incarnation());
          request.set_reason(absl::StrCat("trainer ", context_.calls.trainer_rank, ": ", why));
          v1::RollBackResponse response;
          return shard.RollBack(context, request, &response);
        },
        above);
    if (!rolled.ok()) return rolled;
  }
  return RolledBackError(to_step, why);
}

}  // namespace shardopt
