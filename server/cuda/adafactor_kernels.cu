// Device code of Adafactor's passes (adafactor_kernels.h): grid-stride
// __global__ wrappers around adafactor_kernel_body.h, the sums over pieces
// and rows as staged jobs (staged_squares_kernel.h), and their launches.
#include <cuda_runtime.h>

#include <algorithm>

#include "server/cuda/adafactor_kernel_body.h"
#include "server/cuda/adafactor_kernels.h"
#include "server/cuda/launch_util.h"
#include "server/cuda/staged_squares_kernel.h"

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

__global__ void ScaleKernel(float* x, size_t n, float factor) {
  SHARDOPT_FOR_EACH_ITEM(n, i) x[i] = body::Mul(x[i], factor);
}

__global__ void FactorRowsKernel(const double* piece_sums, float* row_var, AdafactorShape s,
                                 float weight) {
  SHARDOPT_FOR_EACH_ITEM(s.batches * s.rows, row) {
    body::FactorRowItem(piece_sums, row_var, s, weight, row);
  }
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

// A warp per batch (RowDenominatorItem's order, which the emulation runs):
// the lanes load 256 row factors at a time, coalesced and all in flight,
// and lane 0 adds them in order as the others hand them over. One thread
// loading and adding one factor after another waited out a load per row
// (about 3 ms for the 32768 rows of the 1G benchmark).
__global__ void RowDenominatorsKernel(const float* row_var, float* denominators, AdafactorShape s,
                                      float eps1) {
  constexpr int kLoads = 8;
  const unsigned lane = threadIdx.x % 32;
  const size_t warps = static_cast<size_t>(gridDim.x) * (blockDim.x / 32);
  for (size_t b = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; b < s.batches;
       b += warps) {
    const float* rows = row_var + b * s.rows;
    double sum = 0;
    for (size_t base = 0; base < s.rows; base += kLoads * 32) {
      float v[kLoads];
#pragma unroll
      for (int j = 0; j < kLoads; ++j) {
        const size_t r = base + j * 32 + lane;
        v[j] = r < s.rows ? rows[r] : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < kLoads; ++j) {
        for (int source = 0; source < 32; ++source) {
          const float x = __shfl_sync(0xffffffffu, v[j], source);
          if (base + j * 32 + source < s.rows) sum = body::AddD(sum, static_cast<double>(x));
        }
      }
    }
    if (lane == 0) denominators[b] = body::RowDenominatorOf(sum, s, eps1);
  }
}

__global__ void VarianceKernel(const float* grad, float* variance, size_t n, float sign,
                               float weight) {
  SHARDOPT_FOR_EACH_ITEM(n, i) body::VarianceItem(grad, variance, sign, weight, i);
}

__global__ void ApplyKernel(AdafactorUpdateArgs a, float* params, float step_scale) {
  SHARDOPT_FOR_EACH_ITEM(a.shape.n, i) body::ApplyItem(a, params, step_scale, i);
}

// Factored tensors with rows at least a block wide: blocks walk rows, so
// that row and batch are known per row rather than divided out per element
// (the element-wise kernel's two divisions cost more than its memory).
__global__ void ApplyRowsKernel(AdafactorUpdateArgs a, float* params, float step_scale) {
  const size_t rows = a.shape.batches * a.shape.rows;
  const size_t cols = a.shape.cols;
  for (size_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const size_t batch = row / a.shape.rows;
    for (size_t col = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; col < cols;
         col += static_cast<size_t>(gridDim.x) * blockDim.x) {
      body::ApplyAt(a, params, step_scale, row * cols + col, row, batch, col);
    }
  }
}

#undef SHARDOPT_FOR_EACH_ITEM

cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

}  // namespace

absl::Status PieceSquares(const float* x, const AdafactorShape& s, double* sums, void* stream) {
  return staged::LaunchStagedSquares(body::PieceSquaresJob{x, s, sums}, AsStream(stream),
                                     "Adafactor piece squares launch");
}

absl::Status ScaleParams(float* x, size_t n, float factor, void* stream) {
  if (n == 0) return absl::OkStatus();
  ScaleKernel<<<Blocks(n), kThreads, 0, AsStream(stream)>>>(x, n, factor);
  return Check(cudaGetLastError(), "Adafactor decay launch");
}

absl::Status FactorRows(const float* grad, float* row_var, const AdafactorShape& s, float weight,
                        double* piece_sums, void* stream) {
  if (s.batches * s.rows == 0) return absl::OkStatus();
  if (absl::Status st = PieceSquares(grad, s, piece_sums, stream); !st.ok()) return st;
  FactorRowsKernel<<<Blocks(s.batches * s.rows), kThreads, 0, AsStream(stream)>>>(
      piece_sums, row_var, s, weight);
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
  RowDenominatorsKernel<<<Blocks(s.batches * 32), kThreads, 0, AsStream(stream)>>>(
      row_var, denominators, s, eps1);
  return Check(cudaGetLastError(), "Adafactor row denominators launch");
}

absl::Status UpdateVariance(const float* grad, float* variance, size_t n, float sign, float weight,
                            void* stream) {
  if (n == 0) return absl::OkStatus();
  VarianceKernel<<<Blocks(n), kThreads, 0, AsStream(stream)>>>(grad, variance, n, sign, weight);
  return Check(cudaGetLastError(), "Adafactor variance launch");
}

absl::Status UpdateSquares(const AdafactorUpdateArgs& a, double* sums, void* stream) {
  return staged::LaunchStagedSquares(body::UpdateSquaresJob{a, sums}, AsStream(stream),
                                     "Adafactor update squares launch");
}

absl::Status ApplyUpdate(const AdafactorUpdateArgs& a, float* params, float step_scale,
                         void* stream) {
  if (a.shape.n == 0) return absl::OkStatus();
  if (a.shape.factored && a.shape.cols >= static_cast<size_t>(kThreads)) {
    const size_t rows = a.shape.batches * a.shape.rows;
    const size_t x = std::min<size_t>((a.shape.cols + kThreads - 1) / kThreads, 32);
    const size_t y = std::min<size_t>(rows, std::max<size_t>(1, 4096 / x));
    ApplyRowsKernel<<<dim3(static_cast<unsigned>(x), static_cast<unsigned>(y)), kThreads, 0,
                      AsStream(stream)>>>(a, params, step_scale);
  } else {
    ApplyKernel<<<Blocks(a.shape.n), kThreads, 0, AsStream(stream)>>>(a, params, step_scale);
  }
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
