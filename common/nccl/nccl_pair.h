// NcclPair: a two-rank NCCL communicator between one trainer and one shard
// server, the GPU data plane of that pair (issue "The data plane"): the
// shard makes the unique id (NewUniqueId) and hands it to the trainer over
// gRPC; both Connect with it, the shard as rank 0 and the trainer as rank 1,
// each on its own CUDA device; then Send and Recv move device bytes straight
// between them.
//
// Contract: every call has a deadline and never hangs. Communicators are
// non-blocking (ncclConfig_t.blocking = 0): a call polls NCCL's state and
// its stream until the work is done, NCCL reports an error, or the deadline
// passes; then it aborts the communicator (ncclCommAbort ends the transfer
// kernels a dead or stalled peer would keep spinning) and returns
// DEADLINE_EXCEEDED or UNAVAILABLE saying what it waited for (`what`, e.g.
// "push of trainer 1 step 7 from shard 0"). A pair that failed is broken:
// every later call fails at once with the first failure, and the caller
// drops it (its transfers go over gRPC). A peer lost mid-call is
// UNAVAILABLE whatever NCCL's own code for it; INTERNAL is left for misuse.
// It is the "nccl" DevicePair (common/device_pair.h; NcclPairKind below).
// Not thread-safe: one thread at a time per pair. Pairs are independent,
// with one bound: ncclCommAbort frees device memory, which may wait for
// another pair's kernel of the same process, so an abort can last until
// that pair's own call ends (by its deadline at the latest). Calls select
// `device` as the calling thread's current CUDA device and leave it so.
//
// Two processes of one host on one GPU: NCCL refuses them as ranks of one
// host ("Duplicate GPU detected") unless each has its own NCCL_HOSTID, with
// which it treats them as separate hosts and uses its socket transport (the
// tests and tools/gpu_check.sh do that).
#ifndef SHARDOPT_COMMON_NCCL_NCCL_PAIR_H_
#define SHARDOPT_COMMON_NCCL_NCCL_PAIR_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/device_pair.h"
#include "common/nccl/nccl_library.h"

namespace shardopt::nccl {

inline constexpr size_t kUniqueIdBytes = sizeof(ncclUniqueId);

class NcclPair final : public DevicePair {
 public:
  // UNIMPLEMENTED when NCCL cannot be loaded (NcclLibrary::Load's reason).
  static absl::Status Available();
  // A fresh unique id (kUniqueIdBytes opaque bytes, to send to the peer).
  static absl::StatusOr<std::string> NewUniqueId();
  // Joins the pair `unique_id` names as `rank` (0 the shard, 1 the
  // trainer) on CUDA device `device`; waits until the peer has joined too.
  // INVALID_ARGUMENT for a malformed id or rank; DEADLINE_EXCEEDED naming
  // `peer` when it does not join in time.
  static absl::StatusOr<std::unique_ptr<NcclPair>> Connect(absl::string_view unique_id, int rank,
                                                           int device, absl::Time deadline,
                                                           std::string peer);
  ~NcclPair() override;
  NcclPair(const NcclPair&) = delete;
  NcclPair& operator=(const NcclPair&) = delete;

  // `bytes` of device memory to the peer, which must Recv as many.
  absl::Status Send(const void* device_data, size_t bytes, absl::Time deadline,
                    absl::string_view what,
                    const std::function<bool()>& cancelled = nullptr) override;
  // `bytes` from the peer into device memory.
  absl::Status Recv(void* device_data, size_t bytes, absl::Time deadline, absl::string_view what,
                    const std::function<bool()>& cancelled = nullptr) override;
  // Device memory on the pair's device, kept (and grown) for reuse.
  absl::StatusOr<void*> Scratch(size_t bytes) override;
  // Synchronous copies between host memory and the pair's device memory.
  absl::Status CopyIn(void* device_data, const void* host, size_t bytes) override;
  absl::Status CopyOut(void* host, const void* device_data, size_t bytes) override;

  int rank() const { return rank_; }
  int device() const { return device_; }
  const std::string& peer() const { return peer_; }
  // The first failure; OK while the pair works.
  const absl::Status& broken() const override { return broken_; }
  // The pair's CUDA stream (a cudaStream_t): transfers run on it.
  void* stream() const { return stream_; }

 private:
  NcclPair(const NcclLibrary* library, int rank, int device, std::string peer)
      : library_(library), rank_(rank), device_(device), peer_(std::move(peer)) {}
  // Polls until NCCL's state leaves ncclInProgress and, with `stream_work`,
  // the stream has run dry; aborts and breaks the pair on error or deadline.
  // `cancelled` (when given) ends the wait early: the pair is aborted.
  absl::Status Await(bool stream_work, absl::Time deadline, absl::string_view what,
                     const std::function<bool()>& cancelled = nullptr);
  absl::Status Transfer(bool send, void* device_data, size_t bytes, absl::Time deadline,
                        absl::string_view what, const std::function<bool()>& cancelled);
  // Records the first failure and aborts the communicator.
  absl::Status Break(absl::Status failure);

  const NcclLibrary* const library_;
  const int rank_;
  const int device_;
  const std::string peer_;
  ncclComm_t comm_ = nullptr;  // Null once broken: ncclCommAbort freed it.
  void* stream_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  absl::Status broken_;
};

// The "nccl" kind: NewId is NcclPair::NewUniqueId, Connect NcclPair::Connect.
const DevicePairKind& NcclPairKind();

}  // namespace shardopt::nccl

#endif  // SHARDOPT_COMMON_NCCL_NCCL_PAIR_H_
