// Internal to //server/cuda: the per-element code of the fused optimizer
// kernels, written once for the device (fused_kernels.cu) and the host
// (fused_kernels_emulated.cc, which runs the very same code over a simulated
// grid so that indexing and operation order are tested without a GPU).
//
// Bit-exactness with server/optim: every multiply, add, divide and square
// root is one of Add / Mul / Div / Sqrt below. On the device they are the
// IEEE round-to-nearest intrinsics __fadd_rn, __fmul_rn, __fdiv_rn and
// __fsqrt_rn, which nvcc never contracts into an FMA and which do not depend
// on -use_fast_math / -prec-div / -prec-sqrt / -ftz (the build passes
// -fmad=false too). On the host they are plain fp32 operations: compile with
// -ffp-contract=off (as server/optim is). The order of the operations is
// that of the CPU kernels (server/optim/{sgd,adam,adagrad,lion}.cc), term by
// term.
//
// A launch covers the whole range with one grid: a grid-stride loop over
// float4 groups (vectorized) or single elements (otherwise). In the
// vectorized case, threads 0..head-1 also do the elements before the first
// 16-byte boundary and threads 0..tail-1 the elements after the last group.
#ifndef SHARDOPT_SERVER_CUDA_FUSED_KERNEL_BODY_H_
#define SHARDOPT_SERVER_CUDA_FUSED_KERNEL_BODY_H_

#include <vector_types.h>  // float4, uint2 (host and device)

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "server/cuda/bf16_bits.h"
#include "server/cuda/fused_kernels.h"

// `#pragma unroll` for nvcc only (g++ -Wall warns about unknown pragmas).
#if defined(__CUDACC__)
#define SHARDOPT_UNROLL _Pragma("unroll")
#define SHARDOPT_UNROLL4 _Pragma("unroll 4")
#else
#define SHARDOPT_UNROLL
#define SHARDOPT_UNROLL4
#endif

#if defined(__CUDA_ARCH__)
#define SHARDOPT_KERNEL_FN __device__ __forceinline__
#elif defined(__CUDACC__)
#define SHARDOPT_KERNEL_FN __host__ __device__ __forceinline__
#else
#define SHARDOPT_KERNEL_FN inline
#endif

namespace shardopt {
namespace gpu {
namespace internal {
namespace body {

SHARDOPT_KERNEL_FN float Add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

SHARDOPT_KERNEL_FN float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

SHARDOPT_KERNEL_FN float Div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

SHARDOPT_KERNEL_FN float Sqrt(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

SHARDOPT_KERNEL_FN uint32_t FloatBits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

// torch.maximum: NaN if either is NaN, else the larger (as TorchMaximum in
// server/optim/optimizer_internal.h).
SHARDOPT_KERNEL_FN float TorchMaximum(float a, float b) { return (a < b || b != b) ? b : a; }

// TorchLerp (server/optim/optimizer_internal.h), operation by operation
// (a - b as a + -b: the same IEEE operation).
SHARDOPT_KERNEL_FN float TorchLerp(float self, float end, float weight) {
  return fabsf(weight) < 0.5f ? Add(self, Mul(weight, Add(end, -self)))
                              : Add(end, -Mul(Add(end, -self), Add(1.0f, -weight)));
}

SHARDOPT_KERNEL_FN uint16_t ToBf16(float x) { return Fp32BitsToBf16Bits(FloatBits(x)); }

// float4 group j of the buffer whose element `base` is 16-byte aligned (the
// host's plan guarantees it).
SHARDOPT_KERNEL_FN void Load4(const float* p, size_t base, size_t j, float (&out)[4]) {
  const float4 v = reinterpret_cast<const float4*>(p + base)[j];
  out[0] = v.x;
  out[1] = v.y;
  out[2] = v.z;
  out[3] = v.w;
}

SHARDOPT_KERNEL_FN void Store4(float* p, size_t base, size_t j, const float (&in)[4]) {
  float4 v;
  v.x = in[0];
  v.y = in[1];
  v.z = in[2];
  v.w = in[3];
  reinterpret_cast<float4*>(p + base)[j] = v;
}

// Four bf16 values as one 8-byte store (element `base` of p is 8-byte aligned).
SHARDOPT_KERNEL_FN void StoreBf16x4(uint16_t* p, size_t base, size_t j, const float (&in)[4]) {
  uint2 r;
  r.x = static_cast<uint32_t>(ToBf16(in[0])) | (static_cast<uint32_t>(ToBf16(in[1])) << 16);
  r.y = static_cast<uint32_t>(ToBf16(in[2])) | (static_cast<uint32_t>(ToBf16(in[3])) << 16);
  reinterpret_cast<uint2*>(p + base)[j] = r;
}

// (a) of fused_optimizers.h: ModelShard::ApplyStep's reduction
// (sum = g0; sum += g1; ...; sum /= float(T)).
SHARDOPT_KERNEL_FN float ReduceOne(const GradArgs& g, size_t i) {
  float s = g.ptr[0][i];
  for (int t = 1; t < g.count; ++t) s = Add(s, g.ptr[t][i]);
  if (g.divide) s = Div(s, g.divisor);
  return s;
}

SHARDOPT_KERNEL_FN void ReduceFour(const GradArgs& g, size_t base, size_t j, float (&s)[4]) {
  Load4(g.ptr[0], base, j, s);
  SHARDOPT_UNROLL4
  for (int t = 1; t < g.count; ++t) {
    float x[4];
    Load4(g.ptr[t], base, j, x);
    SHARDOPT_UNROLL
    for (int k = 0; k < 4; ++k) s[k] = Add(s[k], x[k]);
  }
  if (g.divide) {
    SHARDOPT_UNROLL
    for (int k = 0; k < 4; ++k) s[k] = Div(s[k], g.divisor);
  }
}

// ---------------------------------------------------------------------------
// Per-element updates, term by term as in server/optim.

// sgd.cc: Grad + SgdPlain / SgdMomentum.
template <bool kMomentum>
SHARDOPT_KERNEL_FN void SgdElement(const SgdScalars& s, float grad, float& p, float& buf) {
  float g = s.maximize ? -grad : grad;
  if (s.has_weight_decay) g = Add(g, Mul(s.weight_decay, p));
  if (kMomentum) {
    const float b = s.first_step ? g : Add(Mul(buf, s.momentum), Mul(s.one_minus_dampening, g));
    buf = b;
    g = s.nesterov ? Add(g, Mul(s.momentum, b)) : b;
  }
  p = Add(p, Mul(s.neg_lr, g));
}

// adam.cc: AdamKernel.
template <bool kAmsgrad>
SHARDOPT_KERNEL_FN void AdamElement(const AdamScalars& s, float grad, float& p, float& m, float& v,
                                    float& vmax) {
  float g = s.maximize ? -grad : grad;
  float param = p;
  if (s.l2) g = Add(g, Mul(s.weight_decay, param));
  if (s.decoupled) param = Mul(param, s.decay);
  const float m_new = Add(Mul(m, s.beta1), Mul(s.one_minus_beta1, g));
  const float v_new = Add(Mul(v, s.beta2), Mul(Mul(s.one_minus_beta2, g), g));
  m = m_new;
  v = v_new;
  float v_hat = v_new;
  if (kAmsgrad) {
    v_hat = TorchMaximum(vmax, v_new);
    vmax = v_hat;
  }
  const float denom = Add(Div(Sqrt(v_hat), s.bias_correction2_sqrt), s.eps);
  p = Add(param, Div(Mul(s.neg_step_size, m_new), denom));
}

// adagrad.cc: AdagradKernel.
SHARDOPT_KERNEL_FN void AdagradElement(const AdagradScalars& s, float grad, float& p, float& sum) {
  float g = s.maximize ? -grad : grad;
  if (s.has_weight_decay) g = Add(g, Mul(s.weight_decay, p));
  const float acc = Add(sum, Mul(g, g));
  sum = acc;
  const float std_dev = Add(Sqrt(acc), s.eps);
  p = Add(p, Div(Mul(s.neg_clr, g), std_dev));
}

// lion.cc: LionKernel. torch.sign of the interpolation, zero for zero.
SHARDOPT_KERNEL_FN void LionElement(const LionScalars& s, float grad, float& p, float& m) {
  const float g = s.maximize ? -grad : grad;
  float x = p;
  if (s.has_weight_decay) x = Mul(x, s.decay);
  const float c = Add(Mul(m, s.beta1), Mul(s.one_minus_beta1, g));
  const float sign = static_cast<float>((c > 0.0f) - (c < 0.0f));
  p = Add(x, Mul(s.neg_lr, sign));
  m = Add(Mul(m, s.beta2), Mul(s.one_minus_beta2, g));
}

// ---------------------------------------------------------------------------
// One element (…One, at index i) or one float4 group (…Four, group j after
// the head) of each family: load, update, store. Every parameter and state
// element is read once and written once.

template <bool kBf16, bool kMomentum>
SHARDOPT_KERNEL_FN void SgdOne(const SgdArgs& a, size_t i) {
  const float g = ReduceOne(a.grads, i);
  float p = a.params[i];
  float b = 0.0f;
  if (kMomentum && !a.s.first_step) b = a.momentum_buffer[i];
  SgdElement<kMomentum>(a.s, g, p, b);
  a.params[i] = p;
  if (kMomentum) a.momentum_buffer[i] = b;
  if (kBf16) a.params_bf16[i] = ToBf16(p);
}

template <bool kBf16, bool kMomentum>
SHARDOPT_KERNEL_FN void SgdFour(const SgdArgs& a, size_t j) {
  const size_t base = a.range.head;
  float g[4], p[4], b[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  ReduceFour(a.grads, base, j, g);
  Load4(a.params, base, j, p);
  if (kMomentum && !a.s.first_step) Load4(a.momentum_buffer, base, j, b);
  SHARDOPT_UNROLL
  for (int k = 0; k < 4; ++k) SgdElement<kMomentum>(a.s, g[k], p[k], b[k]);
  Store4(a.params, base, j, p);
  if (kMomentum) Store4(a.momentum_buffer, base, j, b);
  if (kBf16) StoreBf16x4(a.params_bf16, base, j, p);
}

template <bool kBf16, bool kAmsgrad>
SHARDOPT_KERNEL_FN void AdamOne(const AdamArgs& a, size_t i) {
  const float g = ReduceOne(a.grads, i);
  float p = a.params[i];
  float m = a.exp_avg[i];
  float v = a.exp_avg_sq[i];
  float vmax = kAmsgrad ? a.max_exp_avg_sq[i] : 0.0f;
  AdamElement<kAmsgrad>(a.s, g, p, m, v, vmax);
  a.params[i] = p;
  a.exp_avg[i] = m;
  a.exp_avg_sq[i] = v;
  if (kAmsgrad) a.max_exp_avg_sq[i] = vmax;
  if (kBf16) a.params_bf16[i] = ToBf16(p);
}

template <bool kBf16, bool kAmsgrad>
SHARDOPT_KERNEL_FN void AdamFour(const AdamArgs& a, size_t j) {
  const size_t base = a.range.head;
  float g[4], p[4], m[4], v[4], vmax[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  ReduceFour(a.grads, base, j, g);
  Load4(a.params, base, j, p);
  Load4(a.exp_avg, base, j, m);
  Load4(a.exp_avg_sq, base, j, v);
  if (kAmsgrad) Load4(a.max_exp_avg_sq, base, j, vmax);
  SHARDOPT_UNROLL
  for (int k = 0; k < 4; ++k) AdamElement<kAmsgrad>(a.s, g[k], p[k], m[k], v[k], vmax[k]);
  Store4(a.params, base, j, p);
  Store4(a.exp_avg, base, j, m);
  Store4(a.exp_avg_sq, base, j, v);
  if (kAmsgrad) Store4(a.max_exp_avg_sq, base, j, vmax);
  if (kBf16) StoreBf16x4(a.params_bf16, base, j, p);
}

template <bool kBf16>
SHARDOPT_KERNEL_FN void AdagradOne(const AdagradArgs& a, size_t i) {
  const float g = ReduceOne(a.grads, i);
  float p = a.params[i];
  float sum = a.sum[i];
  AdagradElement(a.s, g, p, sum);
  a.params[i] = p;
  a.sum[i] = sum;
  if (kBf16) a.params_bf16[i] = ToBf16(p);
}

template <bool kBf16>
SHARDOPT_KERNEL_FN void AdagradFour(const AdagradArgs& a, size_t j) {
  const size_t base = a.range.head;
  float g[4], p[4], sum[4];
  ReduceFour(a.grads, base, j, g);
  Load4(a.params, base, j, p);
  Load4(a.sum, base, j, sum);
  SHARDOPT_UNROLL
  for (int k = 0; k < 4; ++k) AdagradElement(a.s, g[k], p[k], sum[k]);
  Store4(a.params, base, j, p);
  Store4(a.sum, base, j, sum);
  if (kBf16) StoreBf16x4(a.params_bf16, base, j, p);
}

template <bool kBf16>
SHARDOPT_KERNEL_FN void LionOne(const LionArgs& a, size_t i) {
  const float g = ReduceOne(a.grads, i);
  float p = a.params[i];
  float m = a.exp_avg[i];
  LionElement(a.s, g, p, m);
  a.params[i] = p;
  a.exp_avg[i] = m;
  if (kBf16) a.params_bf16[i] = ToBf16(p);
}

template <bool kBf16>
SHARDOPT_KERNEL_FN void LionFour(const LionArgs& a, size_t j) {
  const size_t base = a.range.head;
  float g[4], p[4], m[4];
  ReduceFour(a.grads, base, j, g);
  Load4(a.params, base, j, p);
  Load4(a.exp_avg, base, j, m);
  SHARDOPT_UNROLL
  for (int k = 0; k < 4; ++k) LionElement(a.s, g[k], p[k], m[k]);
  Store4(a.params, base, j, p);
  Store4(a.exp_avg, base, j, m);
  if (kBf16) StoreBf16x4(a.params_bf16, base, j, p);
}

// ---------------------------------------------------------------------------
// What thread `tid` of a grid of `threads` threads does.

template <bool kVec, typename One, typename Four>
SHARDOPT_KERNEL_FN void ForRange(const RangeArgs& r, size_t tid, size_t threads, One one,
                                 Four four) {
  if (kVec) {
    const size_t tail_begin = r.head + 4 * r.groups;
    if (tid < r.head) one(tid);
    if (tid < r.n - tail_begin) one(tail_begin + tid);
    for (size_t j = tid; j < r.groups; j += threads) four(j);
  } else {
    for (size_t i = tid; i < r.n; i += threads) one(i);
  }
}

template <bool kVec, bool kBf16, bool kMomentum>
SHARDOPT_KERNEL_FN void SgdThread(const SgdArgs& a, size_t tid, size_t threads) {
  ForRange<kVec>(
      a.range, tid, threads, [&](size_t i) { SgdOne<kBf16, kMomentum>(a, i); },
      [&](size_t j) { SgdFour<kBf16, kMomentum>(a, j); });
}

template <bool kVec, bool kBf16, bool kAmsgrad>
SHARDOPT_KERNEL_FN void AdamThread(const AdamArgs& a, size_t tid, size_t threads) {
  ForRange<kVec>(
      a.range, tid, threads, [&](size_t i) { AdamOne<kBf16, kAmsgrad>(a, i); },
      [&](size_t j) { AdamFour<kBf16, kAmsgrad>(a, j); });
}

template <bool kVec, bool kBf16>
SHARDOPT_KERNEL_FN void AdagradThread(const AdagradArgs& a, size_t tid, size_t threads) {
  ForRange<kVec>(
      a.range, tid, threads, [&](size_t i) { AdagradOne<kBf16>(a, i); },
      [&](size_t j) { AdagradFour<kBf16>(a, j); });
}

template <bool kVec, bool kBf16>
SHARDOPT_KERNEL_FN void LionThread(const LionArgs& a, size_t tid, size_t threads) {
  ForRange<kVec>(
      a.range, tid, threads, [&](size_t i) { LionOne<kBf16>(a, i); },
      [&](size_t j) { LionFour<kBf16>(a, j); });
}

template <bool kVec>
SHARDOPT_KERNEL_FN void ConvertThread(const float* src, uint16_t* dst, const RangeArgs& r,
                                      size_t tid, size_t threads) {
  ForRange<kVec>(
      r, tid, threads, [&](size_t i) { dst[i] = ToBf16(src[i]); },
      [&](size_t j) {
        float x[4];
        Load4(src, r.head, j, x);
        StoreBf16x4(dst, r.head, j, x);
      });
}

SHARDOPT_KERNEL_FN void FillThread(float* dst, float value, size_t n, size_t tid, size_t threads) {
  for (size_t i = tid; i < n; i += threads) dst[i] = value;
}

// How many threads a launch needs at most (beyond that they would idle).
inline size_t WorkItems(const RangeArgs& r) {
  if (!r.vectorized) return r.n;
  const size_t tail = r.n - r.head - 4 * r.groups;
  size_t w = r.groups;
  if (r.head > w) w = r.head;
  if (tail > w) w = tail;
  return w;
}

}  // namespace body
}  // namespace internal
}  // namespace gpu
}  // namespace shardopt

#endif  // SHARDOPT_SERVER_CUDA_FUSED_KERNEL_BODY_H_
