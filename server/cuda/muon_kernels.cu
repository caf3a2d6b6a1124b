#include <cuda_runtime.h>

#include "server/cuda/fused_kernel_body.h"
#include "server/cuda/launch_util.h"
#include "server/cuda/muon_kernels.h"

namespace shardopt {
namespace gpu {
namespace {

using launch::Blocks;
using launch::Check;
using launch::kThreads;

using internal::body::TorchLerp;

__global__ void MomentumKernel(const float* __restrict__ grad, float* __restrict__ buffer,
                               float* __restrict__ x, size_t rows, size_t cols, float keep,
                               float momentum, bool nesterov, bool transpose) {
  const size_t n = rows * cols;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t e = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const float b = TorchLerp(buffer[e], grad[e], keep);
    buffer[e] = b;
    const float u = nesterov ? TorchLerp(grad[e], b, momentum) : b;
    x[transpose ? (e % cols) * rows + e / cols : e] = u;
  }
}

__global__ void DivideKernel(float* __restrict__ x, size_t n, float divisor) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    x[i] = __fdiv_rn(x[i], divisor);
  }
}

__global__ void ApplyKernel(float* __restrict__ params, const float* __restrict__ x, size_t rows,
                            size_t cols, bool transpose, float decay, float neg_lr) {
  const size_t n = rows * cols;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t e = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const float u = x[transpose ? (e % cols) * rows + e / cols : e];
    params[e] = __fadd_rn(__fmul_rn(params[e], decay), __fmul_rn(neg_lr, u));
  }
}

}  // namespace

absl::Status MuonMomentum(const float* grad, float* buffer, float* x, size_t rows, size_t cols,
                          float keep, float momentum, bool nesterov, bool transpose,
                          void* stream) {
  if (rows * cols == 0) return absl::OkStatus();
  MomentumKernel<<<Blocks(rows * cols), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      grad, buffer, x, rows, cols, keep, momentum, nesterov, transpose);
  return Check(cudaGetLastError(), "MomentumKernel launch");
}

absl::Status DivideInPlace(float* x, size_t n, float divisor, void* stream) {
  if (n == 0) return absl::OkStatus();
  DivideKernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, n, divisor);
  return Check(cudaGetLastError(), "DivideKernel launch");
}

absl::Status MuonApply(float* params, const float* x, size_t rows, size_t cols, bool transpose,
                       float decay, float neg_lr, void* stream) {
  if (rows * cols == 0) return absl::OkStatus();
  ApplyKernel<<<Blocks(rows * cols), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      params, x, rows, cols, transpose, decay, neg_lr);
  return Check(cudaGetLastError(), "ApplyKernel launch");
}

}  // namespace gpu
}  // namespace shardopt
