// LambPlan: the host half of LAMB on the GPU backend. From the range's
// tensor pieces (those CpuBackend gets: TensorPiecesOfShard) it makes the
// trust blocks LAMB's kernels walk (lamb_kernels.h: 64 elements counted
// from each piece's start, as server/optim/lamb.cc counts them), and turns
// the kernels' per-block sums into what the CPU backend returns and uses:
// each piece's TrustPartial (the blocks' sums added exactly, so the same
// bits however the blocks are grouped) and each piece's step size from its
// tensor's norms (server/optim/lamb_rules.h). Host code and data only;
// tested against the CPU backend with the emulated kernels.
#ifndef SHARDOPT_SERVER_CUDA_LAMB_PLAN_H_
#define SHARDOPT_SERVER_CUDA_LAMB_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/optimizer_config.h"
#include "common/step_protocol.h"
#include "server/cuda/lamb_kernels.h"

namespace shardopt {
namespace gpu {

// One tensor's elements in the range, whole or a piece of it.
struct LambPiece {
  uint64_t offset = 0;  // Range-local.
  uint64_t size = 0;
  uint32_t tensor_index = 0;  // In the layout.
  bool whole = true;
};

class LambPlan {
 public:
  // `pieces` as CheckRangeTensors (server/optim/range_tensor.h) accepts
  // them for LAMB: pieces starting on a norm block of their tensor, naming
  // distinct layout tensors in order.
  explicit LambPlan(std::vector<LambPiece> pieces);

  const std::vector<TrustBlock>& blocks() const { return blocks_; }
  size_t piece_count() const { return pieces_.size(); }
  // A piece is not its whole tensor: the step's norms come from every
  // shard (UpdateBackend::MeasureTrust / UpdateWithTrust), not this one.
  bool needs_every_shards_norms() const { return needs_every_shards_norms_; }

  // Each piece's partial from the blocks' sums (one of each per block);
  // over kBlocksPerPartialThread blocks, on up to kMaxPartialThreads threads.
  static constexpr size_t kBlocksPerPartialThread = size_t{1} << 16;
  static constexpr size_t kMaxPartialThreads = 8;
  std::vector<TrustPartial> Partials(const double* weight_squares,
                                     const double* update_squares) const;
  // Each piece's float(lr * trust ratio) from `norms` (by layout tensor);
  // INVALID_ARGUMENT when a piece's tensor has none, as CpuBackend says it.
  absl::StatusOr<std::vector<float>> StepSizes(const OptimizerConfig& config,
                                               absl::Span<const TensorNorms> norms) const;
  // The norms of tensors held whole, from this shard's own partials.
  static std::vector<TensorNorms> OwnNorms(const std::vector<TrustPartial>& partials);
  // Step `step`'s scalars (LambScalarsOf) with the gradient's multiplier.
  static LambKernelScalars Scalars(const OptimizerConfig& config, int64_t step, float multiplier);

 private:
  // Adds blocks [first, last) into `into` (one partial per piece).
  void AddBlocks(size_t first, size_t last, const double* weight_squares,
                 const double* update_squares, std::vector<TrustPartial>* into) const;

  std::vector<LambPiece> pieces_;
  std::vector<TrustBlock> blocks_;
  bool needs_every_shards_norms_ = false;
};

}  // namespace gpu
}  // namespace shardopt

#endif  // SHARDOPT_SERVER_CUDA_LAMB_PLAN_H_
