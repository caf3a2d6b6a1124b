// Internal to //server/cuda: the per-thread code of LAMB's kernels, written
// once for the device (lamb_kernels.cu) and the host
// (lamb_kernels_emulated.cc, which runs it thread after thread over a
// simulated grid, so that indexing and operation order are tested without a
// GPU). The fp32 operations are fused_kernel_body.h's Add / Mul / Div /
// Sqrt; the double ones below are __dadd_rn / __dmul_rn on the device, plain
// on the host (-ffp-contract=off), so that the sums are SumOfSquares' bits.
#ifndef SHARDOPT_SERVER_CUDA_LAMB_KERNEL_BODY_H_
#define SHARDOPT_SERVER_CUDA_LAMB_KERNEL_BODY_H_

#include "server/cuda/fused_kernel_body.h"
#include "server/cuda/lamb_kernels.h"

namespace shardopt {
namespace gpu {
namespace internal {
namespace body {

SHARDOPT_KERNEL_FN double AddD(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

SHARDOPT_KERNEL_FN double SquareD(float x) {
  const double d = static_cast<double>(x);
#if defined(__CUDA_ARCH__)
  return __dmul_rn(d, d);
#else
  return d * d;
#endif
}

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

// SumOfSquares (server/optim/optimizer_internal.h) of value(0), ...,
// value(n - 1): eight lanes over the whole groups of eight (lane j takes
// values j, j + 8, ...), the lanes added in order, then the rest one by one.
template <typename Value>
SHARDOPT_KERNEL_FN double LaneSquaresOf(size_t n, const Value& value) {
  double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    SHARDOPT_UNROLL
    for (size_t j = 0; j < 8; ++j) lanes[j] = AddD(lanes[j], SquareD(value(i + j)));
  }
  double sum = 0;
  SHARDOPT_UNROLL
  for (size_t j = 0; j < 8; ++j) sum = AddD(sum, lanes[j]);
  for (; i < n; ++i) sum = AddD(sum, SquareD(value(i)));
  return sum;
}

// Block b's squares of p and of u, each in SumOfSquares' order.
SHARDOPT_KERNEL_FN void LambMeasureBlock(const LambMeasureArgs& a, size_t b) {
  const TrustBlock block = a.blocks[b];
  a.weight_squares[b] =
      LaneSquaresOf(block.count, [&](size_t k) { return a.params[block.begin + k]; });
  a.update_squares[b] = LaneSquaresOf(block.count, [&](size_t k) {
    const size_t i = block.begin + k;
    float m = a.exp_avg[i], v = a.exp_avg_sq[i];
    return LambMoments(a.s, LambGradient(a.s, a.grad[i]), a.params[i], m, v);
  });
}

SHARDOPT_KERNEL_FN void LambMeasureThread(const LambMeasureArgs& a, size_t tid, size_t threads) {
  for (size_t b = tid; b < a.num_blocks; b += threads) LambMeasureBlock(a, b);
}

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
