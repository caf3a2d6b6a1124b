// SharedMemoryTransport: the shared-memory PayloadTransport of one shard
// (the README's "Data plane"). Through its SharedMemoryRoute it attaches the
// trainer's segment to the shard (asking the shard's ServerInfo for its
// socket); a push then sends its header alone, naming where in the segment
// its payload is (copied there first unless it is the shared gradients), and
// a pull names where the shard writes (then widened or copied into the
// caller's buffer unless that is the shared parameters). It declines while
// the shard has no attachment and for a payload it has no region for.
// Each attempt opens the segment's fence word for the shard's pushes (or
// pulls) with a new ticket and closes it when the call has ended, waiting
// out a piece the shard is still reading or writing
// (common/segment_fence.h): when Push or Pull returns, however the call
// ended (Ctrl-C, a deadline), the shard touches the trainer's memory no
// more for it. One push and one pull at a time per shard.
// Thread-safe (the lanes of a shard share it).
#ifndef SHARDOPT_CLIENT_SHARED_MEMORY_TRANSPORT_H_
#define SHARDOPT_CLIENT_SHARED_MEMORY_TRANSPORT_H_

#include <atomic>
#include <memory>

#include "client/payload_transport.h"
#include "absl/synchronization/mutex.h"
#include "client/shared_memory_route.h"

namespace shardopt {

class SharedMemoryTransport final : public PayloadTransport {
 public:
  // How long closing a fence waits for the shard's piece in progress (a
  // copy of a few MB) before it says so.
  static constexpr absl::Duration kFenceCloseTimeout = absl::Seconds(10);

  SharedMemoryTransport(std::shared_ptr<const TrainerSegment> segment, uint32_t shard_index)
      : route_(std::move(segment), shard_index), shard_index_(shard_index) {}

  const char* name() const override { return "shared memory"; }
  std::optional<absl::Status> Push(const PayloadCall& call, const v1::PushGradientsRequest& header,
                                   const char* payload, size_t element_size,
                                   v1::PushGradientsResponse* response) override;
  std::optional<absl::Status> Pull(const PayloadCall& call,
                                   const v1::PullParametersRequest& request, DType dtype,
                                   float* destination, PulledVersion* pulled) override;
  int64_t transfers() const override { return transfers_.load(std::memory_order_relaxed); }

 private:
  // The link to the shard, attaching first when needed; null: decline.
  std::shared_ptr<SharedMemoryLink> Link(const PayloadCall& call);
  // A failed call over `link`: UNAVAILABLE (retried, then without it or
  // over a new link) when the shard's end closed or it lost the
  // attachment, else `status`.
  absl::Status Failed(const std::shared_ptr<SharedMemoryLink>& link, absl::Status status);
  // Opens the shard's fence word for `use` with a new ticket, named in
  // `where`; false (decline) while the last piece of an earlier attempt is
  // still in progress (its close gave up waiting), unless the shard process
  // that was in it has gone since.
  bool OpenFence(TrainerSegment::FenceUse use, v1::SharedMemoryPayload* where);
  // Closes it after the attempt: `status` as it was, or, when the shard
  // outlasted kFenceCloseTimeout still touching the memory, that said too.
  absl::Status CloseFence(TrainerSegment::FenceUse use, const v1::SharedMemoryPayload& where,
                          const std::shared_ptr<SharedMemoryLink>& link, absl::Status status);

  SharedMemoryRoute route_;
  const uint32_t shard_index_;
  std::atomic<uint64_t> next_ticket_{1};
  // Per use: an attempt whose close gave up waiting for its last piece,
  // and the link it went over (whose end closes if that shard exits).
  struct UnfinishedPiece {
    uint64_t ticket = 0;
    std::shared_ptr<SharedMemoryLink> link;
  };
  absl::Mutex fence_mu_;
  UnfinishedPiece unfinished_[2] ABSL_GUARDED_BY(fence_mu_);
  std::atomic<int64_t> transfers_{0};
};

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_SHARED_MEMORY_TRANSPORT_H_
