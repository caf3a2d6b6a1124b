// SharedMemoryTransport: the shared-memory PayloadTransport of one shard
// (the README's "Data plane"). Through its SharedMemoryRoute it attaches the
// trainer's segment to the shard (asking the shard's ServerInfo for its
// socket); a push then sends its header alone, naming where in the segment
// its payload is (copied there first unless it is the shared gradients), and
// a pull names where the shard writes (then widened or copied into the
// caller's buffer unless that is the shared parameters). It declines while
// the shard has no attachment and for a payload it has no region for.
// Thread-safe (the lanes of a shard share it).
#ifndef SHARDOPT_CLIENT_SHARED_MEMORY_TRANSPORT_H_
#define SHARDOPT_CLIENT_SHARED_MEMORY_TRANSPORT_H_

#include <atomic>
#include <memory>

#include "client/payload_transport.h"
#include "client/shared_memory_route.h"

namespace shardopt {

class SharedMemoryTransport final : public PayloadTransport {
 public:
  SharedMemoryTransport(std::shared_ptr<const TrainerSegment> segment, uint32_t shard_index)
      : route_(std::move(segment), shard_index) {}

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

  SharedMemoryRoute route_;
  std::atomic<int64_t> transfers_{0};
};

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_SHARED_MEMORY_TRANSPORT_H_
