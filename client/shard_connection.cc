#include "client/shard_connection.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace shardopt {
namespace {

// Room for a chunk plus its header, with margin for larger chunk_bytes.
constexpr int kMaxMessageBytes = 64 << 20;

// The streaming methods called with zero-copy frames (client/wire_frames.h)
// instead of the generated stub's message types.
constexpr char kPushMethod[] = "/shardopt.v1.ShardService/PushGradients";
constexpr char kPullMethod[] = "/shardopt.v1.ShardService/PullParameters";

int Milliseconds(absl::Duration d) {
  return static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

}  // namespace

ShardConnection::ShardConnection(uint32_t index, std::string address,
                                 const ConnectionOptions& options)
    : index_(index), address_(std::move(address)), channels_(options.channels) {
  channel_args_.SetMaxReceiveMessageSize(kMaxMessageBytes);
  channel_args_.SetMaxSendMessageSize(kMaxMessageBytes);
  // Each shard gets its own connection even when addresses repeat.
  channel_args_.SetInt("shardopt.shard_index", static_cast<int>(index));
  channel_args_.SetInt("shardopt.lane", options.lane);
  // Detect a peer that died or froze while a call is open: its transport is
  // closed, failing the call (and releasing zero-copy payload slices). The
  // pings must go on while a call waits without data (a pull waiting for
  // other trainers), which gRPC stops after 2 unless told otherwise.
  channel_args_.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, Milliseconds(options.keepalive_time));
  channel_args_.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Milliseconds(options.keepalive_timeout));
  channel_args_.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Reconnect to a restarted shard as soon as the retries ask: gRPC's own
  // backoff (1 s growing to 120 s) would keep failing calls with the stale
  // "connection refused" long after the shard is back. (gRPC's "min
  // reconnect backoff" is the connect timeout: it stays at 5 s.)
  const int reconnect_ms = std::max(20, Milliseconds(options.initial_backoff));
  channel_args_.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, reconnect_ms);
  channel_args_.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 5000);
  channel_args_.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
                       std::max(reconnect_ms, Milliseconds(options.max_backoff)));
  link_ = OpenLink();
}

std::shared_ptr<ShardConnection::Link> ShardConnection::OpenLink() const {
  auto link = std::make_shared<Link>();
  link->channel = channels_.NewChannel(address_, channel_args_);
  link->stub = v1::ShardService::NewStub(link->channel);
  link->push_method = std::make_unique<grpc::internal::RpcMethod>(
      kPushMethod, grpc::internal::RpcMethod::CLIENT_STREAMING, link->channel);
  link->pull_method = std::make_unique<grpc::internal::RpcMethod>(
      kPullMethod, grpc::internal::RpcMethod::SERVER_STREAMING, link->channel);
  return link;
}

std::shared_ptr<ShardConnection::Link> ShardConnection::CurrentLink() const {
  absl::MutexLock lock(&link_mu_);
  return link_;
}

void ShardConnection::PrepareAttempt() {
  if (!reopen_channel_.exchange(false)) return;
  std::shared_ptr<Link> fresh = OpenLink();
  absl::MutexLock lock(&link_mu_);
  link_.swap(fresh);  // (The old one goes when its last call ends.)
}

void ShardConnection::RecordAttempt(const absl::Status& status, bool deadline_passed) {
  if (absl::IsUnavailable(status) || (absl::IsDeadlineExceeded(status) && deadline_passed)) {
    unreachable_attempts_.fetch_add(1, std::memory_order_relaxed);
  }
  if (absl::IsUnavailable(status) &&
      CurrentLink()->channel->GetState(false) == GRPC_CHANNEL_TRANSIENT_FAILURE) {
    reopen_channel_ = true;
  }
}

absl::Status ShardConnection::Annotate(const absl::Status& status, const std::string& what) const {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("shard ", index_, " (", address_, "): ", what,
                                                  ": ", status.message()));
}

absl::Status ShardConnection::Register(grpc::ClientContext& context,
                                       const v1::RegisterHeader& header, const float* values,
                                       uint64_t count, size_t chunk_bytes,
                                       v1::RegisterModelResponse* response) {
  const std::shared_ptr<Link> link = CurrentLink();
  std::unique_ptr<grpc::ClientWriter<v1::RegisterModelRequest>> writer =
      link->stub->RegisterModel(&context, response);
  v1::RegisterModelRequest request;
  *request.mutable_header() = header;
  bool open = writer->Write(request);
  const size_t chunk = std::max<size_t>(1, chunk_bytes / sizeof(float));
  for (uint64_t off = 0; open && off < count; off += chunk) {
    const uint64_t n = std::min<uint64_t>(chunk, count - off);
    v1::TensorChunk* piece = request.mutable_values();
    piece->set_offset(off);
    piece->set_data(values + off, n * sizeof(float));
    open = writer->Write(request);
  }
  // A server that answers early (the model already exists) closes the
  // stream: Finish() then carries its answer.
  if (open) writer->WritesDone();
  return ToAbslStatus(writer->Finish());
}

absl::Status ShardConnection::Push(grpc::ClientContext& context,
                                   const v1::PushGradientsRequest& header, const char* payload,
                                   size_t element_size, size_t chunk_bytes, PayloadPins* pins,
                                   v1::PushGradientsResponse* response,
                                   const ReadyRanges* ready) {
  // An abandoned streamed push is over, also for an attempt retried after a
  // shard was unreachable.
  if (ready != nullptr && ready->failed()) {
    return absl::FailedPreconditionError("the streamed push was abandoned");
  }
  // A skipped step (asynchronous modes) is its header alone.
  const bool skip = header.header().skip_step();
  const std::shared_ptr<Link> link = CurrentLink();
  if (ready == nullptr && transport_ != nullptr && !skip) {
    if (std::optional<absl::Status> s = transport_->Push(PayloadCall{context, *link->stub, range_},
                                                         header, payload, element_size, response)) {
      return *s;
    }
  }
  std::unique_ptr<grpc::ClientWriter<PushFrame>> writer(
      grpc::internal::ClientWriterFactory<PushFrame>::Create(
          link->channel.get(), *link->push_method, &context, response));
  PushFrame frame;
  frame.pins = pins;
  frame.element_size = element_size;
  frame.header = &header;
  bool open = writer->Write(frame);
  frame.header = nullptr;
  const uint64_t total = skip ? 0 : header.header().num_elements();
  const size_t chunk = std::max<size_t>(1, chunk_bytes / element_size);
  bool abandoned = false;
  for (uint64_t off = 0; open && off < total; off += chunk) {
    frame.offset = off;
    frame.data = payload + off * element_size;
    frame.count = std::min<uint64_t>(chunk, total - off);
    if (ready != nullptr && !ready->WaitReady(range_.begin + off, range_.begin + off + frame.count)) {
      abandoned = true;
      break;
    }
    if (ready != nullptr) {
      // (Streamed pushes are fp32.)
      ready->RecordSent(range_.begin + off, range_.begin + off + frame.count,
                        static_cast<const float*>(frame.data));
    }
    open = writer->Write(frame);
  }
  // Ended only once the caller checked the whole gradient: a stream that is
  // not ended is never committed.
  if (open && !abandoned && ready != nullptr && !ready->WaitCommit()) abandoned = true;
  if (abandoned) {
    context.TryCancel();
    writer->Finish().ok();  // (CANCELLED.)
    // Not CANCELLED, which the fan-out may retry: this push is over.
    return absl::FailedPreconditionError("the streamed push was abandoned");
  }
  if (open) writer->WritesDone();
  return ToAbslStatus(writer->Finish());
}

absl::Status ShardConnection::Pull(grpc::ClientContext& context,
                                   const v1::PullParametersRequest& request, DType dtype,
                                   float* destination, PulledVersion* pulled) {
  const std::shared_ptr<Link> link = CurrentLink();
  if (transport_ != nullptr) {
    if (std::optional<absl::Status> s = transport_->Pull(PayloadCall{context, *link->stub, range_},
                                                         request, dtype, destination, pulled)) {
      return *s;
    }
  }
  std::unique_ptr<grpc::ClientReader<PullFrame>> reader(
      grpc::internal::ClientReaderFactory<PullFrame>::Create(
          link->channel.get(), *link->pull_method, &context, request));
  PullFrame frame;
  frame.destination = destination;
  frame.capacity = range_.size();
  frame.dtype = dtype;
  uint64_t received = 0;
  int64_t version = -1;
  absl::Status bad;
  while (reader->Read(&frame)) {
    if (version < 0) {
      version = frame.version;
      pulled->lr = frame.lr;
    }
    if (frame.version != version || frame.offset != received) {
      bad = absl::InternalError(absl::StrCat("pull chunk at element ", frame.offset, " of version ",
                                             frame.version, " after ", received,
                                             " elements of version ", version));
      context.TryCancel();
      break;
    }
    received += frame.count;
  }
  if (bad.ok() && !frame.error.empty()) {
    bad = absl::InternalError(frame.error);
    context.TryCancel();
  }
  absl::Status s = ToAbslStatus(reader->Finish());
  if (!bad.ok()) return bad;
  if (!s.ok()) return s;
  const uint64_t expected = request.wait_only() ? 0 : range_.size();
  if (received != expected || version < 0) {
    return absl::InternalError(
        absl::StrCat("pull ended after ", received, " of ", expected, " elements"));
  }
  pulled->version = version;
  return absl::OkStatus();
}

absl::Status ShardConnection::GetStepStats(grpc::ClientContext& context,
                                           const v1::GetStepStatsRequest& request,
                                           v1::StepStats* stats) {
  return ToAbslStatus(CurrentLink()->stub->GetStepStats(&context, request, stats));
}

absl::Status ShardConnection::SetHyperparameters(grpc::ClientContext& context,
                                                 const v1::SetHyperparametersRequest& request) {
  v1::SetHyperparametersResponse response;
  return ToAbslStatus(CurrentLink()->stub->SetHyperparameters(&context, request, &response));
}

absl::Status ShardConnection::Checkpoint(grpc::ClientContext& context,
                                         const v1::CheckpointRequest& request,
                                         v1::CheckpointResponse* response) {
  return ToAbslStatus(CurrentLink()->stub->Checkpoint(&context, request, response));
}

absl::Status ShardConnection::Inspect(grpc::ClientContext& context,
                                      const v1::InspectRequest& request,
                                      v1::InspectResponse* response) {
  return ToAbslStatus(CurrentLink()->stub->Inspect(&context, request, response));
}

absl::Status ShardConnection::Summary(grpc::ClientContext& context, const std::string& model_id,
                                      v1::ModelSummary* summary) {
  v1::ServerInfo info;
  absl::Status s =
      ToAbslStatus(CurrentLink()->stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info));
  if (!s.ok()) return s;
  for (const v1::ModelSummary& m : info.models()) {
    if (m.model_id() == model_id) {
      *summary = m;
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError(absl::StrCat("the server does not hold model '", model_id, "'"));
}

absl::Status ShardConnection::RollBack(grpc::ClientContext& context,
                                       const v1::RollBackRequest& request,
                                       v1::RollBackResponse* response) {
  return ToAbslStatus(CurrentLink()->stub->RollBack(&context, request, response));
}

}  // namespace shardopt
