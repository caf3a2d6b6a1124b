// Device code of Adafactor's passes (adafactor_kernels.h): grid-stride
// __global__ wrappers around adafactor_kernel_body.h, and their launches.
#include <cuda_runtime.h>

#include "server/cuda/adafactor_kernel_body.h"
#include "server/cuda/adafactor_kernels.h"
#include "server/cuda/launch_util.h"

namespace shardopt {
namespace gpu {
namespace {

namespace body = internal::body;
using launch::Blocks;
using launch::Check;
using launch::kThreads;

#define SHARDOPT_FOR_EACH_ITEM(count, item)                                                 \
  for (size_t item = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; item < (count); \
       item += static_cast<size_t>(gridDim.x) * blockDim.x)

__global__ void PieceSquaresKernel(const float* x, AdafactorShape s, double* sums) {
  SHARDOPT_FOR_EACH_ITEM(s.pieces(), k) body::PieceSquaresItem(x, s, sums, k);
}

__global__ void ScaleKernel(float* x, size_t n, float factor) {
  SHARDOPT_FOR_EACH_ITEM(n, i) x[i] = body::Mul(x[i], factor);
}

__global__ void FactorRowsKernel(const float* grad, float* row_var, AdafactorShape s,
                                 float weight) {
  SHARDOPT_FOR_EACH_ITEM(s.batches * s.rows, row) body::FactorRowItem(grad, row_var, s, weight, row);
}

__global__ void ColumnBlocksKernel(const float* grad, double* partials, AdafactorShape s) {
  SHARDOPT_FOR_EACH_ITEM(s.column_partials(), item) {
    body::ColumnBlockItem(grad, partials, s, item);
  }
}

__global__ void FactorColumnsKernel(const double* partials, float* col_var, AdafactorShape s,
                                    float weight) {
  SHARDOPT_FOR_EACH_ITEM(s.batches * s.cols, item) {
    body::FactorColumnItem(partials, col_var, s, weight, item);
  }
}

__global__ void RowDenominatorsKernel(const float* row_var, float* denominators, AdafactorShape s,
                                      float eps1) {
  SHARDOPT_FOR_EACH_ITEM(s.batches, b) body::RowDenominatorItem(row_var, denominators, s, eps1, b);
}

__global__ void VarianceKernel(const float* grad, float* variance, size_t n, float sign,
                               float weight) {
  SHARDOPT_FOR_EACH_ITEM(n, i) body::VarianceItem(grad, variance, sign, weight, i);
}

__global__ void UpdateSquaresKernel(AdafactorUpdateArgs a, double* sums) {
  SHARDOPT_FOR_EACH_ITEM(a.shape.pieces(), k) body::UpdateSquaresItem(a, sums, k);
}

__global__ void ApplyKernel(AdafactorUpdateArgs a, float* params, float step_scale) {
  SHARDOPT_FOR_EACH_ITEM(a.shape.n, i) body::ApplyItem(a, params, step_scale, i);
}

#undef SHARDOPT_FOR_EACH_ITEM

cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

}  // namespace

absl::Status PieceSquares(const float* x, const AdafactorShape& s, double* sums, void* stream) {
  if (s.pieces() == 0) return absl::OkStatus();
  PieceSquaresKernel<<<Blocks(s.pieces()), kThreads, 0, AsStream(stream)>>>(x, s, sums);
  return Check(cudaGetLastError(), "Adafactor piece squares launch");
}

absl::Status ScaleParams(float* x, size_t n, float factor, void* stream) {
  if (n == 0) return absl::OkStatus();
  ScaleKernel<<<Blocks(n), kThreads, 0, AsStream(stream)>>>(x, n, factor);
  return Check(cudaGetLastError(), "Adafactor decay launch");
}

absl::Status FactorRows(const float* grad, float* row_var, const AdafactorShape& s, float weight,
                        void* stream) {
  if (s.batches * s.rows == 0) return absl::OkStatus();
  FactorRowsKernel<<<Blocks(s.batches * s.rows), kThreads, 0, AsStream(stream)>>>(grad, row_var, s,
                                                                                   weight);
  return Check(cudaGetLastError(), "Adafactor row factors launch");
}

absl::Status FactorColumnBlocks(const float* grad, double* partials, const AdafactorShape& s,
                                void* stream) {
  if (s.column_partials() == 0) return absl::OkStatus();
  ColumnBlocksKernel<<<Blocks(s.column_partials()), kThreads, 0, AsStream(stream)>>>(grad,
                                                                                    partials, s);
  return Check(cudaGetLastError(), "Adafactor column blocks launch");
}

absl::Status FactorColumns(const double* partials, float* col_var, const AdafactorShape& s,
                           float weight, void* stream) {
  if (s.batches * s.cols == 0) return absl::OkStatus();
  FactorColumnsKernel<<<Blocks(s.batches * s.cols), kThreads, 0, AsStream(stream)>>>(
      partials, col_var, s, weight);
  return Check(cudaGetLastError(), "Adafactor column factors launch");
}

absl::Status RowDenominators(const float* row_var, float* denominators, const AdafactorShape& s,
                             float eps1, void* stream) {
  if (s.batches == 0) return absl::OkStatus();
  RowDenominatorsKernel<<<Blocks(s.batches), kThreads, 0, AsStream(stream)>>>(row_var,
                                                                              denominators, s, eps1);
  return Check(cudaGetLastError(), "Adafactor row denominators launch");
}

absl::Status UpdateVariance(const float* grad, float* variance, size_t n, float sign, float weight,
                            void* stream) {
  if (n == 0) return absl::OkStatus();
  VarianceKernel<<<Blocks(n), kThreads, 0, AsStream(stream)>>>(grad, variance, n, sign, weight);
  return Check(cudaGetLastError(), "Adafactor variance launch");
}

absl::Status UpdateSquares(const AdafactorUpdateArgs& a, double* sums, void* stream) {
  if (a.shape.pieces() == 0) return absl::OkStatus();
  UpdateSquaresKernel<<<Blocks(a.shape.pieces()), kThreads, 0, AsStream(stream)>>>(a, sums);
  return Check(cudaGetLastError(), "Adafactor update squares launch");
}

absl::Status ApplyUpdate(const AdafactorUpdateArgs& a, float* params, float step_scale,
                         void* stream) {
  if (a.shape.n == 0) return absl::OkStatus();
  ApplyKernel<<<Blocks(a.shape.n), kThreads, 0, AsStream(stream)>>>(a, params, step_scale);
  return Check(cudaGetLastError(), "Adafactor apply launch");
}

absl::Status CopySumsToHost(double* host, const double* device, size_t count, void* stream) {
  if (count == 0) return absl::OkStatus();
  if (absl::Status s = Check(cudaMemcpyAsync(host, device, count * sizeof(double),
                                             cudaMemcpyDeviceToHost, AsStream(stream)),
                             "Adafactor sums to the host");
      !s.ok()) {
    return s;
  }
  return Check(cudaStreamSynchronize(AsStream(stream)), "Adafactor sums to the host (wait)");
}

}  // namespace gpu
}  // namespace shardopt
