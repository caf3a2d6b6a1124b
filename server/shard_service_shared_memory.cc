// ShardServiceImpl's pushes through shared memory (PushHeader.shared_memory),
// and where in a trainer's attached segment (server/shared_memory_host.h) a
// push reads or a pull writes (the pull's loop is PullParameters'): the same
// checks and staging as streamed payloads, only the bytes come from (go to)
// the segment.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/shard_service.h"

namespace shardopt {

absl::StatusOr<ShardServiceImpl::SharedPlace> ShardServiceImpl::LocateShared(
    const v1::SharedMemoryPayload& where, uint64_t bytes, const char* what) const {
  if (shared_memory_ == nullptr) {
    return absl::FailedPreconditionError("this shard runs without shared memory");
  }
  absl::StatusOr<std::shared_ptr<const SharedSegment>> segment =
      shared_memory_->Find(where.attachment());
  if (!segment.ok()) return segment.status();
  if (!(*segment)->Contains(where.byte_offset(), bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", what, "'s ", bytes, " bytes at byte ", where.byte_offset(),
                     " of its shared segment overrun the ", (*segment)->size(), " bytes it holds"));
  }
  char* data = (*segment)->data() + where.byte_offset();
  const PullPlace place{(*segment)->file_id(), where.byte_offset()};
  SharedPlace shared{*std::move(segment), data, place};
  if (where.fence_ticket() != 0) {
    if (absl::Status s = SegmentFence::CheckTicket(where.fence_ticket()); !s.ok()) return s;
    if (absl::Status s = SegmentFence::CheckPlace(where.fence_offset(), shared.segment->size(),
                                                  where.byte_offset(), bytes);
        !s.ok()) {
      return s;
    }
    shared.fence.emplace(shared.segment->data() + where.fence_offset());
    shared.ticket = where.fence_ticket();
  }
  return shared;
}

absl::Status ShardServiceImpl::ReceiveSharedPayload(
    const v1::PushHeader& header, DType dtype, grpc::ServerContext* context,
    grpc::ServerReader<v1::PushGradientsRequest>* reader, StreamWatchdog::Watch& watch,
    ModelShard::PushWriter& writer) {
  const size_t element = DTypeSize(dtype);
  absl::StatusOr<SharedPlace> payload =
      LocateShared(header.shared_memory(), header.num_elements() * element, "push");
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
    // (Write reads the piece, and again for a refusal's message: all of
    // it inside the fence.)
    if (absl::Status s = payload->Touch([&] {
          return writer.Write(done, data + done * element, count * element,
                              ModelShard::PushWriter::Source::kTrainerWritable);
        });
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace shardopt
