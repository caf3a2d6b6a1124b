// ShardServiceImpl's payloads over payload sockets (v1::SocketPayload,
// server/payload_socket_host.h): a push's bytes read from the trainer's link
// and checked and staged as streamed ones are; a pull's range sent over the
// link frame by frame as each piece reaches the version (with empty frames
// while it waits, so that the trainer can tell a waiting shard from a frozen
// one), then an end frame at the byte count. The rules are the stream's;
// only the bytes travel elsewhere.
#include <algorithm>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/payload_socket.h"
#include "server/service_replies.h"
#include "server/shard_service.h"

namespace shardopt {
namespace {

// How often a pull that waits for its ranges says it is alive.
constexpr absl::Duration kHeartbeat = absl::Seconds(1);

// The call's deadline and cancellation, and the server's idle bound on
// streams (zero: none) as the stall bound.
SocketWait WaitOf(grpc::ServerContext* context, absl::Duration idle_timeout) {
  SocketWait wait;
  wait.deadline = absl::FromChrono(context->deadline());
  wait.stall = idle_timeout > absl::ZeroDuration() ? idle_timeout : absl::InfiniteDuration();
  wait.cancelled = [context] { return context->IsCancelled(); };
  return wait;
}

}  // namespace

absl::StatusOr<PayloadSocketHost*> ShardServiceImpl::PayloadSockets() const {
  if (payload_sockets_ == nullptr) {
    return absl::FailedPreconditionError("this shard runs without a payload socket");
  }
  return payload_sockets_.get();
}

absl::StatusOr<PayloadSocketHost::Lease> ShardServiceImpl::AcquireLink(
    const v1::SocketPayload& where) const {
  absl::StatusOr<PayloadSocketHost*> sockets = PayloadSockets();
  if (!sockets.ok()) return sockets.status();
  return (*sockets)->Acquire(where.link());
}

absl::Status ShardServiceImpl::ReceiveSocketPayload(
    const v1::PushHeader& header, DType dtype, grpc::ServerContext* context,
    grpc::ServerReader<v1::PushGradientsRequest>* reader, StreamWatchdog::Watch& watch,
    ModelShard::PushWriter& writer, PayloadSocketHost::Lease& lease) {
  const size_t element = DTypeSize(dtype);
  const uint64_t bytes = header.num_elements() * element;
  v1::PushGradientsRequest extra;
  if (reader->Read(&extra)) {
    return absl::InvalidArgumentError(
        "PushGradients with its payload on a payload socket sent a chunk too");
  }
  const SocketWait wait = WaitOf(context, options_.stream_idle_timeout);
  // Piece by piece as it arrives (kSocketPieceBytes each: about a cache's
  // worth, so that the socket's copy and the staging copy with its NaN check
  // share it): ranges every trainer has delivered are updated while the
  // rest is read. An fp32 piece goes straight into the trainer's staging
  // where the writer allows it (checked there, one copy fewer), else
  // through `piece`.
  const uint64_t piece_elements = kSocketPieceBytes / element;
  const uint64_t transfer = header.socket_payload().transfer();
  std::vector<char> piece;
  for (uint64_t done = 0; done < header.num_elements(); done += piece_elements) {
    if (context->IsCancelled()) {
      return absl::CancelledError("push cancelled by the client before it was read");
    }
    const uint64_t count = std::min(piece_elements, header.num_elements() - done);
    absl::StatusOr<PayloadFrame> frame = ReceiveFrameHeader(lease.socket(), wait);
    if (absl::IsInvalidArgument(frame.status())) return frame.status();
    if (!frame.ok()) return DataPlaneFailed("the push's payload", frame.status());
    if (frame->transfer != transfer || frame->flags != PayloadFrame::kData ||
        frame->offset != done * element || frame->bytes != count * element) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the payload socket carried ", frame->bytes, " bytes at byte ", frame->offset,
          " of transfer ", frame->transfer, " where the push announced ", bytes,
          " bytes of transfer ", transfer, " in pieces of ", kSocketPieceBytes, " bytes (this one ",
          count * element, " at byte ", done * element, ")"));
    }
    float* in_place = writer.received() == done ? writer.ReceiveInPlace(count) : nullptr;
    if (in_place == nullptr && piece.empty()) piece.resize(std::min(bytes, kSocketPieceBytes));
    char* const into = in_place != nullptr ? reinterpret_cast<char*>(in_place) : piece.data();
    if (absl::Status s = ReceiveAll(lease.socket(), into, count * element, wait); !s.ok()) {
      return DataPlaneFailed("the push's payload", s);
    }
    watch.Touch();
    const absl::Status s = in_place != nullptr ? writer.WriteReceived(count)
                                               : writer.Write(done, piece.data(), count * element);
    if (!s.ok()) return s;
  }
  lease.Finished();
  return absl::OkStatus();
}

grpc::Status ShardServiceImpl::SendSocketPull(
    grpc::ServerContext* context, const v1::PullParametersRequest& request, ModelShard& shard,
    int64_t version, DType dtype, absl::Time deadline, ReadPin& pin,
    grpc::ServerWriter<v1::PullParametersResponse>* writer) {
  absl::StatusOr<PayloadSocketHost::Lease> lease = AcquireLink(request.socket_payload());
  if (!lease.ok()) return Error(lease.status());
  const uint64_t transfer = request.socket_payload().transfer();
  const SocketWait wait = WaitOf(context, options_.stream_idle_timeout);
  const auto cancelled = [context] { return context->IsCancelled(); };
  const size_t element = DTypeSize(dtype);
  const uint64_t piece_elements = kSocketPieceBytes / element;
  // Asynchronous: the whole range read under the pin (before anything is
  // sent) and sent after it is released, so that a slow reader holds no
  // push back.
  const bool read_first = shard.asynchronous();
  std::vector<char> data(read_first ? shard.size() * element
                                    : std::min(shard.size(), piece_elements) * element);
  // Waits until the piece at `offset` reaches the version, calling `alive`
  // each kHeartbeat meanwhile.
  auto wait_piece = [&](uint64_t offset, uint64_t count,
                        const std::function<absl::Status()>& alive) -> absl::Status {
    for (;;) {
      const absl::Status s =
          shard.WaitForRanges(version, offset, count, std::min(deadline, absl::Now() + kHeartbeat),
                              cancelled, PushedByOf(request));
      if (s.ok()) return s;
      if (!absl::IsDeadlineExceeded(s) || absl::Now() >= deadline || cancelled()) return s;
      if (absl::Status a = alive(); !a.ok()) return a;
    }
  };
  auto read_piece = [&](uint64_t offset, uint64_t count, char* out,
                        const std::function<absl::Status()>& alive) -> absl::Status {
    if (absl::Status s = wait_piece(offset, count, alive); !s.ok()) return s;
    return shard.ReadParameters(version, offset, count, dtype, out);
  };
  if (read_first) {
    for (uint64_t offset = 0; offset < shard.size(); offset += piece_elements) {
      const uint64_t count = std::min(piece_elements, shard.size() - offset);
      if (absl::Status s = read_piece(offset, count, data.data() + offset * element,
                                      [] { return absl::OkStatus(); });
          !s.ok()) {
        lease->Finished();  // (Nothing went over the socket.)
        return Error(s);
      }
    }
    pin.Release();
  }
  v1::PullParametersResponse response;
  response.set_version(version);
  if (!writer->Write(response)) {
    lease->Finished();
    return grpc::Status(grpc::CANCELLED, "client went away");
  }
  uint64_t sent = 0;
  const auto send = [&](uint32_t flags, const char* bytes, uint64_t count) {
    absl::Status s =
        SendFrame(lease->socket(), PayloadFrame{flags, transfer, sent, count}, bytes, wait);
    if (s.ok()) sent += count;
    return s;
  };
  const auto link_failed = [](const absl::Status& s) {
    return Error(DataPlaneFailed("the pull's link", s));
  };
  for (uint64_t offset = 0; offset < shard.size(); offset += piece_elements) {
    const uint64_t count = std::min(piece_elements, shard.size() - offset);
    char* out = data.data() + (read_first ? offset * element : 0);
    if (!read_first) {
      absl::Status link;
      const auto alive = [&] {
        link = send(PayloadFrame::kData, nullptr, 0);
        return link;
      };
      absl::Status s = wait_piece(offset, count, alive);
      // fp32 from the parameters themselves where the backend keeps them
      // in host memory (no copy), else read into `out`.
      absl::StatusOr<bool> in_place = false;
      if (s.ok() && dtype == DType::kFloat32) {
        in_place = shard.SendParametersInPlace(version, offset, count, [&](const float* params) {
          return link = send(PayloadFrame::kData, reinterpret_cast<const char*>(params),
                             count * element);
        });
        if (!in_place.ok()) s = in_place.status();
      }
      if (s.ok() && !*in_place) s = shard.ReadParameters(version, offset, count, dtype, out);
      if (!link.ok()) return link_failed(link);
      if (!s.ok()) {
        // Between frames the link is clean: the trainer hears that the
        // transfer ended here, and the call's status says why.
        if (send(PayloadFrame::kEnded, nullptr, 0).ok()) lease->Finished();
        return Error(s);
      }
      if (*in_place) continue;
    }
    if (absl::Status s = send(PayloadFrame::kData, out, count * element); !s.ok()) {
      return link_failed(s);
    }
  }
  pin.Release();
  // The end, at the byte count, which the trainer checks against its own.
  if (absl::Status s = send(PayloadFrame::kEnded, nullptr, 0); !s.ok()) return link_failed(s);
  lease->Finished();
  response.set_lr(shard.LrOfVersion(version));
  if (!writer->Write(response)) return grpc::Status(grpc::CANCELLED, "client went away");
  metrics_.RecordPull(request.model_id());
  return grpc::Status::OK;
}

}  // namespace shardopt
