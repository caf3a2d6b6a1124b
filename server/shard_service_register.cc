// ShardServiceImpl's registration: RegisterModel (a model's first trainer
// creates its shard here, later ones attach to it and must name the same
// config), and the plan, state budget, backend and checkpoint options a
// shard is created or restored with.
#include <google/protobuf/util/message_differencer.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/checkpoint_catalog.h"
#include "common/logging.h"
#include "common/names.h"
#include "common/proto_convert.h"
#include "common/proto_difference.h"
#include "server/device_support.h"
#include "server/service_replies.h"
#include "server/shard_service.h"

namespace shardopt {
namespace {

// The version, scaler state and run a (re)attaching trainer starts from.
void SetAttachInfo(const ModelShard& shard, v1::RegisterModelResponse* response) {
  const ModelShard::AttachInfo info = shard.GetAttachInfo();
  response->set_version(info.version);
  response->set_run_id(info.run_id);
  if (info.loss_scaler) {
    response->mutable_loss_scaler()->set_scale(info.loss_scaler->scale);
    response->mutable_loss_scaler()->set_growth_tracker(info.loss_scaler->growth_tracker);
    response->mutable_loss_scaler()->set_hysteresis_tracker(info.loss_scaler->hysteresis_tracker);
  }
}

}  // namespace

uint64_t ShardServiceImpl::StateBytes(const ShardPlan& plan) const {
  // On a GPU the first bf16 pull makes a bf16 copy of the parameters (see
  // GpuBackend): reserved up front, so it cannot take the GPU past the
  // budget later.
  const uint64_t bf16_copy =
      options_.gpu_index >= 0
          ? plan.options.layout.ShardSize(plan.options.shard_index) * sizeof(uint16_t)
          : 0;
  return plan.state_bytes + bf16_copy;
}

absl::StatusOr<ShardPlan> ShardServiceImpl::PlanHere(v1::ModelConfig config) const {
  absl::StatusOr<ShardPlan> plan =
      PlanShard(std::move(config), options_.shard_index, options_.shard_count);
  if (plan.ok()) {
    plan->options.pipeline_range_elements = options_.pipeline_range_elements;
    plan->options.step_timeline = options_.step_timeline;
  }
  return plan;
}

ModelShard::BackendFactory ShardServiceImpl::BackendFactory() {
  const ModelShard::BackendFactory cpu = ModelShard::CpuBackendFactory(&pool_);
  if (options_.gpu_index < 0) return cpu;
  return [gpu = options_.gpu_index, cpu](
             const ModelShardOptions& o,
             std::vector<float> v) -> absl::StatusOr<std::unique_ptr<UpdateBackend>> {
    // What the GPU backend has no kernel for (UNIMPLEMENTED: Muon without
    // cuBLAS, more trainers than it reduces) runs here on the CPU, said once per
    // model, rather than not at all.
    if (IsAsynchronous(o.consistency)) {
      LogWarning(
          "model '%s': asynchronous updates on the cpu backend (the GPU backend has none "
          "yet)",
          o.model_id);
      return cpu(o, std::move(v));
    }
    absl::StatusOr<std::unique_ptr<UpdateBackend>> made = MakeGpuBackend(gpu, o, v);
    if (absl::IsUnimplemented(made.status())) {
      LogWarning("model '%s' on the cpu backend: %s", o.model_id,
                 std::string(made.status().message()));
      return cpu(o, std::move(v));
    }
    return made;
  };
}

PeriodicCheckpointOptions ShardServiceImpl::CheckpointOptionsFor(
    const std::string& model_id) const {
  PeriodicCheckpointOptions c;
  if (!options_.checkpoint_dir.empty() && options_.checkpoint_every > 0) {
    c.model_root = JoinPath(options_.checkpoint_dir, model_id);
  }
  c.every = options_.checkpoint_every;
  c.keep = options_.checkpoint_keep;
  c.shard_index = options_.shard_index;
  c.shard_count = options_.shard_count;
  c.env = options_.file_env;
  c.metrics = &metrics_;
  return c;
}

grpc::Status ShardServiceImpl::RegisterModel(grpc::ServerContext* context,
                                             grpc::ServerReader<v1::RegisterModelRequest>* reader,
                                             v1::RegisterModelResponse* response) {
  if (absl::Status s = Authorize(*context, Access::kWrite); !s.ok()) return Error(s);
  CallScope call(this);
  if (!call.admitted().ok()) return Error(call.admitted());
  StreamWatchdog::Watch watch(&watchdog_, context);
  v1::RegisterModelRequest request;
  if (!reader->Read(&request) || !request.has_header()) {
    return Error(absl::InvalidArgumentError("RegisterModel must start with a header"));
  }
  const v1::RegisterHeader header = request.header();
  v1::ModelConfig config = header.config();
  // Before any message names it.
  if (absl::Status s = CheckId("model_id", config.model_id()); !s.ok()) return Error(s);
  if (absl::Status s = CheckModelIdFitsCheckpointRoot(config.model_id()); !s.ok()) {
    return Error(s);
  }
  if (!header.run_id().empty()) {
    if (absl::Status s = CheckId("run_id", header.run_id()); !s.ok()) return Error(s);
  }
  if (absl::Status s = CheckShardIndex(header.shard_index()); !s.ok()) return Error(s);
  if (config.shard_count() != options_.shard_count) {
    return Error(absl::FailedPreconditionError(
        absl::StrCat("model '", config.model_id(), "' is split into ", config.shard_count(),
                     " shards but this server is one of ", options_.shard_count)));
  }
  // Validated once, here: everything below works with the canonical plan.
  absl::StatusOr<ShardPlan> plan = PlanHere(std::move(config));
  if (!plan.ok()) return Error(plan.status());
  config = plan->config;
  const ModelLayout& layout = plan->options.layout;

  // An existing model: equal configs attach, different ones are refused,
  // naming what differs.
  auto answer_existing = [&](const HostedModel& model) {
    if (!google::protobuf::util::MessageDifferencer::Equals(model.config(), config)) {
      return Error(absl::FailedPreconditionError(
          absl::StrCat("model '", config.model_id(), "' is already registered on shard ",
                       options_.shard_index, " with a different config: ",
                       DescribeDifferences(model.config(), config, "registered", "this trainer"))));
    }
    response->set_created(false);
    SetAttachInfo(model.shard(), response);
    SetRange(model.shard().range(), response->mutable_range());
    return grpc::Status::OK;
  };
  if (absl::StatusOr<std::shared_ptr<HostedModel>> existing = models_.Find(config.model_id());
      existing.ok()) {
    return answer_existing(**existing);
  }
  if (header.attach_only()) {
    return Error(absl::NotFoundError(absl::StrCat("model '", config.model_id(),
                                                  "' is not registered on shard ",
                                                  options_.shard_index, " yet")));
  }

  plan->options.run_id = header.run_id();
  if (absl::Status s = CheckCheckpointRoot(config.model_id(), -1, header.run_id()); !s.ok()) {
    // Checkpoints of this very run, committed by the other shards after this
    // one came back empty, are restored (see RestoreCommittedOfRun). The
    // stream is not read again: a long restore is no stalled client.
    watch.Stop();
    absl::StatusOr<bool> restored = RestoreCommittedOfRun(config.model_id(), header.run_id());
    if (!restored.ok()) return Error(restored.status());
    if (!*restored) return Error(s);
    absl::StatusOr<std::shared_ptr<HostedModel>> model = models_.Find(config.model_id());
    if (!model.ok()) return Error(model.status());
    return answer_existing(**model);
  }

  const uint64_t size = layout.ShardSize(options_.shard_index);
  // Reserved before allocating anything, so an absurd layout cannot take the
  // server down.
  absl::StatusOr<StateBudget::Reservation> reservation =
      budget_.Reserve(config.model_id(), StateBytes(*plan));
  if (!reservation.ok()) return Error(reservation.status());
  std::vector<float> values(size);
  uint64_t received = 0;
  while (reader->Read(&request)) {
    if (!request.has_values()) {
      return Error(absl::InvalidArgumentError(request.has_header()
                                                  ? "RegisterModel sent a second header"
                                                  : "RegisterModel sent a message without values"));
    }
    const v1::TensorChunk& chunk = request.values();
    const std::string& data = chunk.data();
    // (Empty ones would keep a stalled stream, and the state budget it
    // reserved, alive past the idle watchdog.)
    if (data.empty()) {
      return Error(absl::InvalidArgumentError(
          absl::StrCat("RegisterModel sent an empty chunk at element ", chunk.offset())));
    }
    watch.Touch();
    if (data.size() % sizeof(float) != 0 || chunk.offset() != received ||
        data.size() / sizeof(float) > size - received) {
      return Error(absl::InvalidArgumentError(absl::StrCat(
          "initial-value chunk at element ", chunk.offset(), " with ", data.size(),
          " bytes does not continue the ", received, " of ", size, " elements received")));
    }
    std::memcpy(values.data() + received, data.data(), data.size());
    received += data.size() / sizeof(float);
  }
  if (context->IsCancelled()) return grpc::Status(grpc::CANCELLED, "client cancelled");
  if (received != size) {
    return Error(absl::InvalidArgumentError(absl::StrCat(
        "RegisterModel sent ", received, " of the ", size, " initial values of the range")));
  }
  // Here and not in ModelShard::Create: a checkpoint written before this
  // rule may hold anything there, and must still restore.
  const FlatRange range = layout.ShardRange(options_.shard_index);
  if (std::optional<uint64_t> bad =
          FindNonZeroPadding(layout, range, values.data(), DType::kFloat32)) {
    return Error(absl::InvalidArgumentError(
        absl::StrCat("initial value of ", layout.DescribeElement(*bad), " is ",
                     values[*bad - range.begin], ": padding must hold zeros")));
  }
  absl::StatusOr<std::unique_ptr<ModelShard>> shard =
      ModelShard::Create(plan->options, std::move(values), BackendFactory());
  if (!shard.ok()) return Error(shard.status());

  auto model = std::make_shared<HostedModel>(config, std::move(*shard), std::move(*reservation),
                                             CheckpointOptionsFor(config.model_id()));
  std::shared_ptr<HostedModel> installed = models_.Install(model);
  if (installed == nullptr) {
    return Error(absl::UnavailableError("the shard server is shutting down"));
  }
  // Lost a race with a concurrent registration of the same model (which
  // then gives its reservation back with it).
  if (installed != model) return answer_existing(*installed);
  LogInfo("registered model '%s': %d tensors, %d trainers, %s, range [%d, %d) on %s",
          config.model_id(), layout.tensors().size(), config.num_trainers(),
          plan->options.optimizer.DebugString(), model->shard().range().begin,
          model->shard().range().end, model->shard().device());
  if (const std::string note = layout.DescribeImbalance(); !note.empty()) {
    LogWarning("model '%s': %s", config.model_id(), note);
  }
  response->set_created(true);
  SetAttachInfo(model->shard(), response);
  SetRange(model->shard().range(), response->mutable_range());
  return grpc::Status::OK;
}

}  // namespace shardopt
