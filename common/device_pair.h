// DevicePair: the device data plane of one (trainer, shard) pair, a private
// two-party channel that moves the bytes of a push or a pull straight
// between the trainer's buffers and the memory the shard's backend keeps
// its staging and parameters in (issue "The data plane"). gRPC still
// carries every call, answer and exactly-once rule; only bytes move here.
//
// Kinds (DevicePairKind):
//  - "nccl" (common/nccl/nccl_pair.h): a two-rank NCCL communicator between
//    GPU memory on both sides; built where CUDA is.
//  - "loopback" (common/loopback_pair.h): host memory over a Unix socket of
//    the abstract namespace. For shards on the CPU backend: it runs the same
//    protocol as NCCL on machines without a GPU, which is how the protocol
//    is tested here; payload sockets remain the CPU data plane of choice.
//
// Bootstrap: the shard makes the pair's id (NewId) and hands it to the
// trainer in OpenDevicePair; both Connect with it, the shard as rank 0, the
// trainer as rank 1. Contract of a pair: one thread at a time; every call
// has a deadline and never hangs past it; a pair whose call failed is
// broken (every later call fails at once with the first failure) and its
// owner drops it. A Send of n bytes is met by a Recv of n bytes on the
// other side: both ends move a transfer in pieces of kDevicePairPieceBytes.
#ifndef SHARDOPT_COMMON_DEVICE_PAIR_H_
#define SHARDOPT_COMMON_DEVICE_PAIR_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace shardopt {

// Where a pair's bytes live on both ends.
enum class PairMemory { kHost, kDevice };

// A transfer moves in pieces of this many bytes (the last may be shorter),
// so that a shard checks and admits each piece as it arrives.
inline constexpr uint64_t kDevicePairPieceBytes = uint64_t{4} << 20;

// The initial metadata key by which a shard tells the trainer that it takes
// a push's bytes now (its value: the transfer number). A push answered
// without it (refused, or applied before) sends no byte over the pair.
inline constexpr char kDevicePairReadyKey[] = "shardopt-device-pair-ready";
// What a shard's refusal of a pair it does not hold says, and of a pair
// whose memory is not where the model's numbers are (the trainer
// recognises these and goes another way, opening a new pair later).
inline constexpr char kDevicePairNotOpen[] = "is not open on this shard";
inline constexpr char kDevicePairWrongMemory[] = "keeps its numbers in other memory";
// And of a pair (or OpenDevicePair) on a shard that opens none.
inline constexpr char kDevicePairsOff[] = "opens no device pairs";

class DevicePair {
 public:
  virtual ~DevicePair() = default;
  // `bytes` from `data` (the pair's memory) to the peer, which Recvs as many.
  virtual absl::Status Send(const void* data, size_t bytes, absl::Time deadline,
                            absl::string_view what,
                            const std::function<bool()>& cancelled = nullptr) = 0;
  // `bytes` from the peer into `data` (the pair's memory).
  virtual absl::Status Recv(void* data, size_t bytes, absl::Time deadline, absl::string_view what,
                            const std::function<bool()>& cancelled = nullptr) = 0;
  // `bytes` of the pair's memory that the pair keeps (for bytes received only
  // to be dropped, or parameters read before they are sent); valid until the
  // next call of Scratch.
  virtual absl::StatusOr<void*> Scratch(size_t bytes) = 0;
  // Copies between the pair's memory and host memory (a trainer whose
  // buffers are in host memory uses a device pair through Scratch); done
  // when they return, and ordered before the pair's next transfer.
  virtual absl::Status CopyIn(void* pair_memory, const void* host, size_t bytes) = 0;
  virtual absl::Status CopyOut(void* host, const void* pair_memory, size_t bytes) = 0;
  // The first failure; OK while the pair works.
  virtual const absl::Status& broken() const = 0;
};

class DevicePairKind {
 public:
  virtual ~DevicePairKind() = default;
  virtual const char* name() const = 0;
  virtual PairMemory memory() const = 0;
  // A fresh id (opaque bytes for the peer).
  virtual absl::StatusOr<std::string> NewId() const = 0;
  // Joins the pair `id` names as `rank` (0 the shard, 1 the trainer) on
  // `device` (a CUDA ordinal; ignored by host kinds); waits until the peer
  // has joined too, at most until `deadline` (DEADLINE_EXCEEDED naming
  // `peer`).
  virtual absl::StatusOr<std::unique_ptr<DevicePair>> Connect(absl::string_view id, int rank,
                                                              int device, absl::Time deadline,
                                                              std::string peer) const = 0;

  // Memory of this kind on `device` (host memory for host kinds): what a
  // trainer's buffers in "device memory" are (TrainerClient::StepOnDevice),
  // and synchronous copies between it and host memory.
  virtual absl::StatusOr<std::shared_ptr<void>> Allocate(int device, size_t bytes) const = 0;
  virtual absl::Status CopyToHost(int device, void* host, const void* memory,
                                  size_t bytes) const = 0;
  virtual absl::Status CopyFromHost(int device, void* memory, const void* host,
                                    size_t bytes) const = 0;
};

// The kind called `name` in this build: "loopback" always, "nccl" where the
// build has CUDA (and NCCL loads at run time). NOT_FOUND for another name,
// UNIMPLEMENTED (saying why) for one this build or machine cannot run.
absl::StatusOr<const DevicePairKind*> FindDevicePairKind(absl::string_view name);

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_DEVICE_PAIR_H_
