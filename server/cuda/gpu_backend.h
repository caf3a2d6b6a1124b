// GpuBackend: an UpdateBackend whose shard state lives in GPU memory.
//
// Device memory (plain cudaMalloc): fp32 master parameters, the optimizer
// slots, and one staging buffer per trainer. A received chunk is copied once
// on the host into a pinned buffer (checking for NaN/inf in the same pass)
// and sent to the trainer's staging buffer with cudaMemcpyAsync on that
// trainer's stream; two pinned buffers per trainer alternate, so the copy of
// one chunk overlaps the receipt of the next. Apply() runs one fused kernel
// (server/cuda/fused_optimizers.h) that reduces the trainers' gradients in
// rank order and applies the update: bit-identical to CpuBackend.
//
// Range by range (supports_ranges(), for pipelined steps: StepState): each
// range's work first waits for the trainers' staging copies queued so far
// (Stage returns before its copy lands), then runs the same kernels on the
// range's elements alone, so the bits are those of a whole step.
//
// Reads come back through pinned buffers too: each concurrent reader takes a
// read lane (two pinned buffers, two streams) from a pool, and the copy of one
// piece to the host overlaps the device's copy of the next. The first bf16
// read makes a bf16 copy of the parameters on the device; from then on every
// fused step writes it as well (2 more bytes per parameter), and bf16 pulls
// move half the bytes across PCIe.
//
// Muon (whole 2-D tensors): Apply reduces the trainers' gradients as above,
// then updates each matrix with the elementwise passes of
// server/cuda/muon_kernels.h and its Newton-Schulz products through cuBLAS
// (loaded at first use, server/cuda/cublas.h) in fp32: the CPU backend's
// formulas, within fp32 rounding of its results (the products' summation
// order is cuBLAS's, not OpenBLAS's). No ranges for Muon.
//
// LAMB (tensors whole or in pieces, server/cuda/lamb_plan.h): after the
// reduction a measure pass computes each 64-element block's sums of p^2 and
// u^2 in double in the CPU kernel's order, the host adds them exactly per
// piece (the partials MeasureTrust returns, or, with every tensor whole, the
// norms themselves) and turns the norms into each piece's step size, and an
// apply pass updates: bit-identical to CpuBackend (its kernels' code is
// tested on the host against it, lamb_kernels_emulation_test). No ranges for
// LAMB.
//
// Adafactor (whole tensors, server/cuda/adafactor_step.h): its factors are
// stored packed, as the CPU keeps them (server/optim/packed_slot_extents.h:
// slots_[0] and slots_[1] hold only each tensor's stored elements), and
// each tensor's passes run in the CPU kernel's order, the per-piece sums of
// squares added on the host: bit-identical to CpuBackend (host emulation:
// adafactor_kernels_emulation_test). No ranges for Adafactor.
//
// Every CUDA call is checked; errors come back as absl::Status (a failed
// Apply stops the shard, see ModelShard). Each method makes the backend's GPU
// current on the calling thread first.
#ifndef SHARDOPT_SERVER_CUDA_GPU_BACKEND_H_
#define SHARDOPT_SERVER_CUDA_GPU_BACKEND_H_

#include <array>
#include <atomic>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/optimizer_config.h"
#include "server/cuda/adafactor_step.h"
#include "server/cuda/cublas.h"
#include "server/cuda/device.h"
#include "server/cuda/lamb_plan.h"
#include "server/optim/packed_slot_extents.h"
#include "server/optim/range_tensor.h"
#include "server/update_backend.h"

namespace shardopt {

// A 2-D tensor of the range, whole (Muon's unit).
struct GpuMatrix {
  uint64_t offset = 0;  // Range-local.
  uint64_t rows = 0, cols = 0;
};

class GpuBackend final : public UpdateBackend {
 public:
  // Elements per pinned staging buffer (two per trainer, allocated on the
  // trainer's first push).
  static constexpr size_t kPinnedElements = size_t{1} << 20;
  // Bytes per pinned read buffer (two per read lane), and the most read lanes
  // (so the most pinned read memory: 2 MiB); readers beyond them copy
  // straight into their own memory, as does any reader when pinned memory
  // cannot be had. A quarter of the default 1 MiB pull message, so the
  // pieces of one message overlap.
  static constexpr size_t kReadPieceBytes = size_t{256} << 10;
  static constexpr int kMaxReadLanes = 4;

  // RESOURCE_EXHAUSTED when the state does not fit in the GPU's memory;
  // UNIMPLEMENTED, before taking any device memory, for Muon without a
  // loadable cuBLAS or more than kMaxGradientBuffers trainers. `tensors`:
  // the whole-tensor optimizers' tensors of the range, as the CPU backend
  // gets them (ModelShard::CpuBackendFactory): Muon's and Adafactor's whole
  // (Muon's 2-D), LAMB's pieces (TensorPiecesOfShard); INVALID_ARGUMENT for
  // one outside the range or one their CPU kernel refuses.
  static absl::StatusOr<std::unique_ptr<GpuBackend>> Create(int device_index,
                                                            const OptimizerConfig& optimizer,
                                                            uint32_t num_trainers,
                                                            const std::vector<float>& initial,
                                                            std::vector<RangeTensor> tensors = {});

  // Makes its GPU current and waits for its copies before freeing memory.
  ~GpuBackend() override;

  std::string device() const override;
  absl::StatusOr<size_t> Stage(uint32_t rank, uint64_t offset, const void* data, DType dtype,
                               size_t count) override;
  absl::Status FinishStaging(uint32_t rank) override;
  // The device data plane: staging and parameters in device memory, pushes
  // received there checked by a kernel (gpu_backend_pairs.cc).
  PairMemory own_memory() const override { return PairMemory::kDevice; }
  void* OwnStaging(uint32_t rank, uint64_t offset, uint64_t count) override;
  absl::StatusOr<StagedScan> ScanStaged(uint32_t rank, uint64_t offset, uint64_t count,
                                        absl::Span<const FlatRange> must_be_zero) override;
  absl::Status ReadStaged(uint32_t rank, uint64_t offset, uint64_t count, float* out) override;
  absl::Status ReadOwn(uint64_t offset, uint64_t count, float* own_out) override;
  absl::Status Apply(int64_t step, bool mean, const OptimizerConfig& config) override;
  absl::Status Reduce(bool mean) override;
  absl::StatusOr<double> SumOfSquares(float scale) override;
  absl::Status Update(int64_t step, const OptimizerConfig& config, float multiplier) override;
  bool supports_ranges() const override {
    return cublas_ == nullptr && lamb_ == nullptr && adafactor_ == nullptr;
  }
  bool measures_trust() const override { return lamb_ != nullptr; }
  absl::StatusOr<std::vector<TrustPartial>> MeasureTrust(int64_t step,
                                                         const OptimizerConfig& config,
                                                         float multiplier) override;
  absl::Status UpdateWithTrust(int64_t step, const OptimizerConfig& config, float multiplier,
                               absl::Span<const TensorNorms> norms) override;
  absl::Status ApplyRange(int64_t step, bool mean, const OptimizerConfig& config, uint64_t begin,
                          uint64_t end) override;
  absl::Status ReduceRange(bool mean, uint64_t begin, uint64_t end) override;
  absl::Status SumOfSquaresBlocks(float scale, uint64_t begin, uint64_t end,
                                  double* block_sums) override;
  absl::Status UpdateRange(int64_t step, const OptimizerConfig& config, float multiplier,
                           uint64_t begin, uint64_t end) override;
  absl::Status Read(uint64_t offset, uint64_t count, float* out) override;
  absl::StatusOr<bool> ReadBFloat16(uint64_t offset, uint64_t count, void* out) override;
  absl::Status ReadSlot(int slot, uint64_t offset, uint64_t count, float* out) override;
  absl::Status WriteSlot(int slot, uint64_t offset, uint64_t count, const float* in) override;
  // With the bf16 copy once a bf16 pull has made it.
  uint64_t parameter_bytes() const override {
    return size_ * (sizeof(float) + (bf16_ready_.load() ? sizeof(uint16_t) : 0));
  }
  uint64_t optimizer_state_bytes() const override {
    uint64_t bytes = 0;
    for (const gpu::DeviceBuffer& slot : slots_) bytes += slot.size();
    return bytes;
  }
  // With LAMB's blocks and their sums (0.5 B per element).
  uint64_t staging_bytes() const override {
    return staging_.size() + lamb_blocks_.size() + lamb_weight_sums_.size() +
           lamb_update_sums_.size() + lamb_step_sizes_.size() + adafactor_sums_.size() +
           adafactor_denominators_.size() + adafactor_column_partials_.size();
  }

 private:
  // One reader's path from the device to the host.
  struct ReadLane {
    std::array<gpu::Stream, 2> streams;
    std::array<gpu::PinnedBuffer, 2> pinned;
  };

  // One trainer's path from the network to its staging buffer.
  struct Lane {
    gpu::Stream stream;
    std::array<gpu::PinnedBuffer, 2> pinned;
    std::array<bool, 2> in_flight = {false, false};
    int next = 0;
  };

  GpuBackend(int device_index, const OptimizerConfig& optimizer, size_t size, uint32_t num_trainers)
      : device_index_(device_index),
        optimizer_(optimizer),
        size_(size),
        staging_stride_(StagingStride(size)),
        lanes_(num_trainers) {}

  // One fused launch reducing `count` gradient buffers (each the start of
  // a whole range's buffer) and updating elements [begin, end), then a
  // wait for it.
  absl::Status RunFusedStep(int64_t step, const OptimizerConfig& config,
                            const float* const* gradients, int count, bool mean, uint64_t begin,
                            uint64_t end);
  // The sums of (x[i] * scale)^2 over each kNormBlockElements-block of
  // device x[0, n), each summed in order from its start, into host
  // `block_sums` (one per block), through block_sums_ from `first_block` on.
  absl::Status BlockSumsToHost(const float* x, size_t n, float scale, size_t first_block,
                               double* block_sums);
  // Waits for every trainer's staging copies queued so far.
  absl::Status WaitForStagedCopies();
  // `status`, after waiting (errors ignored) for the work queued on the
  // apply stream when it is an error.
  absl::Status DrainOnError(absl::Status status);
  // Muon's step on every matrix with the gradient in staging(0), already
  // reduced and multiplied (gpu_backend_muon.cc).
  absl::Status MuonStep(const OptimizerConfig& config);
  // Its scratch (two matrices and two Gram matrices of the largest sizes).
  absl::Status AllocateMuonScratch();
  // FAILED_PRECONDITION for Muon, LAMB and Adafactor, which update whole tensors only
  // (the range calls' fused kernels are elementwise).
  absl::Status RefuseRangesOfWholeTensors() const;
  // When a bf16 read made the bf16 copy, converts the parameters into it on
  // the apply stream (the fused kernel writes it itself); then waits for
  // the apply stream.
  absl::Status RefreshBf16CopyAndWait();
  // LAMB (gpu_backend_lamb.cc): its device buffers; FAILED_PRECONDITION
  // (CpuBackend's words) when a piece is not whole; the measure pass with
  // each piece's partial; the apply pass given every tensor's norms; and a
  // whole step from this shard's own norms, on the gradient in staging(0)
  // (reduced) times `multiplier`.
  absl::Status AllocateLambState();
  absl::Status CheckLambOwnNormsSuffice() const;
  absl::StatusOr<std::vector<TrustPartial>> LambMeasureToHost(int64_t step,
                                                              const OptimizerConfig& config,
                                                              float multiplier);
  absl::Status LambApplyWithNorms(int64_t step, const OptimizerConfig& config, float multiplier,
                                  absl::Span<const TensorNorms> norms);
  absl::Status LambStep(int64_t step, const OptimizerConfig& config, float multiplier);
  // Adafactor (gpu_backend_adafactor.cc): its packed slots and scratch;
  // the step on the gradient in staging(0) (reduced, multiplied); the packed
  // slots read and written as slots of the range's size.
  absl::Status AllocateAdafactorState(const std::vector<RangeTensor>& tensors);
  absl::Status AdafactorStep(int64_t step, const OptimizerConfig& config);
  absl::Status ReadPackedSlot(int slot, uint64_t offset, uint64_t count, float* out);
  absl::Status WritePackedSlot(int slot, uint64_t offset, uint64_t count, const float* in);
  absl::Status CheckSlot(int slot, uint64_t offset, uint64_t count) const;
  // OUT_OF_RANGE naming `what` unless [offset, offset + count) is in the range.
  absl::Status CheckRange(const char* what, uint64_t offset, uint64_t count) const;
  // Copies `bytes` from device memory to `host_dst` (any memory) through a
  // read lane's pinned buffers.
  absl::Status ReadThroughPinned(const void* device_src, size_t bytes, void* host_dst);
  // An idle or new read lane; nullptr when kMaxReadLanes are busy.
  absl::StatusOr<std::unique_ptr<ReadLane>> TakeReadLane();
  void ReturnReadLane(std::unique_ptr<ReadLane> lane);
  float* staging(uint32_t rank) const { return staging_.as<float>() + rank * staging_stride_; }
  // Each trainer's buffer starts on a 256-byte boundary whatever size_ is:
  // the fused kernel takes its float4 path only when every gradient buffer
  // has the parameters' alignment.
  static size_t StagingStride(size_t size) { return (size + 63) / 64 * 64; }

  const int device_index_;
  const OptimizerConfig optimizer_;
  const size_t size_;
  const size_t staging_stride_;  // floats from one trainer's staging buffer to the next
  gpu::DeviceBuffer params_;
  std::array<gpu::DeviceBuffer, 3> slots_;
  gpu::DeviceBuffer staging_;  // num_trainers x staging_stride_ floats.
  gpu::Stream apply_stream_;
  gpu::Stream read_stream_;
  std::vector<Lane> lanes_;
  absl::Mutex read_lanes_mu_;
  std::vector<std::unique_ptr<ReadLane>> idle_read_lanes_ ABSL_GUARDED_BY(read_lanes_mu_);
  int read_lanes_made_ ABSL_GUARDED_BY(read_lanes_mu_) = 0;
  // The bf16 copy of the parameters, made by the first bf16 read. Updates
  // of ranges run while other ranges are read: each holds bf16_mu_, so that
  // the copy is made between two range updates, never during one.
  absl::Mutex bf16_mu_;
  gpu::DeviceBuffer params_bf16_;
  std::atomic<bool> bf16_ready_{false};
  bool bf16_unavailable_ ABSL_GUARDED_BY(bf16_mu_) = false;  // The GPU had no room for it.
  // SumOfSquares' per-block sums, allocated with the rest of the state, so a
  // step with gradient control allocates nothing.
  gpu::DeviceBuffer block_sums_;
  // ScanStaged's results and spans (pushes of several trainers may be
  // scanned at once: one at a time here, each a few microseconds).
  absl::Mutex scan_mu_;
  gpu::DeviceBuffer scan_buffer_ ABSL_GUARDED_BY(scan_mu_);
  // Muon only.
  std::vector<GpuMatrix> matrices_;
  std::unique_ptr<gpu::Cublas> cublas_;
  gpu::DeviceBuffer muon_x_, muon_y_, muon_gram_, muon_poly_;
  // LAMB only: the plan, its blocks on the device, their sums, and the
  // pieces' step sizes.
  std::unique_ptr<gpu::LambPlan> lamb_;
  gpu::DeviceBuffer lamb_blocks_, lamb_weight_sums_, lamb_update_sums_, lamb_step_sizes_;
  // The block sums' way to the host (weight sums, then update sums).
  gpu::PinnedBuffer lamb_host_sums_;
  // Adafactor only: where slots_[0] and slots_[1] keep each tensor's
  // elements, the plan, and its scratch.
  std::array<PackedSlotExtents, 2> packed_;
  std::unique_ptr<gpu::AdafactorPlan> adafactor_;
  gpu::DeviceBuffer adafactor_sums_, adafactor_denominators_, adafactor_column_partials_;
  gpu::PinnedBuffer adafactor_host_sums_;
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_CUDA_GPU_BACKEND_H_
