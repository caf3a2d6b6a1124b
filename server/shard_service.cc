// ShardServiceImpl: admission, and the calls of a step (push, pull;
// registration in shard_service_register.cc, statistics and
// hyperparameters in shard_service_step_control.cc).
#include "server/shard_service.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "common/names.h"
#include "common/proto_convert.h"
#include "server/device_support.h"
#include "server/service_replies.h"

namespace shardopt {
namespace {

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
  const absl::Cleanup abandon_pair = [&] {
    if (pair) AbandonPairOfCancelledCall(*context, *pair);
  };
  std::vector<StepState::CarriedChange> changes;
  if (header.hyperparameter_changes_size() > static_cast<int>(kMaxPendingHyperparameterChanges)) {
    return Error(absl::InvalidArgumentError(absl::StrCat(
        "the push carries ", header.hyperparameter_changes_size(),
        " hyperparameter changes; a trainer has at most ", kMaxPendingHyperparameterChanges,
        " pending")));
  }
  for (const v1::SetHyperparametersRequest& c : header.hyperparameter_changes()) {
    if (c.model_id() != header.model_id()) {
      return Error(absl::InvalidArgumentError(
          absl::StrCat("a hyperparameter change the push carries names model ",
                       Quoted(c.model_id()), ", not the push's ", Quoted(header.model_id()))));
    }
    if (c.effective_step() < header.step()) {
      return Error(absl::InvalidArgumentError(absl::StrCat(
          "a push of step ", header.step(), " carries a hyperparameter change for step ",
          c.effective_step(), ": it carries its trainer's changes for that step and later")));
    }
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
    if (!request.has_chunk()) {
      return Error(absl::InvalidArgumentError(
          request.has_header() ? "PushGradients sent a second header"
                               : "PushGradients sent a message without a chunk"));
    }
    const v1::TensorChunk& chunk = request.chunk();
    // (Empty ones would keep a stalled stream, and the slot it holds, alive
    // past the idle watchdog.)
    if (chunk.data().empty()) {
      return Error(absl::InvalidArgumentError(
          absl::StrCat("PushGradients sent an empty chunk at element ", chunk.offset())));
    }
    watch.Touch();
    if (absl::Status s = writer.Write(chunk.offset(), chunk.data().data(), chunk.data().size());
        !s.ok()) {
      return Error(s);
    }
  }
  if (context->IsCancelled()) {
    // (What pipelined ranges already consumed stays; the rest is dropped.)
    return grpc::Status(grpc::CANCELLED, "push cancelled by the client before it ended");
  }
  // The push waits to be applied (asynchronous modes: behind other
  // trainers or a checkpoint's cut, until the call's deadline; synchronous:
  // while a checkpoint holds the step): no stall of the client's, which the
  // idle watchdog is for.
  watch.Stop();
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
  // (After `shared`: the segment stays mapped while the claim on it lives.)
  std::optional<PullPlaceClaims::Claim> claim;
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
  if (shared) {
    // A call already given up on (a retry's earlier attempt, late) takes
    // nothing from the live one.
    if (context->IsCancelled()) return grpc::Status(grpc::CANCELLED, "client cancelled");
    // From now on an earlier pull into the place (one its trainer gave up
    // on) writes nothing more there.
    claim.emplace(pull_claims_.Take(shared->place));
  }
  const absl::Time deadline = WaitDeadline(*context, request->max_wait_ms());
  const auto cancelled = [context] { return context->IsCancelled(); };
  // OK, or ABORTED once a newer pull has taken this one's place or the
  // trainer closed its fence to this one; the waits below end then too.
  const auto superseded = [&claim, &shared]() -> absl::Status {
    if (claim) {
      if (absl::Status s = claim->Current(); !s.ok()) return s;
    }
    if (shared && !shared->Open()) {
      return absl::AbortedError(
          "the trainer gave up on this pull (it closed its shared-memory fence to it)");
    }
    return absl::OkStatus();
  };
  const auto given_up = [&] { return cancelled() || !superseded().ok(); };
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
      shard.PullTarget(request->min_version(), deadline, given_up, PushedByOf(*request), &pin);
  if (!version.ok()) {
    absl::Status taken = superseded();
    return Error(taken.ok() ? version.status() : taken);
  }
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
            shard.WaitForRanges(*version, offset, count, deadline, given_up, PushedByOf(*request));
        !s.ok()) {
      absl::Status taken = superseded();
      return Error(taken.ok() ? s : taken);
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
    const auto read_piece = [&] {
      return shard.ReadParameters(*version, offset, count, *dtype, out);
    };
    const auto write_piece = [&] { return shared ? shared->Touch(read_piece) : read_piece(); };
    absl::Status read = claim ? claim->Write(write_piece) : write_piece();
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
