#include "server/shard_service.h"

#include <dirent.h>
#include <errno.h>
#include <google/protobuf/util/message_differencer.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/proto_convert.h"
#include "server/checkpointing.h"
#include "server/device_support.h"

namespace shardopt {
namespace {

constexpr uint32_t kDefaultSliceLength = 8;
constexpr uint32_t kMaxSliceLength = 4096;

grpc::Status Error(const absl::Status& status) { return ToGrpcStatus(status); }

void SetRange(const FlatRange& range, v1::ShardRange* proto) {
  proto->set_begin(range.begin);
  proto->set_end(range.end);
}

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

void FillByteCounts(const ShardSnapshot& snap, v1::ByteCounts* bytes) {
  bytes->set_parameter_bytes(snap.parameter_bytes);
  bytes->set_optimizer_state_bytes(snap.optimizer_state_bytes);
  bytes->set_staging_bytes(snap.staging_bytes);
  bytes->set_gradient_bytes_received(snap.gradient_bytes_received);
  bytes->set_parameter_bytes_sent(snap.parameter_bytes_sent);
}

v1::PushGradientsResponse::Outcome OutcomeToProto(PushOutcome outcome) {
  switch (outcome) {
    case PushOutcome::kAccepted:
      return v1::PushGradientsResponse::OUTCOME_ACCEPTED;
    case PushOutcome::kApplied:
      return v1::PushGradientsResponse::OUTCOME_APPLIED;
    case PushOutcome::kDuplicate:
      return v1::PushGradientsResponse::OUTCOME_DUPLICATE;
    case PushOutcome::kAlreadyApplied:
      return v1::PushGradientsResponse::OUTCOME_ALREADY_APPLIED;
    case PushOutcome::kAwaitingDecision:
      return v1::PushGradientsResponse::OUTCOME_AWAITING_DECISION;
  }
  return v1::PushGradientsResponse::OUTCOME_UNSPECIFIED;
}

void FillPushResponse(const PushResult& result, v1::PushGradientsResponse* response) {
  response->set_outcome(OutcomeToProto(result.outcome));
  response->set_step(result.step);
  response->set_version(result.version);
  response->set_trainers_pending(result.trainers_pending);
}

}  // namespace

ShardServiceImpl::ShardServiceImpl(const ShardServerOptions& options)
    : options_(options),
      start_time_(absl::Now()),
      pool_(options.threads),
      watchdog_(options.stream_idle_timeout) {}

ShardServiceImpl::~ShardServiceImpl() {
  Shutdown();
  std::vector<std::shared_ptr<Model>> models;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, model] : models_) models.push_back(model);
  }
  for (auto& model : models) {
    if (model->checkpointer.joinable()) model->checkpointer.join();
  }
}

void ShardServiceImpl::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  for (auto& [id, model] : models_) model->shard->Shutdown();
}

bool ShardServiceImpl::WaitForIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithDeadline(
      absl::Condition(
          +[](int* in_flight) { return *in_flight == 0; }, &calls_in_flight_),
      deadline);
}

ShardServiceImpl::CallScope::CallScope(ShardServiceImpl* service) : service_(service) {
  absl::MutexLock lock(&service_->mu_);
  if (service_->shutdown_) {
    admitted_ = absl::UnavailableError("the shard server is shutting down");
  }
  ++service_->calls_in_flight_;
}

ShardServiceImpl::CallScope::~CallScope() {
  absl::MutexLock lock(&service_->mu_);
  --service_->calls_in_flight_;
}

absl::Status ShardServiceImpl::CheckShardIndex(uint32_t shard_index) const {
  if (shard_index != options_.shard_index) {
    return absl::FailedPreconditionError(absl::StrCat("request meant for shard ", shard_index,
                                                      " reached shard ", options_.shard_index,
                                                      " (of ", options_.shard_count, ")"));
  }
  return absl::OkStatus();
}

uint64_t ShardServiceImpl::StateBytes(const ShardPlan& plan) const {
  // On a GPU the first bf16 pull makes a bf16 copy of the parameters (see
  // GpuBackend): reserved up front, so it cannot take the GPU past the
  // budget later.
  const uint64_t bf16_copy =
      options_.gpu_index >= 0 ? plan.options.layout.shard_size() * sizeof(uint16_t) : 0;
  return plan.state_bytes + bf16_copy;
}

absl::Status ShardServiceImpl::ReserveStateBytes(const std::string& model_id, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (bytes > options_.max_state_bytes - reserved_state_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("model '", model_id, "' needs ", bytes, " bytes of state on shard ",
                     options_.shard_index, "; ", options_.max_state_bytes - reserved_state_bytes_,
                     " of ", options_.max_state_bytes, " are free (--max_state_mib)"));
  }
  reserved_state_bytes_ += bytes;
  return absl::OkStatus();
}

void ShardServiceImpl::ReleaseStateBytes(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  reserved_state_bytes_ -= bytes;
}

absl::StatusOr<std::shared_ptr<ShardServiceImpl::Model>> ShardServiceImpl::FindModel(
    const std::string& model_id) {
  absl::MutexLock lock(&mu_);
  auto it = models_.find(model_id);
  if (it == models_.end()) {
    return absl::NotFoundError(
        absl::StrCat("model '", model_id, "' is not registered on shard ", options_.shard_index));
  }
  return it->second;
}

grpc::Status ShardServiceImpl::RegisterModel(grpc::ServerContext* context,
                                             grpc::ServerReader<v1::RegisterModelRequest>* reader,
                                             v1::RegisterModelResponse* response) {
  CallScope call(this);
  if (!call.admitted().ok()) return Error(call.admitted());
  StreamWatchdog::Watch watch(&watchdog_, context);
  v1::RegisterModelRequest request;
  if (!reader->Read(&request) || !request.has_header()) {
    return Error(absl::InvalidArgumentError("RegisterModel must start with a header"));
  }
  const v1::RegisterHeader header = request.header();
  v1::ModelConfig config = header.config();
  if (config.model_id().empty()) {
    return Error(absl::InvalidArgumentError("model_id is empty"));
  }
  if (absl::Status s = CheckShardIndex(header.shard_index()); !s.ok()) return Error(s);
  if (config.shard_count() != options_.shard_count) {
    return Error(absl::FailedPreconditionError(
        absl::StrCat("model '", config.model_id(), "' is split into ", config.shard_count(),
                     " shards but this server is one of ", options_.shard_count)));
  }
  absl::StatusOr<ShardPlan> plan =
      PlanShard(std::move(config), options_.shard_index, options_.shard_count);
  if (!plan.ok()) return Error(plan.status());
  config = plan->config;
  const ModelLayout& layout = plan->options.layout;

  // An existing model: equal configs attach, different ones are refused.
  auto answer_existing = [&](const Model& model) {
    if (!google::protobuf::util::MessageDifferencer::Equals(model.config, config)) {
      return Error(absl::FailedPreconditionError(
          absl::StrCat("model '", config.model_id(), "' is already registered on shard ",
                       options_.shard_index, " with a different config")));
    }
    response->set_created(false);
    SetAttachInfo(*model.shard, response);
    SetRange(model.shard->range(), response->mutable_range());
    return grpc::Status::OK;
  };
  if (absl::StatusOr<std::shared_ptr<Model>> existing = FindModel(config.model_id());
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
    return Error(s);
  }

  const uint64_t size = layout.shard_size();
  // Checked before allocating anything, so an absurd layout cannot take the
  // server down.
  const uint64_t state_bytes = StateBytes(*plan);
  if (absl::Status s = ReserveStateBytes(config.model_id(), state_bytes); !s.ok()) {
    return Error(s);
  }
  bool keep_reservation = false;
  absl::Cleanup release = [&] {
    if (!keep_reservation) ReleaseStateBytes(state_bytes);
  };
  std::vector<float> values(size);
  uint64_t received = 0;
  while (reader->Read(&request)) {
    watch.Touch();
    if (!request.has_values()) {
      return Error(absl::InvalidArgumentError(request.has_header()
                                                  ? "RegisterModel sent a second header"
                                                  : "RegisterModel sent a message without values"));
    }
    const v1::TensorChunk& chunk = request.values();
    const std::string& data = chunk.data();
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
  absl::StatusOr<std::unique_ptr<ModelShard>> shard =
      ModelShard::Create(plan->options, std::move(values), BackendFactory());
  if (!shard.ok()) return Error(shard.status());

  auto model = std::make_shared<Model>();
  model->config = config;
  model->shard = std::move(*shard);
  std::shared_ptr<Model> installed = Install(model);
  if (installed == nullptr)
    return Error(absl::UnavailableError("the shard server is shutting down"));
  // Lost a race with a concurrent registration of the same model.
  if (installed != model) return answer_existing(*installed);
  keep_reservation = true;
  LogInfo("registered model '%s': %d tensors, %d trainers, %s, range [%d, %d) on %s",
          config.model_id(), layout.tensors().size(), config.num_trainers(),
          plan->options.optimizer.DebugString(), model->shard->range().begin,
          model->shard->range().end, model->shard->device());
  response->set_created(true);
  SetAttachInfo(*model->shard, response);
  SetRange(model->shard->range(), response->mutable_range());
  return grpc::Status::OK;
}

grpc::Status ShardServiceImpl::PushGradients(grpc::ServerContext* context,
                                             grpc::ServerReader<v1::PushGradientsRequest>* reader,
                                             v1::PushGradientsResponse* response) {
  CallScope call(this);
  if (!call.admitted().ok()) return Error(call.admitted());
  StreamWatchdog::Watch watch(&watchdog_, context);
  v1::PushGradientsRequest request;
  if (!reader->Read(&request) || !request.has_header()) {
    return Error(absl::InvalidArgumentError("PushGradients must start with a header"));
  }
  const v1::PushHeader header = request.header();
  absl::StatusOr<std::shared_ptr<Model>> model = FindModel(header.model_id());
  if (!model.ok()) return Error(model.status());
  if (absl::Status s = CheckShardIndex(header.shard_index()); !s.ok()) return Error(s);
  absl::StatusOr<DType> dtype = DTypeFromProto(header.dtype());
  if (!dtype.ok()) return Error(dtype.status());
  ModelShard& shard = *(*model)->shard;
  absl::StatusOr<ModelShard::PushStart> start =
      shard.BeginPush(header.trainer_rank(), header.step(), header.num_elements(), *dtype,
                      header.loss_scale() == 0 ? 1.0 : header.loss_scale());
  if (!start.ok()) return Error(start.status());
  if (start->immediate) {
    FillPushResponse(*start->immediate, response);
    return grpc::Status::OK;
  }
  ModelShard::PushWriter& writer = *start->writer;
  while (reader->Read(&request)) {
    watch.Touch();
    if (!request.has_chunk()) {
      return Error(absl::InvalidArgumentError(
          request.has_header() ? "PushGradients sent a second header"
                               : "PushGradients sent a message without a chunk"));
    }
    const v1::TensorChunk& chunk = request.chunk();
    if (absl::Status s = writer.Write(chunk.offset(), chunk.data().data(), chunk.data().size());
        !s.ok()) {
      return Error(s);
    }
  }
  if (context->IsCancelled()) {
    return grpc::Status(grpc::CANCELLED, "push cancelled by the client; nothing was staged");
  }
  absl::StatusOr<PushResult> result = writer.Commit();
  if (!result.ok()) return Error(result.status());
  FillPushResponse(*result, response);
  return grpc::Status::OK;
}

grpc::Status ShardServiceImpl::PullParameters(
    grpc::ServerContext* context, const v1::PullParametersRequest* request,
    grpc::ServerWriter<v1::PullParametersResponse>* writer) {
  CallScope call(this);
  if (!call.admitted().ok()) return Error(call.admitted());
  absl::StatusOr<std::shared_ptr<Model>> model = FindModel(request->model_id());
  if (!model.ok()) return Error(model.status());
  if (absl::Status s = CheckShardIndex(request->shard_index()); !s.ok()) return Error(s);
  absl::StatusOr<DType> dtype = DTypeFromProto(request->dtype());
  if (!dtype.ok()) return Error(dtype.status());
  if (request->min_version() < 0) {
    return Error(absl::InvalidArgumentError("min_version is negative"));
  }
  ModelShard& shard = *(*model)->shard;
  if (request->pushed_step() > 0) {
    if (absl::Status s = shard.CheckHoldsPush(request->trainer_rank(), request->pushed_step());
        !s.ok()) {
      return Error(s);
    }
  }
  if (request->has_decision()) {
    const v1::StepDecision& d = request->decision();
    if (absl::Status s =
            shard.Decide(request->min_version(), {d.skip(), d.clip_coef(), d.grad_norm()});
        !s.ok()) {
      return Error(s);
    }
  }
  const absl::Time deadline = absl::FromChrono(context->deadline());
  absl::StatusOr<int64_t> version = shard.WaitForVersion(
      request->min_version(), deadline, [context] { return context->IsCancelled(); });
  if (!version.ok()) return Error(version.status());

  const size_t element = DTypeSize(*dtype);
  const uint64_t chunk_elements = std::max<uint64_t>(1, options_.pull_chunk_bytes / element);
  v1::PullParametersResponse response;
  response.set_version(*version);
  response.set_lr(shard.LrOfVersion(*version));
  for (uint64_t offset = 0; offset < shard.size(); offset += chunk_elements) {
    const uint64_t count = std::min(chunk_elements, shard.size() - offset);
    v1::TensorChunk* chunk = response.mutable_chunk();
    chunk->set_offset(offset);
    std::string* data = chunk->mutable_data();
    data->resize(count * element);
    absl::Status read = shard.ReadParameters(*version, offset, count, *dtype, data->data());
    if (!read.ok()) return Error(read);
    if (!writer->Write(response)) {
      return grpc::Status(grpc::CANCELLED, "client went away during the pull");
    }
  }
  return grpc::Status::OK;
}

grpc::Status ShardServiceImpl::GetStepStats(grpc::ServerContext* context,
                                            const v1::GetStepStatsRequest* request,
                                            v1::StepStats* response) {
  CallScope call(this);
  if (!call.admitted().ok()) return Error(call.admitted());
  absl::StatusOr<std::shared_ptr<Model>> model = FindModel(request->model_id());
  if (!model.ok()) return Error(model.status());
  if (absl::Status s = CheckShardIndex(request->shard_index()); !s.ok()) return Error(s);
  if (request->pushed_step() > 0) {
    if (absl::Status s =
            (*model)->shard->CheckHoldsPush(request->trainer_rank(), request->pushed_step());
        !s.ok()) {
      return Error(s);
    }
  }
  absl::StatusOr<StepStats> stats =
      (*model)->shard->WaitForStepStats(request->step(), absl::FromChrono(context->deadline()),
                                        [context] { return context->IsCancelled(); });
  if (!stats.ok()) return Error(stats.status());
  response->set_step(stats->step);
  response->set_sum_of_squares(stats->sum_of_squares);
  response->set_found_inf(stats->found_inf);
  response->set_loss_scale(stats->loss_scale);
  return grpc::Status::OK;
}

grpc::Status ShardServiceImpl::SetHyperparameters(grpc::ServerContext* context,
                                                  const v1::SetHyperparametersRequest* request,
                                                  v1::SetHyperparametersResponse* response) {
  absl::StatusOr<std::shared_ptr<Model>> model = FindModel(request->model_id());
  if (!model.ok()) return Error(model.status());
  if (request->cancel()) {
    ModelShard& shard = *(*model)->shard;
    if (absl::Status s = shard.CancelHyperparameters(request->effective_step()); !s.ok()) {
      return Error(s);
    }
    response->set_effective_step(request->effective_step());
    response->set_version(shard.version());
    return grpc::Status::OK;
  }
  absl::StatusOr<OptimizerConfig> optimizer = OptimizerConfigFromProto(request->optimizer());
  if (!optimizer.ok()) return Error(optimizer.status());
  absl::StatusOr<LrSchedule> schedule = LrScheduleFromProto(request->lr_schedule());
  if (!schedule.ok()) return Error(schedule.status());
  ModelShard& shard = *(*model)->shard;
  if (absl::Status s = shard.SetHyperparameters(request->effective_step(), {*optimizer, *schedule});
      !s.ok()) {
    return Error(s);
  }
  LogInfo("model '%s': from step %d: %s, lr schedule %s", request->model_id(),
          request->effective_step(), optimizer->DebugString(), schedule->DebugString());
  response->set_effective_step(request->effective_step());
  response->set_version(shard.version());
  return grpc::Status::OK;
}

grpc::Status ShardServiceImpl::Inspect(grpc::ServerContext* context,
                                       const v1::InspectRequest* request,
                                       v1::InspectResponse* response) {
  absl::StatusOr<std::shared_ptr<Model>> model = FindModel(request->model_id());
  if (!model.ok()) return Error(model.status());
  ModelShard& shard = *(*model)->shard;
  uint32_t length = request->slice_length() == 0 ? kDefaultSliceLength : request->slice_length();
  length = std::min(length, kMaxSliceLength);
  absl::StatusOr<ShardSnapshot> snap =
      shard.Snapshot(request->tensor_name(), request->slice_offset(), length,
                     /*with_tensor_stats=*/true);
  if (!snap.ok()) return Error(snap.status());

  const v1::ModelConfig& config = (*model)->config;
  response->set_model_id(config.model_id());
  response->set_shard_index(options_.shard_index);
  response->set_shard_count(options_.shard_count);
  SetRange(shard.range(), response->mutable_range());
  response->set_version(snap->version);
  response->set_next_step(snap->version + 1);
  response->set_num_trainers(config.num_trainers());
  for (uint32_t r : snap->trainers_pushed) response->add_trainers_pushed(r);
  *response->mutable_optimizer() = config.optimizer();
  response->set_reduction(config.reduction());
  for (const TensorPieceStats& t : snap->tensors) {
    const TensorPlacement& placement = shard.layout().tensors()[t.piece.tensor_index];
    v1::TensorStats* stats = response->add_tensors();
    stats->set_name(placement.spec.name);
    for (int64_t d : placement.spec.shape) stats->add_shape(d);
    stats->set_tensor_offset(t.piece.tensor_offset);
    stats->set_num_elements(t.piece.size);
    stats->set_l2_norm(t.l2_norm);
    stats->set_min(t.min);
    stats->set_max(t.max);
    stats->set_mean(t.mean);
  }
  response->set_slice_offset(request->slice_offset());
  for (float v : snap->values) response->add_values(v);
  FillByteCounts(*snap, response->mutable_bytes());
  *response->mutable_layout() = config.layout();
  *response->mutable_current_optimizer() = OptimizerConfigToProto(snap->current.optimizer);
  *response->mutable_lr_schedule() = LrScheduleToProto(snap->current.lr_schedule);
  response->set_last_lr(snap->last_lr);
  for (int64_t step : snap->scheduled_changes) response->add_scheduled_changes(step);
  *response->mutable_gradient_control() = config.gradient_control();
  response->set_last_decided_step(snap->last_step.step);
  response->mutable_last_decision()->set_skip(snap->last_step.decision.skip);
  response->mutable_last_decision()->set_clip_coef(snap->last_step.decision.clip_coef);
  response->mutable_last_decision()->set_grad_norm(snap->last_step.decision.grad_norm);
  response->set_last_loss_scale(snap->last_step.loss_scale);
  response->set_optimizer_steps(snap->optimizer_steps);
  response->set_skipped_steps(snap->skipped_steps);
  return grpc::Status::OK;
}

grpc::Status ShardServiceImpl::GetServerInfo(grpc::ServerContext* context,
                                             const v1::GetServerInfoRequest* request,
                                             v1::ServerInfo* response) {
  response->set_shard_index(options_.shard_index);
  response->set_shard_count(options_.shard_count);
  response->set_device(options_.gpu_index < 0 ? "cpu" : absl::StrCat("cuda:", options_.gpu_index));
  response->set_threads(pool_.threads());
  response->set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - start_time_));
  std::vector<std::shared_ptr<Model>> models;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, model] : models_) models.push_back(model);
  }
  for (const std::shared_ptr<Model>& model : models) {
    v1::ModelSummary* summary = response->add_models();
    summary->set_model_id(model->config.model_id());
    summary->set_num_trainers(model->config.num_trainers());
    summary->set_optimizer(OptimizerKindName(model->shard->options().optimizer.kind));
    SetRange(model->shard->range(), summary->mutable_range());
    absl::StatusOr<ShardSnapshot> snap =
        model->shard->Snapshot("", 0, 0, /*with_tensor_stats=*/false);
    if (snap.ok()) {
      summary->set_version(snap->version);
      FillByteCounts(*snap, summary->mutable_bytes());
    }
  }
  return grpc::Status::OK;
}

ModelShard::BackendFactory ShardServiceImpl::BackendFactory() {
  if (options_.gpu_index < 0) return ModelShard::CpuBackendFactory(&pool_);
  return [gpu = options_.gpu_index](const ModelShardOptions& o, std::vector<float> v) {
    return MakeGpuBackend(gpu, o, std::move(v));
  };
}

std::shared_ptr<ShardServiceImpl::Model> ShardServiceImpl::Install(std::shared_ptr<Model> model) {
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_) return nullptr;
    auto [it, inserted] = models_.emplace(model->config.model_id(), model);
    if (!inserted) return it->second;
    if (!options_.checkpoint_dir.empty() && options_.checkpoint_every > 0) {
      // Started under mu_, so that the destructor's join sees it.
      model->checkpointer = std::thread([this, raw = model.get()] { RunCheckpointer(raw); });
    }
  }
  return model;
}

void ShardServiceImpl::RunCheckpointer(Model* model) {
  ModelShard& shard = *model->shard;
  const int64_t every = options_.checkpoint_every;
  const std::string root = absl::StrCat(options_.checkpoint_dir, "/", model->config.model_id());
  auto stopping = [this] {
    absl::MutexLock lock(&mu_);
    return shutdown_;
  };
  // The first multiple of `every` not yet applied (the current version
  // counts: a restored shard finds that checkpoint already there). Each
  // checkpoint takes the next one's hold before releasing its own, so that
  // no step boundary slips past between two of them.
  int64_t next = (shard.version() + every - 1) / every * every;
  shard.HoldStep(next);
  while (!stopping()) {
    const std::string dir = absl::StrCat(root, "/", CheckpointStepDirName(next));
    CheckpointHolds holds;
    holds.already_held = true;
    holds.hold_next = next + every;
    absl::StatusOr<CheckpointPartWritten> written =
        SaveCheckpoint(shard, model->config, dir, next, absl::InfiniteFuture(), stopping, holds,
                       options_.file_env);
    if (written.ok()) {
      if (written->bytes > 0) {
        LogInfo("model '%s': saved step %d to %s (%d bytes)%s", model->config.model_id(), next,
                written->data_file, written->bytes,
                written->committed ? "; checkpoint committed" : "");
      }
      if (options_.checkpoint_keep > 0) {
        absl::StatusOr<int> pruned = PruneCheckpoints(root, options_.shard_index,
                                                      options_.checkpoint_keep, options_.file_env);
        if (!pruned.ok()) {
          LogError("model '%s': removing old checkpoints: %s", model->config.model_id(),
                   pruned.status().ToString());
        }
      }
    } else if (stopping() || absl::IsUnavailable(written.status()) ||
               absl::IsCancelled(written.status())) {
      return;
    } else {
      // A full or failing disk must not end checkpointing for good: log,
      // wait a little (bounded by shutdown), and go on with the next one.
      LogError("model '%s': checkpoint of step %d failed: %s", model->config.model_id(), next,
               written.status().ToString());
      for (int i = 0; i < 10 && !stopping(); ++i) absl::SleepFor(absl::Milliseconds(100));
    }
    next += every;
  }
}

grpc::Status ShardServiceImpl::Checkpoint(grpc::ServerContext* context,
                                          const v1::CheckpointRequest* request,
                                          v1::CheckpointResponse* response) {
  CallScope call(this);
  if (!call.admitted().ok()) return Error(call.admitted());
  absl::StatusOr<std::shared_ptr<Model>> model = FindModel(request->model_id());
  if (!model.ok()) return Error(model.status());
  if (absl::Status s = CheckShardIndex(request->shard_index()); !s.ok()) return Error(s);
  if (request->directory().empty()) {
    return Error(absl::InvalidArgumentError("directory is empty"));
  }
  if (request->step() < -1) {
    return Error(absl::InvalidArgumentError(
        absl::StrCat("step ", request->step(), ": give a version, or -1 for the current one")));
  }
  ModelShard& shard = *(*model)->shard;
  const int64_t step = request->step() == -1 ? shard.version() : request->step();
  absl::StatusOr<CheckpointPartWritten> written = SaveCheckpoint(
      shard, (*model)->config, request->directory(), step, absl::FromChrono(context->deadline()),
      [context] { return context->IsCancelled(); }, CheckpointHolds(), options_.file_env);
  if (!written.ok()) return Error(written.status());
  LogInfo("model '%s': checkpoint of step %d: %s%s", request->model_id(), step, written->data_file,
          written->committed ? " (committed the manifest)" : "");
  response->set_step(step);
  response->set_part_file(written->data_file);
  response->set_bytes_written(written->bytes);
  response->set_committed(written->committed);
  response->set_manifest(written->manifest);
  return grpc::Status::OK;
}

absl::Status ShardServiceImpl::RestoreModel(const std::string& checkpoint_dir) {
  absl::StatusOr<std::unique_ptr<CheckpointReader>> checkpoint =
      CheckpointReader::Open(checkpoint_dir);
  if (!checkpoint.ok()) return checkpoint.status();
  absl::StatusOr<ShardPlan> plan =
      PlanShard((*checkpoint)->manifest().config(), options_.shard_index, options_.shard_count);
  if (!plan.ok()) {
    return absl::DataLossError(absl::StrCat(
        checkpoint_dir, ": the saved model config is unusable: ", plan.status().message()));
  }
  if (absl::Status s = CheckCheckpointRoot(plan->config.model_id(), (*checkpoint)->step(),
                                           (*checkpoint)->manifest().parts(0).progress().run_id());
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ReserveStateBytes(plan->config.model_id(), StateBytes(*plan)); !s.ok()) {
    return s;
  }
  absl::StatusOr<std::unique_ptr<ModelShard>> shard =
      RestoreShard(**checkpoint, *plan, BackendFactory());
  if (!shard.ok()) {
    ReleaseStateBytes(StateBytes(*plan));
    return shard.status();
  }
  auto model = std::make_shared<Model>();
  model->config = plan->config;
  model->shard = std::move(*shard);
  if (std::shared_ptr<Model> installed = Install(model); installed != model) {
    ReleaseStateBytes(plan->state_bytes);
    if (installed == nullptr) return absl::UnavailableError("the shard server is shutting down");
    return absl::AlreadyExistsError(
        absl::StrCat("model '", plan->config.model_id(), "' is restored twice"));
  }
  LogInfo("restored model '%s' at version %d from %s (written by %d shards), range [%d, %d)",
          plan->config.model_id(), model->shard->version(), checkpoint_dir,
          (*checkpoint)->manifest().config().shard_count(), model->shard->range().begin,
          model->shard->range().end);
  return absl::OkStatus();
}

absl::Status ShardServiceImpl::CheckCheckpointRoot(const std::string& model_id, int64_t version,
                                                   const std::string& run_id) {
  if (options_.checkpoint_dir.empty() || options_.checkpoint_every <= 0) return absl::OkStatus();
  const std::string root = absl::StrCat(options_.checkpoint_dir, "/", model_id);
  absl::StatusOr<std::string> latest = FindLatestCheckpoint(root);
  if (absl::IsNotFound(latest.status())) return absl::OkStatus();
  if (!latest.ok()) return latest.status();
  absl::StatusOr<std::unique_ptr<CheckpointReader>> checkpoint = CheckpointReader::Open(*latest);
  if (!checkpoint.ok()) return checkpoint.status();
  const int64_t step = (*checkpoint)->step();
  const std::string& saved_run = (*checkpoint)->manifest().parts(0).progress().run_id();
  // Periodic checkpoints of two runs (or of a run and its rollback) in one
  // directory would be taken for each other after a restart.
  if (version < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--checkpoint_dir already holds checkpoints of model '", model_id,
                     "' (latest: step ", step, " in ", *latest,
                     "): restore it with --restore_from, or give this new run "
                     "another --checkpoint_dir"));
  }
  if (step > version || saved_run != run_id) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--checkpoint_dir holds a checkpoint of model '", model_id, "' ",
        step > version
            ? absl::StrCat("later than the restored step ", version, " (step ", step, ")")
            : "of another training run",
        " in ", *latest, ": restoring here would mix the two; use another --checkpoint_dir"));
  }
  return absl::OkStatus();
}

absl::Status ShardServiceImpl::RestoreFrom(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 && errno == ENOENT) {
    // The first start of a job whose restarts use the same command line.
    LogInfo("%s does not exist yet: nothing to restore", path);
    return absl::OkStatus();
  }
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a directory"));
  }
  if (::stat(absl::StrCat(path, "/", kCheckpointManifestFile).c_str(), &st) == 0) {
    return RestoreModel(path);
  }
  std::vector<std::string> model_dirs;
  bool has_parts = false, has_steps = false;
  if (DIR* d = ::opendir(path.c_str())) {
    while (const dirent* entry = ::readdir(d)) {
      const std::string name = entry->d_name;
      if (name == "." || name == "..") continue;
      has_parts = has_parts || absl::StartsWith(name, "shard-");
      has_steps = has_steps || absl::StartsWith(name, "step-");
      const std::string dir = absl::StrCat(path, "/", name);
      if (::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) model_dirs.push_back(dir);
    }
    ::closedir(d);
  }
  if (has_parts) {
    // A checkpoint directory some shard never finished: refuse, never load in part.
    return CheckpointReader::Open(path).status();
  }
  if (has_steps) {
    // One model's directory of periodic checkpoints.
    absl::StatusOr<std::string> latest = FindLatestCheckpoint(path);
    if (!latest.ok()) return latest.status();
    return RestoreModel(*latest);
  }
  std::sort(model_dirs.begin(), model_dirs.end());
  for (const std::string& dir : model_dirs) {
    absl::StatusOr<std::string> latest = FindLatestCheckpoint(dir);
    if (absl::IsNotFound(latest.status())) {
      LogInfo("%s: no committed checkpoint; nothing to restore", dir);
      continue;
    }
    if (!latest.ok()) return latest.status();
    if (absl::Status s = RestoreModel(*latest); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace shardopt
