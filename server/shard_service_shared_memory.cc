// ShardServiceImpl's payloads through shared memory (PushHeader.shared_memory,
// PullParametersRequest.shared_memory): the same checks and staging as the
// streamed payloads, only the bytes come from (go to) a trainer's attached
// segment (server/shared_memory_host.h).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/service_replies.h"
#include "server/shard_service.h"

namespace shardopt {
namespace {

// `bytes` bytes at the place `where` names, with its segment held.
struct SharedBytes {
  std::shared_ptr<const SharedSegment> segment;
  char* data = nullptr;
};

absl::StatusOr<SharedBytes> Locate(const SharedMemoryHost* host,
                                   const v1::SharedMemoryPayload& where, uint64_t bytes,
                                   const char* what) {
  if (host == nullptr) {
    return absl::FailedPreconditionError("this shard runs without shared memory");
  }
  absl::StatusOr<std::shared_ptr<const SharedSegment>> segment = host->Find(where.attachment());
  if (!segment.ok()) return segment.status();
  if (!(*segment)->Contains(where.byte_offset(), bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", what, "'s ", bytes, " bytes at byte ", where.byte_offset(),
                     " of its shared segment overrun the ", (*segment)->size(), " bytes it holds"));
  }
  char* data = (*segment)->data() + where.byte_offset();
  return SharedBytes{*std::move(segment), data};
}

}  // namespace

absl::Status ShardServiceImpl::ReceiveSharedPayload(
    const v1::PushHeader& header, DType dtype, grpc::ServerContext* context,
    grpc::ServerReader<v1::PushGradientsRequest>* reader, StreamWatchdog::Watch& watch,
    ModelShard::PushWriter& writer) {
  const size_t element = DTypeSize(dtype);
  absl::StatusOr<SharedBytes> payload =
      Locate(shared_memory_.get(), header.shared_memory(), header.num_elements() * element, "push");
  if (!payload.ok()) return payload.status();
  // The client ends its stream after the header: a chunk besides the shared
  // payload is refused before any of it is staged.
  v1::PushGradientsRequest extra;
  if (reader->Read(&extra)) {
    return absl::InvalidArgumentError(
        "PushGradients with its payload in shared memory sent a chunk too");
  }
  // In pieces of a pipeline range or so, as a stream would bring them:
  // ranges every trainer has delivered are updated while the rest is read.
  // A call its trainer gave up on stops reading the trainer's memory at the
  // next piece (the trainer may be writing it again).
  const uint64_t piece = std::max<uint64_t>(1, (uint64_t{4} << 20) / element);
  const char* data = payload->data;
  for (uint64_t done = 0; done < header.num_elements(); done += piece) {
    if (context->IsCancelled()) {
      return absl::CancelledError("push cancelled by the client before it was read");
    }
    watch.Touch();
    const uint64_t count = std::min(piece, header.num_elements() - done);
    if (absl::Status s = writer.Write(done, data + done * element, count * element); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ShardServiceImpl::CheckSharedPull(const v1::PullParametersRequest& request,
                                               uint64_t elements, DType dtype) const {
  return Locate(shared_memory_.get(), request.shared_memory(), elements * DTypeSize(dtype), "pull")
      .status();
}

absl::Status ShardServiceImpl::PullIntoSharedMemory(const v1::PullParametersRequest& request,
                                                    ModelShard& shard, int64_t version, DType dtype,
                                                    absl::Time deadline,
                                                    const std::function<bool()>& cancelled) {
  const size_t element = DTypeSize(dtype);
  absl::StatusOr<SharedBytes> place =
      Locate(shared_memory_.get(), request.shared_memory(), shard.size() * element, "pull");
  if (!place.ok()) return place.status();
  char* const destination = place->data;
  const uint64_t chunk_elements = std::max<uint64_t>(1, options_.pull_chunk_bytes / element);
  for (uint64_t at = 0; at < shard.size(); at += chunk_elements) {
    if (cancelled()) return absl::CancelledError("pull cancelled by the client");
    const uint64_t count = std::min(chunk_elements, shard.size() - at);
    if (absl::Status s =
            shard.WaitForRanges(version, at, count, deadline, cancelled, PushedByOf(request));
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            shard.ReadParameters(version, at, count, dtype, destination + at * element);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace shardopt
