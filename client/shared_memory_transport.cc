#include "client/shared_memory_transport.h"

#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/dtype_convert.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/segment_fence.h"

namespace shardopt {

std::shared_ptr<SharedMemoryLink> SharedMemoryTransport::Link(const PayloadCall& call) {
  if (call.range.size() == 0) return nullptr;
  return route_.Link([&call]() -> absl::StatusOr<std::string> {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    v1::ServerInfo info;
    absl::Status s =
        ToAbslStatus(call.stub.GetServerInfo(&context, v1::GetServerInfoRequest(), &info));
    if (!s.ok()) return s;
    if (!info.shared_memory_socket().empty() && !info.shared_memory_fences()) {
      return absl::FailedPreconditionError(
          "the shard's shared memory has no fences (an older server: a call this trainer gave "
          "up on could still write into its memory)");
    }
    return info.shared_memory_socket();
  });
}

absl::Status SharedMemoryTransport::Failed(const std::shared_ptr<SharedMemoryLink>& link,
                                           absl::Status status) {
  if (absl::IsFailedPrecondition(status) &&
      absl::StrContains(status.message(), kAttachmentNotOpen)) {
    route_.Drop(link);
    return absl::UnavailableError(
        absl::StrCat("the shard no longer holds this trainer's segment: ", status.message()));
  }
  if (route_.DropIfDead(link) && !absl::IsUnavailable(status)) {
    return absl::UnavailableError(
        absl::StrCat("the shard's shared-memory link closed (it exited?): ", status.message()));
  }
  return status;
}

bool SharedMemoryTransport::OpenFence(TrainerSegment::FenceUse use,
                                      v1::SharedMemoryPayload* where) {
  const int64_t offset = route_.segment().FenceOffset(shard_index_, use);
  if (offset < 0) return false;
  SegmentFence fence(route_.segment().segment().data() + offset);
  const uint64_t ticket = next_ticket_.fetch_add(1, std::memory_order_relaxed);
  if (!fence.TryOpen(ticket)) {
    absl::MutexLock lock(&fence_mu_);
    UnfinishedPiece& unfinished = unfinished_[static_cast<int>(use)];
    // (A shard killed in the middle of a piece never closes the word.)
    if (unfinished.link == nullptr || unfinished.link->alive() ||
        !fence.ClearAbandoned(unfinished.ticket) || !fence.TryOpen(ticket)) {
      return false;
    }
  }
  {
    absl::MutexLock lock(&fence_mu_);
    unfinished_[static_cast<int>(use)] = UnfinishedPiece();
  }
  where->set_fence_offset(static_cast<uint64_t>(offset));
  where->set_fence_ticket(ticket);
  return true;
}

absl::Status SharedMemoryTransport::CloseFence(TrainerSegment::FenceUse use,
                                               const v1::SharedMemoryPayload& where,
                                               const std::shared_ptr<SharedMemoryLink>& link,
                                               absl::Status status) {
  SegmentFence fence(route_.segment().segment().data() + where.fence_offset());
  const absl::Status closed = fence.Revoke(where.fence_ticket(), kFenceCloseTimeout,
                                           [&link] { return !link->alive(); });
  if (closed.ok()) return status;
  LogError("shard %d: %s; its payloads go another way until it ends", shard_index_,
           closed.message());
  {
    absl::MutexLock lock(&fence_mu_);
    unfinished_[static_cast<int>(use)] = UnfinishedPiece{where.fence_ticket(), link};
  }
  if (status.ok()) return closed;  // (Cannot be: an answered call's pieces are done.)
  return absl::Status(status.code(), absl::StrCat(status.message(), "; and ", closed.message()));
}

std::optional<absl::Status> SharedMemoryTransport::Push(const PayloadCall& call,
                                                        const v1::PushGradientsRequest& header,
                                                        const char* payload, size_t element_size,
                                                        v1::PushGradientsResponse* response) {
  std::shared_ptr<SharedMemoryLink> link = Link(call);
  if (link == nullptr) return std::nullopt;
  const TrainerSegment& segment = route_.segment();
  const std::optional<TrainerSegment::PushPlace> place =
      segment.PlacePush(call.range.begin, payload, element_size);
  if (!place) return std::nullopt;
  v1::PushGradientsRequest shared = header;
  v1::SharedMemoryPayload* where = shared.mutable_header()->mutable_shared_memory();
  where->set_attachment(link->attachment());
  where->set_byte_offset(static_cast<uint64_t>(place->offset));
  // (Copied once the fence is open: a piece an earlier attempt's shard
  // still reads is never torn.)
  if (!OpenFence(TrainerSegment::FenceUse::kPush, where)) return std::nullopt;
  if (place->copy) {
    std::memcpy(segment.segment().data() + place->offset, payload,
                header.header().num_elements() * element_size);
  }
  std::unique_ptr<grpc::ClientWriter<v1::PushGradientsRequest>> writer =
      call.stub.PushGradients(&call.context, response);
  if (writer->Write(shared)) writer->WritesDone();
  absl::Status s =
      CloseFence(TrainerSegment::FenceUse::kPush, *where, link, ToAbslStatus(writer->Finish()));
  if (!s.ok()) return Failed(link, s);
  transfers_.fetch_add(1, std::memory_order_relaxed);
  return s;
}

std::optional<absl::Status> SharedMemoryTransport::Pull(const PayloadCall& call,
                                                        const v1::PullParametersRequest& request,
                                                        DType dtype, float* destination,
                                                        PulledVersion* pulled) {
  if (request.wait_only()) return std::nullopt;  // (No payload.)
  std::shared_ptr<SharedMemoryLink> link = Link(call);
  if (link == nullptr) return std::nullopt;
  const int64_t place = route_.segment().PullOffset(call.range.begin, dtype);
  if (place < 0) return std::nullopt;
  v1::PullParametersRequest shared = request;
  v1::SharedMemoryPayload* where = shared.mutable_shared_memory();
  where->set_attachment(link->attachment());
  where->set_byte_offset(static_cast<uint64_t>(place));
  if (!OpenFence(TrainerSegment::FenceUse::kPull, where)) return std::nullopt;
  std::unique_ptr<grpc::ClientReader<v1::PullParametersResponse>> reader =
      call.stub.PullParameters(&call.context, shared);
  v1::PullParametersResponse response;
  int messages = 0;
  int64_t version = -1;
  double lr = 0;
  while (reader->Read(&response)) {
    ++messages;
    version = response.version();
    lr = response.lr();
  }
  absl::Status s =
      CloseFence(TrainerSegment::FenceUse::kPull, *where, link, ToAbslStatus(reader->Finish()));
  if (!s.ok()) return Failed(link, s);
  if (messages != 1 || version < 0 || response.has_chunk()) {
    return absl::InternalError(absl::StrCat("a pull through shared memory ended after ", messages,
                                            " messages (expected one, without data)"));
  }
  const char* written = route_.segment().segment().data() + place;
  const uint64_t count = call.range.size();
  if (dtype == DType::kFloat32) {
    if (written != reinterpret_cast<const char*>(destination)) {
      std::memcpy(destination, written, count * sizeof(float));
    }
  } else {
    ConvertToFloatAndFindNonFinite(written, count, dtype, destination);
  }
  pulled->version = version;
  pulled->lr = lr;
  transfers_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

}  // namespace shardopt
