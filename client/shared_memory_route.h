// A trainer's shared-memory data plane to the shards on its host.
//
// TrainerSegment holds the trainer's flat buffers in one sealed memfd
// segment (common/shared_memory.h) that every co-located shard maps: the fp32
// gradients and the fp32 parameters a caller may compute in (a push from the
// shared gradients is read by the shards in place, a pull into the shared
// parameters is written there by them), a staging region for push payloads
// from anywhere else (another buffer, a converted 16-bit payload, a replayed
// earlier step: they never overwrite the shared gradients), and, for a 16-bit
// pull type, a region the shards write the 16-bit values to. A pull into
// another buffer goes through the shared parameters. Last, two fence words
// per shard (common/segment_fence.h; one for its pushes, one for its
// pulls, which may overlap), each on a cache line of its own.
//
// SharedMemoryRoute is one shard's way into it, shared by that shard's
// connections (lanes): Link() attaches the segment to the shard
// (server/shared_memory_host.h: the socket the shard's ServerInfo names) the
// first time, and again after the shard restarted (its end of the socket
// closed); a shard that cannot be reached so (another host or network
// namespace, another user, shared memory off there) is asked again at most
// every kRetryInterval (one that did not answer, every 250 ms), and
// meanwhile payloads go over gRPC. Thread-safe; the lookup and the attach
// run under the route's lock, bounded (the lookup's own deadline, a connect
// that never blocks, a 10 s wait for the shard's answer).
#ifndef SHARDOPT_CLIENT_SHARED_MEMORY_ROUTE_H_
#define SHARDOPT_CLIENT_SHARED_MEMORY_ROUTE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "common/shared_memory.h"

namespace shardopt {

class TrainerSegment {
 public:
  // Buffers for `total_elements` flat elements; the 16-bit regions exist
  // when push or pull use a 16-bit type. Fences for `shards` shards.
  static absl::StatusOr<std::unique_ptr<TrainerSegment>> Create(uint64_t total_elements,
                                                                DType push_dtype, DType pull_dtype,
                                                                uint32_t shards);

  const SharedSegment& segment() const { return segment_; }
  float* gradients() const { return reinterpret_cast<float*>(segment_.data()); }
  float* parameters() const { return gradients() + total_; }
  uint64_t total_elements() const { return total_; }
  // Where the shards read a push payload of flat elements from `begin` of
  // `element_size` bytes each at `payload`: its byte offset in the segment,
  // and whether the payload must be copied there first (false when it is
  // the shared gradients already). nullopt when there is no room for it.
  struct PushPlace {
    int64_t offset = 0;
    bool copy = false;
  };
  std::optional<PushPlace> PlacePush(uint64_t begin, const char* payload,
                                     size_t element_size) const;
  // Where a shard writes its pull of flat elements from `begin` as `dtype`;
  // -1 when there is no region for that type.
  int64_t PullOffset(uint64_t begin, DType dtype) const;
  // The byte offset of shard `shard`'s fence word for its pushes or its
  // pulls; -1 for a shard outside those it was made for.
  enum class FenceUse { kPush = 0, kPull = 1 };
  int64_t FenceOffset(uint32_t shard, FenceUse use) const;

 private:
  TrainerSegment(SharedSegment segment, uint64_t total, size_t staging_element, int64_t pull16,
                 int64_t fences, uint32_t shards)
      : segment_(std::move(segment)),
        total_(total),
        staging_element_(staging_element),
        pull16_(pull16),
        fences_(fences),
        shards_(shards) {}

  SharedSegment segment_;
  uint64_t total_;
  size_t staging_element_;  // Bytes per element of the staging region.
  int64_t pull16_;          // Byte offset of the 16-bit pull region, -1: none.
  int64_t fences_;          // Byte offset of the fence words.
  uint32_t shards_;
};

// The segment attached to one shard: the socket that keeps the attachment.
class SharedMemoryLink {
 public:
  // Attaches `segment` through the shard's socket `socket_name`.
  static absl::StatusOr<std::unique_ptr<SharedMemoryLink>> Attach(const std::string& socket_name,
                                                                  const SharedSegment& segment);
  ~SharedMemoryLink();

  const std::string& attachment() const { return attachment_; }
  // False once the shard's end closed (it exited or restarted).
  bool alive() const;

 private:
  SharedMemoryLink(int socket, std::string attachment)
      : socket_(socket), attachment_(std::move(attachment)) {}
  const int socket_;
  const std::string attachment_;
};

class SharedMemoryRoute {
 public:
  static constexpr absl::Duration kRetryInterval = absl::Seconds(30);

  SharedMemoryRoute(std::shared_ptr<const TrainerSegment> segment, uint32_t shard_index);

  // The shard's socket name from its ServerInfo (empty: shared memory off;
  // FAILED_PRECONDITION: the shard's shared memory is not to be used, asked
  // again after kRetryInterval; another error: it did not answer, asked
  // again soon).
  using SocketLookup = std::function<absl::StatusOr<std::string>()>;
  // The live link to the shard, attaching first when there is none (and the
  // last failed attempt is not recent): null means "use gRPC".
  std::shared_ptr<SharedMemoryLink> Link(const SocketLookup& lookup);
  // After a call over `link` failed: true (and the link is dropped) when the
  // shard's end closed, so that the call is worth retrying.
  bool DropIfDead(const std::shared_ptr<SharedMemoryLink>& link);
  // After the shard said it does not hold `link`'s attachment: the next
  // call attaches again.
  void Drop(const std::shared_ptr<SharedMemoryLink>& link);

  const TrainerSegment& segment() const { return *segment_; }

 private:
  const std::shared_ptr<const TrainerSegment> segment_;
  const uint32_t shard_index_;
  absl::Mutex mu_;
  std::shared_ptr<SharedMemoryLink> link_ ABSL_GUARDED_BY(mu_);
  absl::Time retry_after_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::string last_refusal_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_SHARED_MEMORY_ROUTE_H_
