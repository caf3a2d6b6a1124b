// ShardServiceImpl's calls that steer a step without payload: the statistics
// a trainer's gradient control decides from, and hyperparameter changes.
#include "common/logging.h"
#include "common/proto_convert.h"
#include "server/service_replies.h"
#include "server/shard_service.h"

namespace shardopt {

grpc::Status ShardServiceImpl::GetStepStats(grpc::ServerContext* context,
                                            const v1::GetStepStatsRequest* request,
                                            v1::StepStats* response) {
  if (absl::Status s = Authorize(*context, Access::kWrite); !s.ok()) return Error(s);
  CallScope call(this);
  if (!call.admitted().ok()) return Error(call.admitted());
  absl::StatusOr<std::shared_ptr<HostedModel>> model = models_.Find(request->model_id());
  if (!model.ok()) return Error(model.status());
  if (absl::Status s = CheckShardIndex(request->shard_index()); !s.ok()) return Error(s);
  ModelShard& shard = (*model)->shard();
  std::optional<StepDecision> clip;
  if (request->has_decision()) {
    // The clip half of a decision with trust norms (LAMB on the flat partition).
    clip = StepDecisionFromProto(request->decision());
    if (absl::Status s = CheckDecision(*clip, shard.options().max_grad_norm); !s.ok()) {
      return Error(s);
    }
  }
  // (A push the shard does not hold ends the wait at once.)
  absl::StatusOr<StepStats> stats = shard.WaitForStepStats(
      request->step(), WaitDeadline(*context, request->max_wait_ms()),
      [context] { return context->IsCancelled(); }, PushedByOf(*request), clip ? &*clip : nullptr);
  if (!stats.ok()) return Error(stats.status());
  *response = StepStatsToProto(*stats);
  return grpc::Status::OK;
}

grpc::Status ShardServiceImpl::SetHyperparameters(grpc::ServerContext* context,
                                                  const v1::SetHyperparametersRequest* request,
                                                  v1::SetHyperparametersResponse* response) {
  if (absl::Status s = Authorize(*context, Access::kWrite); !s.ok()) return Error(s);
  absl::StatusOr<std::shared_ptr<HostedModel>> model = models_.Find(request->model_id());
  if (!model.ok()) return Error(model.status());
  ModelShard& shard = (*model)->shard();
  if (request->cancel()) {
    if (absl::Status s = shard.CancelHyperparameters(request->effective_step()); !s.ok()) {
      return Error(s);
    }
    response->set_effective_step(request->effective_step());
    response->set_version(shard.version());
    return grpc::Status::OK;
  }
  absl::StatusOr<Hyperparameters> h =
      HyperparametersFromProto(request->optimizer(), request->lr_schedule());
  if (!h.ok()) return Error(h.status());
  if (absl::Status s = shard.SetHyperparameters(request->effective_step(), *h); !s.ok()) {
    return Error(s);
  }
  LogInfo("model '%s': from step %d: %s, lr schedule %s", request->model_id(),
          request->effective_step(), h->optimizer.DebugString(), h->lr_schedule.DebugString());
  response->set_effective_step(request->effective_step());
  response->set_version(shard.version());
  return grpc::Status::OK;
}

}  // namespace shardopt
