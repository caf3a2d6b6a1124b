// ShardServiceImpl: admission, and the calls of a step (register, push,
// pull; statistics and hyperparameters in shard_service_step_control.cc).
#include "server/shard_service.h"

#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "common/names.h"
#include "common/proto_convert.h"
#include "common/proto_difference.h"
#include "server/device_support.h"
#include "server/service_replies.h"

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

void FillPushResponse(const PushResult& result, const HostedModel& model,
                      v1::PushGradientsResponse* response) {
  response->set_outcome(OutcomeToProto(result.outcome));
  response->set_step(result.step);
  response->set_version(result.version);
  response->set_trainers_pending(result.trainers_pending);
  response->set_recovery_floor(model.recovery_floor());
  response->set_staleness(result.staleness);
  for (int64_t step : result.trainer_steps) response->add_trainer_steps(step);
}

}  // namespace

ShardServiceImpl::ShardServiceImpl(const ShardServerOptions& options)
    : options_(options),
      start_time_(absl::Now()),
      pool_(options.threads),
      watchdog_(options.stream_idle_timeout),
      budget_(options.max_state_bytes, options.shard_index),
      models_(options.shard_index) {
  if (options.shared_memory) {
    absl::StatusOr<std::unique_ptr<SharedMemoryHost>> host = SharedMemoryHost::Start();
    if (host.ok()) {
      shared_memory_ = *std::move(host);
    } else {
      LogWarning("shared memory is off (trainers use gRPC for payloads): %s",
                 host.status().ToString());
    }
  }
  if (options.payload_socket && options.tls_cert_pem.empty()) {
    absl::StatusOr<std::unique_ptr<PayloadSocketHost>> host =
        PayloadSocketHost::Start(options.payload_socket_host, options.payload_socket_port);
    if (host.ok()) {
      payload_sockets_ = *std::move(host);
    } else {
      LogWarning("no payload socket (trainers use gRPC streams for payloads): %s",
                 host.status().ToString());
    }
  }
  if (options.device_pairs != "off") {
    // (Checked by the flag's parser; a kind this machine cannot run leaves
    // the pairs off, with the reason in the log.)
    absl::StatusOr<const DevicePairKind*> kind = FindDevicePairKind(options.device_pairs);
    if (kind.ok()) {
      device_pairs_ = std::make_unique<DevicePairHost>(**kind, std::max(0, options.gpu_index));
    } else {
      LogWarning("no device pairs (trainers use other data planes): %s", kind.status().ToString());
    }
  }
}

ShardServiceImpl::~ShardServiceImpl() { Shutdown(); }

void ShardServiceImpl::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
  }
  models_.StopAll();
}

bool ShardServiceImpl::WaitForIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithDeadline(
      absl::Condition(
          +[](int* in_flight) { return *in_flight == 0; }, &calls_in_flight_),
      deadline);
}

bool ShardServiceImpl::shutting_down() const {
  absl::MutexLock lock(&mu_);
  return shutdown_;
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
      return Error(absl::FailedPreconditionError(absl::StrCat(
          "model '", config.model_id(), "' is already registered on shard ", options_.shard_index,
          " with a different config: ",
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
    return Error(s);
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

grpc::Status ShardServiceImpl::PushGradients(grpc::ServerContext* context,
                                             grpc::ServerReader<v1::PushGradientsRequest>* reader,
                                             v1::PushGradientsResponse* response) {
  if (absl::Status s = Authorize(*context, Access::kWrite); !s.ok()) return Error(s);
  std::string model_id;
  std::optional<uint32_t> rank;
  const grpc::Status status = ReceivePush(context, reader, response, &model_id, &rank);
  // Counted per trainer, so that a client posing as one (or a flaky link)
  // shows on the metrics page.
  if (rank) {
    if (status.ok()) {
      metrics_.RecordPush(
          model_id, *rank,
          absl::AsciiStrToLower(absl::StripPrefix(
              v1::PushGradientsResponse::Outcome_Name(response->outcome()), "OUTCOME_")));
    } else if (status.error_code() == grpc::StatusCode::CANCELLED) {
      metrics_.RecordPushAbandoned(model_id, *rank);
    } else {
      metrics_.RecordPushRefused(
          model_id, *rank,
          absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())));
    }
  }
  return status;
}

grpc::Status ShardServiceImpl::ReceivePush(grpc::ServerContext* context,
                                           grpc::ServerReader<v1::PushGradientsRequest>* reader,
                                           v1::PushGradientsResponse* response,
                                           std::string* model_id, std::optional<uint32_t>* rank) {
  CallScope call(this);
  if (!call.admitted().ok()) return Error(call.admitted());
  StreamWatchdog::Watch watch(&watchdog_, context);
  v1::PushGradientsRequest request;
  if (!reader->Read(&request) || !request.has_header()) {
    return Error(absl::InvalidArgumentError("PushGradients must start with a header"));
  }
  const v1::PushHeader header = request.header();
  // Taken first: a push refused before its payload was read closes the
  // link, so that the trainer's sending ends at once.
  std::optional<PayloadSocketHost::Lease> link;
  const bool device_pair = header.has_device_pair();
  if (device_pair && (header.has_socket_payload() || header.has_shared_memory())) {
    return Error(absl::InvalidArgumentError(
        "PushGradients names a device pair and another place for its payload"));
  }
  if (header.has_socket_payload()) {
    absl::StatusOr<PayloadSocketHost::Lease> lease = AcquireLink(header.socket_payload());
    if (!lease.ok()) return Error(lease.status());
    link.emplace(*std::move(lease));
    if (header.has_shared_memory()) {
      return Error(absl::InvalidArgumentError(
          "PushGradients names a shared-memory payload and a payload socket"));
    }
  }
  absl::StatusOr<std::shared_ptr<HostedModel>> model = models_.Find(header.model_id());
  if (!model.ok()) return Error(model.status());
  if (header.trainer_rank() < (*model)->config().num_trainers()) {
    *model_id = header.model_id();
    *rank = header.trainer_rank();
  }
  if (absl::Status s = CheckShardIndex(header.shard_index()); !s.ok()) return Error(s);
  absl::StatusOr<DType> dtype = DTypeFromProto(header.dtype());
  if (!dtype.ok()) return Error(dtype.status());
  ModelShard& shard = (*model)->shard();
  // Taken before the push begins, so that one refused for its pair changes
  // nothing (and a push answered at once leaves the pair clean).
  std::optional<DevicePairHost::Lease> pair;
  if (device_pair) {
    absl::StatusOr<DevicePairHost::Lease> lease =
        AcquireDevicePairForPush(header, *dtype, context, reader, shard);
    if (!lease.ok()) return Error(lease.status());
    pair.emplace(*std::move(lease));
  }
  std::vector<StepState::CarriedChange> changes;
  for (const v1::SetHyperparametersRequest& c : header.hyperparameter_changes()) {
    if (c.cancel()) continue;  // Only changes are carried (see the proto).
    absl::StatusOr<Hyperparameters> h = HyperparametersFromProto(c.optimizer(), c.lr_schedule());
    if (!h.ok()) return Error(h.status());
    changes.push_back(StepState::CarriedChange{c.effective_step(), *std::move(h)});
  }
  absl::StatusOr<ModelShard::PushStart> start =
      shard.BeginPush(header.trainer_rank(), header.step(), header.num_elements(), *dtype,
                      header.loss_scale() == 0 ? 1.0 : header.loss_scale(), changes,
                      header.defer_until_complete(), header.skip_step());
  if (!start.ok()) return Error(start.status());
  if (start->immediate) {
    FillPushResponse(*start->immediate, **model, response);
    return grpc::Status::OK;
  }
  ModelShard::PushWriter& writer = *start->writer;
  if (header.has_shared_memory()) {
    if (absl::Status s = ReceiveSharedPayload(header, *dtype, context, reader, watch, writer);
        !s.ok()) {
      return Error(s);
    }
  }
  if (link) {
    if (absl::Status s =
            ReceiveSocketPayload(header, *dtype, context, reader, watch, writer, *link);
        !s.ok()) {
      return Error(s);
    }
  }
  if (pair) {
    if (absl::Status s = ReceiveDevicePairPayload(header, context, reader, watch, writer, *pair);
        !s.ok()) {
      return Error(s);
    }
  }
  while (!header.has_shared_memory() && !link && !device_pair && reader->Read(&request)) {
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
    // (What pipelined ranges already consumed stays; the rest is dropped.)
    return grpc::Status(grpc::CANCELLED, "push cancelled by the client before it ended");
  }
  // (In the asynchronous modes the push waits to be applied: the call's
  // deadline bounds that.)
  absl::StatusOr<PushResult> result = writer.Commit(WaitDeadline(*context, header.max_wait_ms()),
                                                    [context] { return context->IsCancelled(); });
  if (!result.ok()) return Error(result.status());
  FillPushResponse(*result, **model, response);
  return grpc::Status::OK;
}

grpc::Status ShardServiceImpl::PullParameters(
    grpc::ServerContext* context, const v1::PullParametersRequest* request,
    grpc::ServerWriter<v1::PullParametersResponse>* writer) {
  // A pull may carry the step's decision: trainers only.
  if (absl::Status s = Authorize(*context, Access::kWrite); !s.ok()) return Error(s);
  CallScope call(this);
  if (!call.admitted().ok()) return Error(call.admitted());
  absl::StatusOr<std::shared_ptr<HostedModel>> model = models_.Find(request->model_id());
  if (!model.ok()) return Error(model.status());
  if (absl::Status s = CheckShardIndex(request->shard_index()); !s.ok()) return Error(s);
  absl::StatusOr<DType> dtype = DTypeFromProto(request->dtype());
  if (!dtype.ok()) return Error(dtype.status());
  if (request->min_version() < 0) {
    return Error(absl::InvalidArgumentError("min_version is negative"));
  }
  ModelShard& shard = (*model)->shard();
  if (request->pushed_step() > 0) {
    // Before the decision: one for a step this shard lacks a push of would
    // be refused as incomplete, not answered OUT_OF_RANGE.
    if (absl::Status s = shard.CheckHoldsPush(request->trainer_rank(), request->pushed_step());
        !s.ok()) {
      return Error(s);
    }
  }
  // Where a pull through shared memory writes: found before the decision and
  // the wait, so that a bad place fails at once.
  std::optional<SharedPlace> shared;
  if (request->has_shared_memory() && !request->wait_only()) {
    absl::StatusOr<SharedPlace> place =
        LocateShared(request->shared_memory(), shard.size() * DTypeSize(*dtype), "pull");
    if (!place.ok()) return Error(place.status());
    shared = *std::move(place);
  }
  const bool socket = request->has_socket_payload() && !request->wait_only();
  if (socket && shared) {
    return Error(absl::InvalidArgumentError(
        "PullParameters names a shared-memory place and a payload socket"));
  }
  const bool device_pair = request->has_device_pair() && !request->wait_only();
  if (device_pair) {
    if (absl::Status s = CheckDevicePairPull(*request, *dtype, shard, socket || shared); !s.ok())
      return Error(s);
  }
  if (socket) {
    // Named now, taken once the version is known (the wait may be long).
    absl::StatusOr<PayloadSocketHost*> sockets = PayloadSockets();
    if (!sockets.ok()) return Error(sockets.status());
    if (absl::Status s = (*sockets)->Claim(request->socket_payload().link()); !s.ok()) {
      return Error(s);
    }
  }
  const absl::Time deadline = WaitDeadline(*context, request->max_wait_ms());
  const auto cancelled = [context] { return context->IsCancelled(); };
  if (request->has_decision()) {
    // Taken here; the update runs range by range as the frames below (and
    // every other trainer's pull) wait for it.
    if (absl::Status s =
            shard.Decide(request->min_version(), StepDecisionFromProto(request->decision()),
                         /*wait=*/false, deadline, cancelled);
        !s.ok()) {
      return Error(s);
    }
  }
  v1::PullParametersResponse response;
  if (request->wait_only()) {
    absl::StatusOr<int64_t> version =
        shard.WaitForVersion(request->min_version(), deadline, cancelled, PushedByOf(*request));
    if (!version.ok()) return Error(version.status());
    response.set_version(*version);
    response.set_lr(shard.LrOfVersion(*version));
    if (!writer->Write(response)) return grpc::Status(grpc::CANCELLED, "client went away");
    return grpc::Status::OK;
  }
  // Streamed range by range as each reaches the version (pipelined steps).
  // In the asynchronous modes the version is pinned until the pull ends.
  ReadPin pin;
  absl::StatusOr<int64_t> version =
      shard.PullTarget(request->min_version(), deadline, cancelled, PushedByOf(*request), &pin);
  if (!version.ok()) return Error(version.status());
  if (socket)
    return SendSocketPull(context, *request, shard, *version, *dtype, deadline, pin, writer);
  if (device_pair) {
    return SendDevicePairPull(context, *request, shard, *version, deadline, pin, writer);
  }
  response.set_version(*version);
  // Asynchronous over the stream: every message is read under the pin and
  // sent after it is released, so that a slow reader (flow control) holds no
  // push back. (The same one copy into the messages; all of them at once.)
  const bool read_first = shard.asynchronous() && !shared;
  std::vector<v1::PullParametersResponse> read_messages;
  const size_t element = DTypeSize(*dtype);
  const uint64_t chunk_elements = std::max<uint64_t>(1, options_.pull_chunk_bytes / element);
  for (uint64_t offset = 0; offset < shard.size(); offset += chunk_elements) {
    // (A pull its trainer gave up on stops writing the trainer's memory.)
    if (shared && cancelled()) return grpc::Status(grpc::CANCELLED, "pull cancelled by the client");
    const uint64_t count = std::min(chunk_elements, shard.size() - offset);
    if (absl::Status s =
            shard.WaitForRanges(*version, offset, count, deadline, cancelled, PushedByOf(*request));
        !s.ok()) {
      return Error(s);
    }
    // Known once the step runs: every frame carries it.
    response.set_lr(shard.LrOfVersion(*version));
    char* out = nullptr;
    if (shared) {
      out = shared->data + offset * element;
    } else {
      v1::TensorChunk* chunk = response.mutable_chunk();
      chunk->set_offset(offset);
      std::string* data = chunk->mutable_data();
      data->resize(count * element);
      out = data->data();
    }
    absl::Status read = shard.ReadParameters(*version, offset, count, *dtype, out);
    if (!read.ok()) return Error(read);
    if (read_first) {
      read_messages.push_back(std::move(response));
      response = v1::PullParametersResponse();
      response.set_version(*version);
      continue;
    }
    if (!shared && !writer->Write(response)) {
      return grpc::Status(grpc::CANCELLED, "client went away during the pull");
    }
  }
  pin.Release();
  for (const v1::PullParametersResponse& message : read_messages) {
    if (!writer->Write(message)) {
      return grpc::Status(grpc::CANCELLED, "client went away during the pull");
    }
  }
  // Through shared memory: one message, once every element is written.
  if (shared && !writer->Write(response)) {
    return grpc::Status(grpc::CANCELLED, "client went away during the pull");
  }
  metrics_.RecordPull(request->model_id());
  return grpc::Status::OK;
}

}  // namespace shardopt
