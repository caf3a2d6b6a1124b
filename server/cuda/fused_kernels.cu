// Device code of the fused optimizer steps (see fused_optimizers.h).
//
// Bit-exactness with server/optim: every multiply, add, divide and square
// root below is an explicit IEEE round-to-nearest intrinsic (__fmul_rn,
// __fadd_rn, __fdiv_rn, __fsqrt_rn), which nvcc never contracts into an FMA
// and which do not depend on -use_fast_math / -prec-div / -prec-sqrt / -ftz
// (the build also passes -fmad=false). The order of operations is that of
// the CPU kernels (server/optim/{sgd,adam,adagrad}.cc), term by term.
//
// Layout of a launch: one grid over the whole range; a grid-stride loop over
// float4 groups (vectorized) or single elements (otherwise). In the
// vectorized case, threads 0..head-1 also do the elements before the first
// 16-byte boundary and threads 0..tail-1 the elements after the last group.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "server/cuda/bf16_bits.h"
#include "server/cuda/fused_kernels.h"

namespace shardopt {
namespace gpu {
namespace internal {
namespace {

__device__ __forceinline__ float Add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float Mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float Div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ float Sqrt(float a) { return __fsqrt_rn(a); }

// torch.maximum: NaN if either is NaN, else the larger (as TorchMaximum in
// server/optim/optimizer_internal.h).
__device__ __forceinline__ float TorchMaximum(float a, float b) {
  return (a < b || b != b) ? b : a;
}

__device__ __forceinline__ uint16_t ToBf16(float x) {
  return Fp32BitsToBf16Bits(__float_as_uint(x));
}

__device__ __forceinline__ uint2 PackBf16(const float (&p)[4]) {
  uint2 r;
  r.x = static_cast<uint32_t>(ToBf16(p[0])) | (static_cast<uint32_t>(ToBf16(p[1])) << 16);
  r.y = static_cast<uint32_t>(ToBf16(p[2])) | (static_cast<uint32_t>(ToBf16(p[3])) << 16);
  return r;
}

// float4 group j of the buffer that starts at element `base` of `p`; 16-byte
// aligned by the host's plan.
__device__ __forceinline__ void Load4(const float* p, size_t base, size_t j, float (&out)[4]) {
  const float4 v = reinterpret_cast<const float4*>(p + base)[j];
  out[0] = v.x;
  out[1] = v.y;
  out[2] = v.z;
  out[3] = v.w;
}

__device__ __forceinline__ void Store4(float* p, size_t base, size_t j, const float (&in)[4]) {
  reinterpret_cast<float4*>(p + base)[j] = make_float4(in[0], in[1], in[2], in[3]);
}

__device__ __forceinline__ void StoreBf16x4(uint16_t* p, size_t base, size_t j,
                                            const float (&in)[4]) {
  reinterpret_cast<uint2*>(p + base)[j] = PackBf16(in);
}

// (a) of the header: ModelShard::ApplyStep's reduction.
__device__ __forceinline__ float ReduceOne(const GradArgs& g, size_t i) {
  float s = g.ptr[0][i];
  for (int t = 1; t < g.count; ++t) s = Add(s, g.ptr[t][i]);
  if (g.divide) s = Div(s, g.divisor);
  return s;
}

__device__ __forceinline__ void ReduceFour(const GradArgs& g, size_t base, size_t j,
                                           float (&s)[4]) {
  Load4(g.ptr[0], base, j, s);
#pragma unroll 4
  for (int t = 1; t < g.count; ++t) {
    float x[4];
    Load4(g.ptr[t], base, j, x);
#pragma unroll
    for (int k = 0; k < 4; ++k) s[k] = Add(s[k], x[k]);
  }
  if (g.divide) {
#pragma unroll
    for (int k = 0; k < 4; ++k) s[k] = Div(s[k], g.divisor);
  }
}

// ---------------------------------------------------------------------------
// Per-element updates, term by term as in server/optim.

// sgd.cc: Grad + SgdPlain / SgdMomentum.
template <bool kMomentum>
__device__ __forceinline__ void SgdElement(const SgdScalars& s, float grad, float& p, float& buf) {
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
__device__ __forceinline__ void AdamElement(const AdamScalars& s, float grad, float& p, float& m,
                                            float& v, float& vmax) {
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
__device__ __forceinline__ void AdagradElement(const AdagradScalars& s, float grad, float& p,
                                               float& sum) {
  float g = s.maximize ? -grad : grad;
  if (s.has_weight_decay) g = Add(g, Mul(s.weight_decay, p));
  const float acc = Add(sum, Mul(g, g));
  sum = acc;
  const float std_dev = Add(Sqrt(acc), s.eps);
  p = Add(p, Div(Mul(s.neg_clr, g), std_dev));
}

// ---------------------------------------------------------------------------
// One element / one float4 group of each family: load, update, store.

template <bool kBf16, bool kMomentum>
__device__ __forceinline__ void SgdOne(const SgdArgs& a, size_t i) {
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
__device__ __forceinline__ void SgdFour(const SgdArgs& a, size_t j) {
  const size_t base = a.range.head;
  float g[4], p[4], b[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  ReduceFour(a.grads, base, j, g);
  Load4(a.params, base, j, p);
  if (kMomentum && !a.s.first_step) Load4(a.momentum_buffer, base, j, b);
#pragma unroll
  for (int k = 0; k < 4; ++k) SgdElement<kMomentum>(a.s, g[k], p[k], b[k]);
  Store4(a.params, base, j, p);
  if (kMomentum) Store4(a.momentum_buffer, base, j, b);
  if (kBf16) StoreBf16x4(a.params_bf16, base, j, p);
}

template <bool kBf16, bool kAmsgrad>
__device__ __forceinline__ void AdamOne(const AdamArgs& a, size_t i) {
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
__device__ __forceinline__ void AdamFour(const AdamArgs& a, size_t j) {
  const size_t base = a.range.head;
  float g[4], p[4], m[4], v[4], vmax[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  ReduceFour(a.grads, base, j, g);
  Load4(a.params, base, j, p);
  Load4(a.exp_avg, base, j, m);
  Load4(a.exp_avg_sq, base, j, v);
  if (kAmsgrad) Load4(a.max_exp_avg_sq, base, j, vmax);
#pragma unroll
  for (int k = 0; k < 4; ++k) AdamElement<kAmsgrad>(a.s, g[k], p[k], m[k], v[k], vmax[k]);
  Store4(a.params, base, j, p);
  Store4(a.exp_avg, base, j, m);
  Store4(a.exp_avg_sq, base, j, v);
  if (kAmsgrad) Store4(a.max_exp_avg_sq, base, j, vmax);
  if (kBf16) StoreBf16x4(a.params_bf16, base, j, p);
}

template <bool kBf16>
__device__ __forceinline__ void AdagradOne(const AdagradArgs& a, size_t i) {
  const float g = ReduceOne(a.grads, i);
  float p = a.params[i];
  float sum = a.sum[i];
  AdagradElement(a.s, g, p, sum);
  a.params[i] = p;
  a.sum[i] = sum;
  if (kBf16) a.params_bf16[i] = ToBf16(p);
}

template <bool kBf16>
__device__ __forceinline__ void AdagradFour(const AdagradArgs& a, size_t j) {
  const size_t base = a.range.head;
  float g[4], p[4], sum[4];
  ReduceFour(a.grads, base, j, g);
  Load4(a.params, base, j, p);
  Load4(a.sum, base, j, sum);
#pragma unroll
  for (int k = 0; k < 4; ++k) AdagradElement(a.s, g[k], p[k], sum[k]);
  Store4(a.params, base, j, p);
  Store4(a.sum, base, j, sum);
  if (kBf16) StoreBf16x4(a.params_bf16, base, j, p);
}

// ---------------------------------------------------------------------------
// The grid-stride driver shared by every family.

template <bool kVec, typename One, typename Four>
__device__ __forceinline__ void ForRange(const RangeArgs& r, One one, Four four) {
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  if (kVec) {
    const size_t tail_begin = r.head + 4 * r.groups;
    if (tid < r.head) one(tid);
    if (tid < r.n - tail_begin) one(tail_begin + tid);
    for (size_t j = tid; j < r.groups; j += stride) four(j);
  } else {
    for (size_t i = tid; i < r.n; i += stride) one(i);
  }
}

template <bool kVec, bool kBf16, bool kMomentum>
__global__ void __launch_bounds__(kThreadsPerBlock) SgdKernel(const __grid_constant__ SgdArgs a) {
  ForRange<kVec>(
      a.range, [&](size_t i) { SgdOne<kBf16, kMomentum>(a, i); },
      [&](size_t j) { SgdFour<kBf16, kMomentum>(a, j); });
}

template <bool kVec, bool kBf16, bool kAmsgrad>
__global__ void __launch_bounds__(kThreadsPerBlock) AdamKernel(const __grid_constant__ AdamArgs a) {
  ForRange<kVec>(
      a.range, [&](size_t i) { AdamOne<kBf16, kAmsgrad>(a, i); },
      [&](size_t j) { AdamFour<kBf16, kAmsgrad>(a, j); });
}

template <bool kVec, bool kBf16>
__global__ void __launch_bounds__(kThreadsPerBlock)
    AdagradKernel(const __grid_constant__ AdagradArgs a) {
  ForRange<kVec>(
      a.range, [&](size_t i) { AdagradOne<kBf16>(a, i); },
      [&](size_t j) { AdagradFour<kBf16>(a, j); });
}

template <bool kVec>
__global__ void __launch_bounds__(kThreadsPerBlock)
    ConvertKernel(const float* __restrict__ src, uint16_t* __restrict__ dst, const RangeArgs r) {
  ForRange<kVec>(
      r, [&](size_t i) { dst[i] = ToBf16(src[i]); },
      [&](size_t j) {
        float x[4];
        Load4(src, r.head, j, x);
        StoreBf16x4(dst, r.head, j, x);
      });
}

__global__ void __launch_bounds__(kThreadsPerBlock)
    FillKernel(float* __restrict__ dst, float value, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = value;
  }
}

// ---------------------------------------------------------------------------
// Launch: a grid that the device holds at once (blocks per SM from the
// occupancy calculator times the SM count), or fewer blocks if the range
// needs fewer; the grid-stride loops cover the rest.

template <typename... KernelParams, typename... Args>
cudaError_t LaunchOn(void (*kernel)(KernelParams...), size_t work_items, cudaStream_t stream,
                     const Args&... args) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  int sms = 0;
  err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  int per_sm = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreadsPerBlock, 0);
  if (err != cudaSuccess) return err;
  if (per_sm < 1) per_sm = 1;
  size_t blocks = (work_items + kThreadsPerBlock - 1) / kThreadsPerBlock;
  const size_t resident = static_cast<size_t>(sms) * static_cast<size_t>(per_sm);
  if (blocks > resident) blocks = resident;
  if (blocks < 1) blocks = 1;
  kernel<<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(args...);
  return cudaGetLastError();
}

size_t WorkItems(const RangeArgs& r) {
  if (!r.vectorized) return r.n;
  const size_t tail = r.n - r.head - 4 * r.groups;
  size_t w = r.groups;
  if (r.head > w) w = r.head;
  if (tail > w) w = tail;
  return w;
}

template <bool kVec, bool kBf16>
cudaError_t LaunchSgdWith(const SgdArgs& a, cudaStream_t stream) {
  if (a.momentum_buffer != nullptr) {
    return LaunchOn(SgdKernel<kVec, kBf16, true>, WorkItems(a.range), stream, a);
  }
  return LaunchOn(SgdKernel<kVec, kBf16, false>, WorkItems(a.range), stream, a);
}

template <bool kVec, bool kBf16>
cudaError_t LaunchAdamWith(const AdamArgs& a, cudaStream_t stream) {
  if (a.max_exp_avg_sq != nullptr) {
    return LaunchOn(AdamKernel<kVec, kBf16, true>, WorkItems(a.range), stream, a);
  }
  return LaunchOn(AdamKernel<kVec, kBf16, false>, WorkItems(a.range), stream, a);
}

// Launcher<kVec, kBf16>::Run for the run-time pair (vectorized, bf16 copy).
template <template <bool, bool> class Launcher, typename Args>
cudaError_t Dispatch(const Args& a, cudaStream_t stream) {
  const bool vec = a.range.vectorized != 0;
  const bool bf16 = a.params_bf16 != nullptr;
  if (vec) {
    return bf16 ? Launcher<true, true>::Run(a, stream) : Launcher<true, false>::Run(a, stream);
  }
  return bf16 ? Launcher<false, true>::Run(a, stream) : Launcher<false, false>::Run(a, stream);
}

template <bool kVec, bool kBf16>
struct SgdLauncher {
  static cudaError_t Run(const SgdArgs& a, cudaStream_t s) { return LaunchSgdWith<kVec, kBf16>(a, s); }
};
template <bool kVec, bool kBf16>
struct AdamLauncher {
  static cudaError_t Run(const AdamArgs& a, cudaStream_t s) {
    return LaunchAdamWith<kVec, kBf16>(a, s);
  }
};
template <bool kVec, bool kBf16>
struct AdagradLauncher {
  static cudaError_t Run(const AdagradArgs& a, cudaStream_t s) {
    return LaunchOn(AdagradKernel<kVec, kBf16>, WorkItems(a.range), s, a);
  }
};

}  // namespace

cudaError_t LaunchSgd(const SgdArgs& args, cudaStream_t stream) {
  return Dispatch<SgdLauncher>(args, stream);
}

cudaError_t LaunchAdam(const AdamArgs& args, cudaStream_t stream) {
  return Dispatch<AdamLauncher>(args, stream);
}

cudaError_t LaunchAdagrad(const AdagradArgs& args, cudaStream_t stream) {
  return Dispatch<AdagradLauncher>(args, stream);
}

cudaError_t LaunchConvertToBf16(const float* src, uint16_t* dst, const RangeArgs& range,
                                cudaStream_t stream) {
  if (range.vectorized) return LaunchOn(ConvertKernel<true>, WorkItems(range), stream, src, dst, range);
  return LaunchOn(ConvertKernel<false>, WorkItems(range), stream, src, dst, range);
}

cudaError_t LaunchFill(float* dst, float value, size_t n, cudaStream_t stream) {
  return LaunchOn(FillKernel, n, stream, dst, value, n);
}

}  // namespace internal
}  // namespace gpu
}  // namespace shardopt
