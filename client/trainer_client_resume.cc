// TrainerClient::PullToResume (see trainer_client.h): where a (re)started
// trainer goes on from, past a pipelined step that ran in part without it;
// and which of its journaled pushes a rollback it did not see gave up.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/push_history.h"
#include "client/recovery.h"
#include "client/step_calls.h"
#include "client/trainer_client.h"
#include "common/logging.h"

namespace shardopt {

absl::StatusOr<int64_t> TrainerClient::PullToResume(absl::Span<float> flat_params) {
  // (Before any call to the shards: the push's thread holds their workers.)
  CancelStreamedPush();
  if (asynchronous()) return AsyncPullToResume(flat_params);
  // (Pull forgets the rollback.)
  std::optional<int64_t> rolled_back = rolled_back_to_;
  if (!rolled_back) {
    // Attached before another trainer rolled the job back: that version
    // will not come (or only with pushes this trainer no longer has).
    const absl::Status followed =
        FollowRollBack(recovery_->FollowRollBackBelow(registered_version_));
    if (RolledBackTo(followed)) {
      rolled_back = rolled_back_to_;
    } else if (!followed.ok()) {
      return followed;
    }
  }
  int64_t from = rolled_back.value_or(registered_version_);
  absl::StatusOr<int64_t> version = Pull(from, flat_params);
  if (absl::IsFailedPrecondition(version.status()) && !rolled_back) {
    version = ResumeOverPartlyRunStep(from, flat_params, &rolled_back);
    if (rolled_back) from = *rolled_back;
  }
  if (!version.ok()) return version.status();
  if (*version != from && (rolled_back || *version != from + 1)) {
    return absl::InternalError(absl::StrCat(
        "pulled version ", *version,
        rolled_back ? " after the job rolled back to " : " after attaching at ", from));
  }
  if (*version == from + 1 && scaler_ && scaler_step_ < *version) {
    // The step this trainer's earlier process pushed was decided and
    // applied meanwhile, without this process taking its decision: the
    // scaler replica is taken from the shards again (the step after it
    // needs this trainer's push, so they stay at this version).
    if (absl::Status s = RegisterOrAttach(*spec_, nullptr); !s.ok()) return s;
    if (registered_version_ != *version) {
      return absl::InternalError(absl::StrCat("attached again at version ", registered_version_,
                                              " after pulling version ", *version));
    }
  }
  return *version;
}

absl::Status TrainerClient::ForgetPushesGivenUpAt(int64_t version) {
  absl::StatusOr<std::optional<int64_t>> keep = recovery_->NewestPushAfterRollBackAt(version);
  if (!keep.ok()) return keep.status();
  if (!*keep || history_->newest_step() <= **keep) return absl::OkStatus();
  LogInfo(
      "trainer %d: the job was rolled back to step %d while this trainer was away: its "
      "journaled pushes after step %d belong to the steps given up and go",
      options_.trainer_rank, version, **keep);
  history_->DropAfter(**keep);
  last_pushed_step_ = std::max(version, history_->newest_step());
  return absl::OkStatus();
}

absl::StatusOr<int64_t> TrainerClient::ResumeOverPartlyRunStep(
    int64_t from, absl::Span<float> flat_params, std::optional<int64_t>* rolled_back) {
  // Whatever rolls the job back on the way, this trainer goes on from there.
  const auto followed = [&](absl::StatusOr<int64_t> version) -> absl::StatusOr<int64_t> {
    if (version.ok() || !rolled_back_to_) return version;
    *rolled_back = rolled_back_to_;
    return Pull(**rolled_back, flat_params);
  };
  // Perhaps a shard ran part of step from + 1 (pipelined) with pushes that
  // broke off, this trainer's earlier process's among them: `from` is gone.
  absl::StatusOr<PushedStep> mine = history_->Find(from + 1);
  if (mine.ok() && mine->dtype == options_.push_dtype) {
    // Journaled: send it again whole (the ranges it fed skip it; a shard
    // found behind is recovered first, as for any push) and go on from the
    // step's result.
    ++resent_on_resume_;
    absl::StatusOr<StepResult> pushed =
        PushPayload(from + 1, mine->payload->data(), mine->loss_scale);
    if (!pushed.ok()) return followed(pushed.status());
    return followed(Pull(from + 1, flat_params));
  }
  // Without it the step may never end: roll the job back (or follow the
  // trainer that did).
  const absl::Status recovered = FollowRollBack(recovery_->RollBackOverLostPush(from));
  if (recovered.ok()) return Pull(from, flat_params);  // (The state passed meanwhile.)
  if (RolledBackTo(recovered)) {
    LogWarning("trainer %d: %s", options_.trainer_rank, std::string(recovered.message()));
  }
  return followed(recovered);
}

}  // namespace shardopt
