// TrainerClient's hyperparameter calls: SetHyperparameters and
// CancelHyperparameters (see trainer_client.h), their guard against a step
// that may have started on some shard, and what a change that reached only
// some shards leaves recorded.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/push_history.h"
#include "client/partial_change.h"
#include "client/shard_connection.h"
#include "client/shard_fanout.h"
#include "client/streamed_push.h"
#include "client/trainer_client.h"
#include "common/optimizer_config.h"
#include "common/proto_convert.h"

namespace shardopt {

absl::Status TrainerClient::SetHyperparameters(int64_t effective_step,
                                               const OptimizerConfig& optimizer,
                                               const LrSchedule& lr_schedule) {
  CancelStreamedPush();  // (It counted its step as pushed.)
  if (absl::Status s = optimizer.Validate(); !s.ok()) return s;
  if (absl::Status s = lr_schedule.Validate(); !s.ok()) return s;
  v1::SetHyperparametersRequest request;
  request.set_model_id(spec_ ? spec_->model_id : "");
  request.set_effective_step(effective_step);
  *request.mutable_optimizer() = OptimizerConfigToProto(optimizer);
  *request.mutable_lr_schedule() = LrScheduleToProto(lr_schedule);
  return SendUnlessStarted(std::move(request));
}

absl::Status TrainerClient::CancelHyperparameters(int64_t effective_step) {
  CancelStreamedPush();
  v1::SetHyperparametersRequest request;
  request.set_model_id(spec_ ? spec_->model_id : "");
  request.set_effective_step(effective_step);
  request.set_cancel(true);
  return SendUnlessStarted(std::move(request));
}

absl::Status TrainerClient::SendUnlessStarted(v1::SetHyperparametersRequest request) {
  if (!layout_ || !history_) return absl::FailedPreconditionError("call Register or Attach first");
  // A step starts on a shard once every trainer's push of it is in there:
  // not before this trainer pushed it, and then on some shards only, where
  // a change or cancel would be refused while the others took it. An
  // identical repeat of what this trainer (or its earlier process, on the
  // same journal) already sent for that step changes nothing anywhere.
  const int64_t step = request.effective_step();
  const bool repeat = history_ && history_->IsLastWord(request);
  if (!repeat && step <= std::max(last_pushed_step_, registered_version_)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", step, " may already be applied on some shard (this trainer pushed step ",
        last_pushed_step_, ", the model was at version ", registered_version_, "): ",
        request.cancel() ? "its change stays" : "schedule the change for a later step"));
  }
  if (!repeat && !request.cancel()) {
    // Every push carries this trainer's pending changes; a shard takes at
    // most this many.
    const std::vector<v1::SetHyperparametersRequest> pending =
        history_->ChangesAfter(std::max(last_pushed_step_, registered_version_));
    const bool new_step = std::none_of(pending.begin(), pending.end(), [&](const auto& c) {
      return c.effective_step() == step;
    });
    if (new_step && pending.size() >= kMaxPendingHyperparameterChanges) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "this trainer has ", pending.size(), " hyperparameter changes pending (at most ",
          kMaxPendingHyperparameterChanges, "): schedule more once some took effect, or use an "
          "lr schedule"));
    }
  }
  return SendHyperparameters(std::move(request));
}

absl::Status TrainerClient::SendHyperparameters(v1::SetHyperparametersRequest request) {
  CancelStreamedPush();
  if (!layout_) return absl::FailedPreconditionError("call Register or Attach first");
  request.set_model_id(spec_->model_id);
  // (One slot per shard, each written by that shard's worker only.)
  std::vector<absl::Status> answers(fanout_->size(), absl::UnknownError("not asked"));
  absl::Status status = fanout_->Run(
      CallFor(absl::StrCat(request.cancel() ? "cancelling the hyperparameter change at step "
                                            : "SetHyperparameters from step ",
                           request.effective_step())),
      [&](ShardConnection& shard, grpc::ClientContext& context) {
        absl::Status s = shard.SetHyperparameters(context, request);
        answers[shard.index()] = s;
        return s;
      });
  // A shard restored from an older checkpoint lost it: recovery sends it
  // again (the last word for each step, a cancel too).
  if (status.ok()) return history_->RecordChange(request);
  const std::optional<std::vector<uint32_t>> took = ShardsThatTookARecordedChange(answers);
  if (!took) return status;
  // Recorded like a whole success (an identical repeat then passes the guard).
  const absl::Status recorded = history_->RecordChange(request);
  return absl::Status(
      status.code(),
      absl::StrCat(status.message(), took->size() == 1 ? " (shard " : " (shards ",
                   absl::StrJoin(*took, ", "), " took it; ",
                   !recorded.ok() ? absl::StrCat("recording it failed: ", recorded.message())
                   : request.cancel()
                       ? "the others keep the change until this call is repeated"
                       : "this trainer's next push carries it to the others, and a repeat of "
                         "this call sends it now",
                   ")"));
}

}  // namespace shardopt
