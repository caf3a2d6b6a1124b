// Adafactor's passes on the GPU, one tensor at a time (server/optim/
// adafactor.cc's formulas and summation orders, term by term; IEEE
// operations, no contraction). A tensor of two or more dimensions is
// `batches` matrices of rows x cols (factored: row_var holds batches*rows
// factors, col_var batches*cols); one of fewer dimensions is unfactored
// (row_var is its variance, n elements). The update's pieces are the
// tensor's rows (cols elements; unfactored, the whole tensor) cut into
// kAdafactorPieceElements. Plain C++: device pointers, streams as `void*`;
// asynchronous (CopySumsToHost waits), errors of the launch only. The same
// declarations are implemented on host memory by
// adafactor_kernels_emulated.cc.
#ifndef SHARDOPT_SERVER_CUDA_ADAFACTOR_KERNELS_H_
#define SHARDOPT_SERVER_CUDA_ADAFACTOR_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace shardopt {
namespace gpu {

// The shape's arithmetic runs on both sides.
#if defined(__CUDACC__)
#define SHARDOPT_ADAFACTOR_HD __host__ __device__
#else
#define SHARDOPT_ADAFACTOR_HD
#endif

// server/optim/adafactor_rules.h's piece and column block.
inline constexpr size_t kAdafactorPieceElements = 2048;
inline constexpr size_t kAdafactorColumnBlockRows = 64;

struct AdafactorShape {
  size_t n;           // Elements.
  int factored;       // Two or more dimensions.
  size_t batches;     // Factored: n = batches * rows * cols.
  size_t rows, cols;  // Factored only.
  // Elements per row of pieces: cols, or n when unfactored.
  SHARDOPT_ADAFACTOR_HD size_t row_length() const { return factored ? cols : n; }
  SHARDOPT_ADAFACTOR_HD size_t pieces_per_row() const {
    return (row_length() + kAdafactorPieceElements - 1) / kAdafactorPieceElements;
  }
  SHARDOPT_ADAFACTOR_HD size_t row_blocks() const {
    return (rows + kAdafactorColumnBlockRows - 1) / kAdafactorColumnBlockRows;
  }
  // Factored: the column sums' partials, one per (batch, row block, column).
  SHARDOPT_ADAFACTOR_HD size_t column_partials() const { return batches * row_blocks() * cols; }
  SHARDOPT_ADAFACTOR_HD size_t pieces() const {
    return row_length() == 0 ? 0 : n / row_length() * pieces_per_row();
  }
};

// The update U = rsqrt(max(V, variance_floor)) * (sign * g), V from the
// factors (row * col / denominator[batch]) or the variance.
struct AdafactorUpdateArgs {
  AdafactorShape shape;
  const float* grad;
  const float* row_var;
  const float* col_var;       // Factored only.
  const float* denominators;  // Factored only: one per batch.
  float sign;
  float variance_floor;
};

// sums[k] = SumOfSquares of x over piece k (eight double lanes, then the rest).
absl::Status PieceSquares(const float* x, const AdafactorShape& shape, double* sums, void* stream);
// x[i] = x[i] * factor.
absl::Status ScaleParams(float* x, size_t n, float factor, void* stream);
// Factored: row_var[row] = lerp(row_var[row], ||g_row||^2 / cols, weight)
// (the norm in fp32 from the row's pieces' sums, added in order; the
// pieces' sums go to `piece_sums`, pieces() doubles); col_var[b * cols + k]
// likewise over column k of batch b: its squares summed per block of
// kAdafactorColumnBlockRows rows in order (FactorColumnBlocks, into
// `partials`: column_partials() doubles), the blocks' sums then added in
// order (FactorColumns); then denominators[b] = max(float(sum of batch b's
// row factors / rows), eps1).
absl::Status FactorRows(const float* grad, float* row_var, const AdafactorShape& shape,
                        float weight, double* piece_sums, void* stream);
absl::Status FactorColumnBlocks(const float* grad, double* partials, const AdafactorShape& shape,
                                void* stream);
absl::Status FactorColumns(const double* partials, float* col_var, const AdafactorShape& shape,
                           float weight, void* stream);
absl::Status RowDenominators(const float* row_var, float* denominators, const AdafactorShape& shape,
                             float eps1, void* stream);
// Unfactored: variance[i] = lerp(variance[i], (sign * g)^2, weight).
absl::Status UpdateVariance(const float* grad, float* variance, size_t n, float sign, float weight,
                            void* stream);
// sums[k] = SumOfSquares of U over piece k.
absl::Status UpdateSquares(const AdafactorUpdateArgs& args, double* sums, void* stream);
// params[i] = params[i] + step_scale * U[i].
absl::Status ApplyUpdate(const AdafactorUpdateArgs& args, float* params, float step_scale,
                         void* stream);
// Copies `count` sums to host memory and waits for the stream.
absl::Status CopySumsToHost(double* host, const double* device, size_t count, void* stream);

}  // namespace gpu
}  // namespace shardopt

#endif  // SHARDOPT_SERVER_CUDA_ADAFACTOR_KERNELS_H_
