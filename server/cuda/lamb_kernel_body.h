// Internal to //server/cuda: the per-thread code of LAMB's kernels, written
// once for the device (lamb_kernels.cu) and the host
// (lamb_kernels_emulated.cc, which runs it thread after thread over a
// simulated grid, so that indexing and operation order are tested without a
// GPU). The fp32 operations are fused_kernel_body.h's Add / Mul / Div /
// Sqrt; the measure pass's double sums are lane_squares_body.h's, so that
// they are SumOfSquares' bits.
#ifndef SHARDOPT_SERVER_CUDA_LAMB_KERNEL_BODY_H_
#define SHARDOPT_SERVER_CUDA_LAMB_KERNEL_BODY_H_

#include "server/cuda/fused_kernel_body.h"
#include "server/cuda/lamb_kernels.h"
#include "server/cuda/lane_squares_body.h"

namespace shardopt {
namespace gpu {
namespace internal {
namespace body {

// The gradient as the CPU kernel reads it (multiplied, then negated).
SHARDOPT_KERNEL_FN float LambGradient(const LambKernelScalars& s, float grad) {
  const float scaled = Mul(grad, s.multiplier);
  return s.maximize ? -scaled : scaled;
}

// m' = beta1 m + (1 - beta1) g; v' = beta2 v + ((1 - beta2) g) g;
// returns u = (m' / c1) / (sqrt(v' / c2) + eps) + weight_decay p.
SHARDOPT_KERNEL_FN float LambMoments(const LambKernelScalars& s, float g, float p, float& m,
                                     float& v) {
  m = Add(Mul(s.beta1, m), Mul(s.one_minus_beta1, g));
  v = Add(Mul(s.beta2, v), Mul(Mul(s.one_minus_beta2, g), g));
  return Add(Div(Div(m, s.c1), Add(Sqrt(Div(v, s.c2)), s.eps)), Mul(s.weight_decay, p));
}

// The measure pass as a lane_squares_body.h job: run b is trust block b,
// its values p and u (the direction, from the moments as LambApply will
// compute them), summed in SumOfSquares' order.
struct LambMeasureJob {
  static constexpr int kValues = 2;
  static constexpr int kBatch = 8;
  struct Raw {
    float p, g, m, v;
  };
  LambMeasureArgs a;

  SHARDOPT_KERNEL_FN size_t runs() const { return a.num_blocks; }
  SHARDOPT_KERNEL_FN void Describe(size_t b, StagedRun& r) const {
    const TrustBlock block = a.blocks[b];
    r.start = block.begin;
    r.count = block.count;
  }
  SHARDOPT_KERNEL_FN void Load(const StagedRun& r, size_t k, Raw& raw) const {
    const size_t i = r.start + k;
    raw.p = a.params[i];
    raw.g = a.grad[i];
    raw.m = a.exp_avg[i];
    raw.v = a.exp_avg_sq[i];
  }
  SHARDOPT_KERNEL_FN void Values(const Raw& raw, float (&v)[2]) const {
    float m = raw.m, sq = raw.v;
    v[0] = raw.p;
    v[1] = LambMoments(a.s, LambGradient(a.s, raw.g), raw.p, m, sq);
  }
  SHARDOPT_KERNEL_FN void Write(size_t b, const double (&sums)[2]) const {
    a.weight_squares[b] = sums[0];
    a.update_squares[b] = sums[1];
  }
};

// Work item w is element w % 64 of block w / 64 (idle past the block's
// count): neighbouring threads touch neighbouring elements.
SHARDOPT_KERNEL_FN void LambApplyThread(const LambApplyArgs& a, size_t tid, size_t threads) {
  const size_t items = a.num_blocks * kLambBlockElements;
  for (size_t w = tid; w < items; w += threads) {
    const TrustBlock block = a.blocks[w / kLambBlockElements];
    const uint32_t k = static_cast<uint32_t>(w % kLambBlockElements);
    if (k >= block.count) continue;
    const size_t i = block.begin + k;
    float m = a.exp_avg[i], v = a.exp_avg_sq[i];
    const float p = a.params[i];
    const float u = LambMoments(a.s, LambGradient(a.s, a.grad[i]), p, m, v);
    a.exp_avg[i] = m;
    a.exp_avg_sq[i] = v;
    a.params[i] = Add(p, -Mul(a.step_sizes[block.piece], u));
  }
}

}  // namespace body
}  // namespace internal
}  // namespace gpu
}  // namespace shardopt

#endif  // SHARDOPT_SERVER_CUDA_LAMB_KERNEL_BODY_H_
