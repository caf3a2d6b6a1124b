#include <cuda_runtime.h>

#include "server/cuda/launch_util.h"
#include "server/cuda/gradient_control.h"

namespace shardopt {
namespace gpu {
namespace {

using launch::Blocks;
using launch::Check;
using launch::kThreads;

__global__ void ReduceKernel(float* __restrict__ staging, size_t n, size_t buffer_stride,
                             int trainers, bool mean) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float sum = staging[i];
    for (int t = 1; t < trainers; ++t) sum = __fadd_rn(sum, staging[t * buffer_stride + i]);
    if (mean && trainers > 1) sum = __fdiv_rn(sum, static_cast<float>(trainers));
    staging[i] = sum;
  }
}

// One thread per block of the norm: the same sequential order as the CPU.
__global__ void BlockSumsKernel(const float* __restrict__ g, size_t n, float scale,
                                size_t block_elements, double* __restrict__ sums, size_t blocks) {
  const size_t b = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= blocks) return;
  const size_t begin = b * block_elements;
  const size_t end = begin + block_elements < n ? begin + block_elements : n;
  double s = 0;
  for (size_t i = begin; i < end; ++i) {
    const double x = static_cast<double>(__fmul_rn(g[i], scale));
    s = __dadd_rn(s, __dmul_rn(x, x));
  }
  sums[b] = s;
}

__global__ void ScaleKernel(float* __restrict__ g, size_t n, float multiplier) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    g[i] = __fmul_rn(g[i], multiplier);
  }
}

__global__ void NonFiniteKernel(const float* __restrict__ g, size_t n, unsigned long long* found) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (!isfinite(g[i])) {
      atomicMin(found, static_cast<unsigned long long>(i));
      return;  // (Later elements of this thread are larger.)
    }
  }
}

// One thread per span: spans are padding, a few elements each.
__global__ void NonZeroKernel(const float* __restrict__ g, const unsigned long long* spans,
                              size_t num_spans, unsigned long long* found) {
  const size_t k = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= num_spans) return;
  for (unsigned long long i = spans[2 * k]; i < spans[2 * k + 1]; ++i) {
    if ((__float_as_uint(g[i]) & 0x7fffffffu) != 0) {
      atomicMin(found, i);
      return;
    }
  }
}

}  // namespace

absl::Status ScanReceived(const float* g, size_t n, const unsigned long long* spans,
                          size_t num_spans, unsigned long long* found, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (n > 0) {
    NonFiniteKernel<<<Blocks(n), kThreads, 0, s>>>(g, n, found);
    if (absl::Status e = Check(cudaGetLastError(), "NonFiniteKernel launch"); !e.ok()) return e;
  }
  if (num_spans == 0) return absl::OkStatus();
  NonZeroKernel<<<static_cast<int>((num_spans + 127) / 128), 128, 0, s>>>(g, spans, num_spans,
                                                                          found + 1);
  return Check(cudaGetLastError(), "NonZeroKernel launch");
}

absl::Status ReduceInPlace(float* staging, size_t n, size_t stride, int trainers, bool mean,
                           void* stream) {
  if (n == 0) return absl::OkStatus();
  ReduceKernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(staging, n, stride,
                                                                              trainers, mean);
  return Check(cudaGetLastError(), "ReduceKernel launch");
}

absl::Status BlockSumsOfSquares(const float* g, size_t n, float scale, size_t block_elements,
                                double* block_sums, void* stream) {
  const size_t blocks = (n + block_elements - 1) / block_elements;
  if (blocks == 0) return absl::OkStatus();
  BlockSumsKernel<<<static_cast<int>((blocks + 63) / 64), 64, 0,
                    static_cast<cudaStream_t>(stream)>>>(g, n, scale, block_elements, block_sums,
                                                         blocks);
  return Check(cudaGetLastError(), "BlockSumsKernel launch");
}

absl::Status ScaleInPlace(float* g, size_t n, float multiplier, void* stream) {
  if (n == 0) return absl::OkStatus();
  ScaleKernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(g, n, multiplier);
  return Check(cudaGetLastError(), "ScaleKernel launch");
}

}  // namespace gpu
}  // namespace shardopt
