// LAMB's two passes on the GPU, over trust blocks (server/optim/lamb.cc's
// formulas, term by term; IEEE operations, no contraction):
//   LambMeasure: per block, m' and v' from the gradient, the direction u,
//     and the sums of p^2 and u^2 in double in SumOfSquares' order
//     (server/optim/optimizer_internal.h: eight lanes, then the tail), a
//     warp per 32 blocks read coalesced (lane_squares_body.h); writes those
//     sums, changes nothing else.
//   LambApply: per element, the moments and p -= step_sizes[piece] * u.
// The gradient each reads is grad * multiplier, negated when maximizing (as
// the CPU backend multiplies it in place). Plain C++: device pointers,
// streams as `void*`; asynchronous, errors of the launch only. The same
// declarations are implemented on host memory by lamb_kernels_emulated.cc.
#ifndef SHARDOPT_SERVER_CUDA_LAMB_KERNELS_H_
#define SHARDOPT_SERVER_CUDA_LAMB_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace shardopt {
namespace gpu {

// The elements of one norm block: up to 64 (kTrustBlockElements) of one
// tensor piece, counted from the piece's first element.
struct TrustBlock {
  uint64_t begin;  // Range-local index of its first element.
  uint32_t count;  // 1..64
  uint32_t piece;  // Its piece, in the range's piece order.
};
inline constexpr uint32_t kLambBlockElements = 64;

// server/optim/lamb_rules.h's LambScalars, and the gradient's treatment.
struct LambKernelScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, c1, c2, eps, weight_decay;
  float multiplier;
  int maximize;
};

struct LambMeasureArgs {
  const TrustBlock* blocks;
  size_t num_blocks;
  const float* params;
  const float* grad;
  const float* exp_avg;
  const float* exp_avg_sq;
  LambKernelScalars s;
  double* weight_squares;  // [num_blocks]
  double* update_squares;  // [num_blocks]
};

struct LambApplyArgs {
  const TrustBlock* blocks;
  size_t num_blocks;
  float* params;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  LambKernelScalars s;
  const float* step_sizes;  // [pieces]
};

absl::Status LambMeasure(const LambMeasureArgs& args, void* stream);
absl::Status LambApply(const LambApplyArgs& args, void* stream);

}  // namespace gpu
}  // namespace shardopt

#endif  // SHARDOPT_SERVER_CUDA_LAMB_KERNELS_H_
