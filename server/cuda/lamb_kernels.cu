// Device code of LAMB's passes (lamb_kernels.h): the measure pass as a
// staged job (staged_squares_kernel.h), the apply pass a __global__ wrapper around
// lamb_kernel_body.h, and their launches.
#include <cuda_runtime.h>

#include "server/cuda/lamb_kernel_body.h"
#include "server/cuda/lamb_kernels.h"
#include "server/cuda/launch_util.h"
#include "server/cuda/staged_squares_kernel.h"

namespace shardopt {
namespace gpu {
namespace {

using launch::Blocks;
using launch::Check;
using launch::kThreads;

__device__ __forceinline__ size_t ThreadIndex() {
  return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ size_t GridThreads() {
  return static_cast<size_t>(gridDim.x) * blockDim.x;
}

__global__ void __launch_bounds__(kThreads) ApplyKernel(const __grid_constant__ LambApplyArgs a) {
  internal::body::LambApplyThread(a, ThreadIndex(), GridThreads());
}

}  // namespace

absl::Status LambMeasure(const LambMeasureArgs& args, void* stream) {
  return staged::LaunchStagedSquares(internal::body::LambMeasureJob{args},
                                     static_cast<cudaStream_t>(stream), "LAMB measure kernel launch");
}

absl::Status LambApply(const LambApplyArgs& args, void* stream) {
  if (args.num_blocks == 0) return absl::OkStatus();
  ApplyKernel<<<Blocks(args.num_blocks * kLambBlockElements), kThreads, 0,
                static_cast<cudaStream_t>(stream)>>>(args);
  return Check(cudaGetLastError(), "LAMB apply kernel launch");
}

}  // namespace gpu
}  // namespace shardopt
