// CpuBackend: an UpdateBackend in host memory, updating on a ThreadPool.
//
// Staging copies each chunk once, checking for NaN/inf in the same pass.
// Apply() walks the range in cache-sized blocks: each block is reduced over
// the trainers (in rank order) and then updated by the optimizer while it is
// still in cache, the blocks spread over the pool's threads. The result does
// not depend on the number of threads or on how the range is split.
#ifndef SHARDOPT_SERVER_CPU_BACKEND_H_
#define SHARDOPT_SERVER_CPU_BACKEND_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/optimizer_config.h"
#include "server/optim/optimizer.h"
#include "server/parallel_for.h"
#include "server/update_backend.h"

namespace shardopt {

class CpuBackend final : public UpdateBackend {
 public:
  // Elements reduced and updated together, small enough to stay in L2
  // between the reduction and the optimizer pass.
  static constexpr size_t kBlockElements = 8192;
  // Pieces handed to threads start on 64-byte boundaries.
  static constexpr size_t kGrainElements = 16;

  // `initial_params` holds the whole range. `pool` must outlive the backend.
  // `tensors`: the range's whole tensors, which whole-tensor optimizers
  // (LAMB, Adafactor, Muon) need (LAMB: its tensor pieces, whole or not);
  // they update one tensor per thread (LAMB: parts of tensors), and take
  // whole-range calls only (supports_ranges() is false for them).
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(const OptimizerConfig& optimizer,
                                                            uint32_t num_trainers,
                                                            std::vector<float> initial_params,
                                                            ThreadPool* pool,
                                                            std::vector<RangeTensor> tensors = {});

  std::string device() const override { return "cpu"; }
  absl::StatusOr<size_t> Stage(uint32_t rank, uint64_t offset, const void* data, DType dtype,
                               size_t count) override;
  float* HostStaging(uint32_t rank, uint64_t offset, uint64_t count) override;
  absl::Status FinishStaging(uint32_t rank) override { return absl::OkStatus(); }
  absl::Status Apply(int64_t step, bool mean, const OptimizerConfig& config) override;
  absl::Status Reduce(bool mean) override;
  absl::StatusOr<double> SumOfSquares(float scale) override;
  absl::Status Update(int64_t step, const OptimizerConfig& config, float multiplier) override;
  bool supports_ranges() const override { return !optimizer_->needs_whole_tensors(); }
  bool supports_one_trainer_updates() const override { return true; }
  absl::Status ApplyRange(int64_t step, bool mean, const OptimizerConfig& config, uint64_t begin,
                          uint64_t end) override;
  absl::Status ReduceRange(bool mean, uint64_t begin, uint64_t end) override;
  absl::Status ApplyOneRange(uint32_t rank, int64_t step, const OptimizerConfig& config,
                             float multiplier, uint64_t begin, uint64_t end) override;
  absl::Status SumOfSquaresBlocks(float scale, uint64_t begin, uint64_t end,
                                  double* block_sums) override;
  absl::Status UpdateRange(int64_t step, const OptimizerConfig& config, float multiplier,
                           uint64_t begin, uint64_t end) override;
  bool measures_trust() const override { return optimizer_->measures_trust(); }
  absl::StatusOr<std::vector<TrustPartial>> MeasureTrust(int64_t step,
                                                         const OptimizerConfig& config,
                                                         float multiplier) override;
  absl::Status UpdateWithTrust(int64_t step, const OptimizerConfig& config, float multiplier,
                               absl::Span<const TensorNorms> norms) override;
  absl::Status Read(uint64_t offset, uint64_t count, float* out) override;
  const float* HostParameters(uint64_t offset, uint64_t count) const override;
  absl::Status ReadSlot(int slot, uint64_t offset, uint64_t count, float* out) override;
  absl::Status WriteSlot(int slot, uint64_t offset, uint64_t count, const float* in) override;
  uint64_t parameter_bytes() const override { return params_.size() * sizeof(float); }
  uint64_t optimizer_state_bytes() const override { return optimizer_->state_bytes(); }
  uint64_t staging_bytes() const override {
    return staging_.size() * params_.size() * sizeof(float);
  }

 private:
  CpuBackend(std::vector<float> params, std::unique_ptr<Optimizer> optimizer, uint32_t num_trainers,
             ThreadPool* pool);

  absl::Status CheckSlot(int slot, uint64_t offset, uint64_t count) const;
  absl::Status CheckRange(uint64_t begin, uint64_t end) const;
  // Whole-tensor optimizers: OK only for the whole range.
  absl::Status CheckWholeRange(uint64_t begin, uint64_t end) const;
  // Step `step` of a whole-tensor optimizer on gradient `gradient`, one
  // tensor per task (LAMB: in trust parts, with each tensor's own norms);
  // FAILED_PRECONDITION when some tensor is only a piece (LAMB on the flat
  // partition: its steps need norms from other shards).
  absl::Status UpdateWholeTensors(int64_t step, const float* gradient);
  // FAILED_PRECONDITION when some tensor is only a piece (see above): the
  // whole-step calls refuse before they touch anything.
  absl::Status CheckOwnNormsSuffice() const;
  // LAMB's trust parts: the partials of `gradient` * multiplier, one per
  // piece of optimizer_->tensors(); then the update with given norms.
  std::vector<TrustPartial> MeasureParts(int64_t step, const float* gradient, float multiplier);
  void UpdateParts(int64_t step, const float* gradient, absl::Span<const TensorNorms> norms);
  // The element-wise update of [first, last) from `gradient`, multiplied in
  // place by `multiplier` block by block first (the fp32 product the kernels
  // read), on the pool.
  void UpdateBlocks(int64_t step, float* gradient, float multiplier, uint64_t first, uint64_t last);
  // Multiplies the reduced gradient in place (the fp32 product the kernels read).
  void MultiplyGradient(float multiplier, uint32_t rank = 0);

  // LAMB's work split: block-aligned parts of each piece, of at most
  // kTrustPartElements, handed to threads.
  struct TrustPart {
    size_t piece;
    uint64_t begin, end;
  };
  static constexpr uint64_t kTrustPartElements = 1 << 16;

  ThreadPool* const pool_;
  std::vector<float> params_;
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<std::vector<float>> staging_;  // One per trainer.
  std::vector<TrustPart> trust_parts_;       // LAMB only.
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_CPU_BACKEND_H_
