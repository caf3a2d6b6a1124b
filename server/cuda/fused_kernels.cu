// Device code of the fused optimizer steps (see fused_optimizers.h): the
// __global__ wrappers around fused_kernel_body.h, and their launches.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "server/cuda/fused_kernel_body.h"
#include "server/cuda/fused_kernels.h"

namespace shardopt {
namespace gpu {
namespace internal {
namespace {

// The argument blocks are __grid_constant__: the kernels index the
// gradient-pointer array with the run-time rank straight from the parameter
// bank (without it nvcc would copy the 2 KiB block to local memory).

__device__ __forceinline__ size_t ThreadIndex() {
  return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ size_t GridThreads() {
  return static_cast<size_t>(gridDim.x) * blockDim.x;
}

template <bool kVec, bool kBf16, bool kMomentum>
__global__ void __launch_bounds__(kThreadsPerBlock) SgdKernel(const __grid_constant__ SgdArgs a) {
  body::SgdThread<kVec, kBf16, kMomentum>(a, ThreadIndex(), GridThreads());
}

template <bool kVec, bool kBf16, bool kAmsgrad>
__global__ void __launch_bounds__(kThreadsPerBlock) AdamKernel(const __grid_constant__ AdamArgs a) {
  body::AdamThread<kVec, kBf16, kAmsgrad>(a, ThreadIndex(), GridThreads());
}

template <bool kVec, bool kBf16>
__global__ void __launch_bounds__(kThreadsPerBlock)
    AdagradKernel(const __grid_constant__ AdagradArgs a) {
  body::AdagradThread<kVec, kBf16>(a, ThreadIndex(), GridThreads());
}

template <bool kVec, bool kBf16>
__global__ void __launch_bounds__(kThreadsPerBlock) LionKernel(const __grid_constant__ LionArgs a) {
  body::LionThread<kVec, kBf16>(a, ThreadIndex(), GridThreads());
}

template <bool kVec>
__global__ void __launch_bounds__(kThreadsPerBlock)
    ConvertKernel(const float* __restrict__ src, uint16_t* __restrict__ dst, const RangeArgs r) {
  body::ConvertThread<kVec>(src, dst, r, ThreadIndex(), GridThreads());
}

__global__ void __launch_bounds__(kThreadsPerBlock)
    FillKernel(float* __restrict__ dst, float value, size_t n) {
  body::FillThread(dst, value, n, ThreadIndex(), GridThreads());
}

// One grid that the device holds at once (blocks per SM from the occupancy
// calculator times the SM count), or fewer blocks if the range needs fewer;
// the grid-stride loops cover the rest.
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

template <bool kVec, bool kBf16>
struct SgdLauncher {
  static cudaError_t Run(const SgdArgs& a, cudaStream_t s) {
    if (a.momentum_buffer != nullptr) {
      return LaunchOn(SgdKernel<kVec, kBf16, true>, body::WorkItems(a.range), s, a);
    }
    return LaunchOn(SgdKernel<kVec, kBf16, false>, body::WorkItems(a.range), s, a);
  }
};

template <bool kVec, bool kBf16>
struct AdamLauncher {
  static cudaError_t Run(const AdamArgs& a, cudaStream_t s) {
    if (a.max_exp_avg_sq != nullptr) {
      return LaunchOn(AdamKernel<kVec, kBf16, true>, body::WorkItems(a.range), s, a);
    }
    return LaunchOn(AdamKernel<kVec, kBf16, false>, body::WorkItems(a.range), s, a);
  }
};

template <bool kVec, bool kBf16>
struct AdagradLauncher {
  static cudaError_t Run(const AdagradArgs& a, cudaStream_t s) {
    return LaunchOn(AdagradKernel<kVec, kBf16>, body::WorkItems(a.range), s, a);
  }
};

template <bool kVec, bool kBf16>
struct LionLauncher {
  static cudaError_t Run(const LionArgs& a, cudaStream_t s) {
    return LaunchOn(LionKernel<kVec, kBf16>, body::WorkItems(a.range), s, a);
  }
};

// Launcher<kVec, kBf16>::Run for the run-time pair (vectorized, bf16 copy).
template <template <bool, bool> class Launcher, typename Args>
cudaError_t Dispatch(const Args& a, cudaStream_t stream) {
  const bool bf16 = a.params_bf16 != nullptr;
  if (a.range.vectorized) {
    return bf16 ? Launcher<true, true>::Run(a, stream) : Launcher<true, false>::Run(a, stream);
  }
  return bf16 ? Launcher<false, true>::Run(a, stream) : Launcher<false, false>::Run(a, stream);
}

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

cudaError_t LaunchLion(const LionArgs& args, cudaStream_t stream) {
  return Dispatch<LionLauncher>(args, stream);
}

cudaError_t LaunchConvertToBf16(const float* src, uint16_t* dst, const RangeArgs& range,
                                cudaStream_t stream) {
  if (range.vectorized) {
    return LaunchOn(ConvertKernel<true>, body::WorkItems(range), stream, src, dst, range);
  }
  return LaunchOn(ConvertKernel<false>, body::WorkItems(range), stream, src, dst, range);
}

cudaError_t LaunchFill(float* dst, float value, size_t n, cudaStream_t stream) {
  return LaunchOn(FillKernel, n, stream, dst, value, n);
}

}  // namespace internal
}  // namespace gpu
}  // namespace shardopt
