// Internal to //server/cuda: the per-work-item code of Adafactor's kernels,
// written once for the device (adafactor_kernels.cu) and the host
// (adafactor_kernels_emulated.cc, which runs it item after item). The fp32
// operations are fused_kernel_body.h's; the double ones lamb_kernel_body.h's
// and DivD / SqrtD below (__ddiv_rn / __dsqrt_rn on the device).
#ifndef SHARDOPT_SERVER_CUDA_ADAFACTOR_KERNEL_BODY_H_
#define SHARDOPT_SERVER_CUDA_ADAFACTOR_KERNEL_BODY_H_

#include "server/cuda/adafactor_kernels.h"
#include "server/cuda/lamb_kernel_body.h"

namespace shardopt {
namespace gpu {
namespace internal {
namespace body {

SHARDOPT_KERNEL_FN double DivD(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

SHARDOPT_KERNEL_FN double SqrtD(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// std::max(a, b) for floats.
SHARDOPT_KERNEL_FN float MaxF(float a, float b) { return a < b ? b : a; }

SHARDOPT_KERNEL_FN double LaneSquares(const float* x, size_t n) {
  return LaneSquaresOf(n, [x](size_t i) { return x[i]; });
}

// A norm as torch returns it: fp32.
SHARDOPT_KERNEL_FN float Fp32Norm(double squares) { return static_cast<float>(SqrtD(squares)); }

// Piece k's first element and length.
SHARDOPT_KERNEL_FN void PieceOf(const AdafactorShape& s, size_t k, size_t& start, size_t& count) {
  const size_t per_row = s.pieces_per_row();
  const size_t k0 = (k % per_row) * kAdafactorPieceElements;
  start = (k / per_row) * s.row_length() + k0;
  count =
      s.row_length() - k0 < kAdafactorPieceElements ? s.row_length() - k0 : kAdafactorPieceElements;
}

SHARDOPT_KERNEL_FN void PieceSquaresItem(const float* x, const AdafactorShape& s, double* sums,
                                         size_t k) {
  size_t start, count;
  PieceOf(s, k, start, count);
  sums[k] = LaneSquares(x + start, count);
}

SHARDOPT_KERNEL_FN void FactorRowItem(const float* grad, float* row_var, const AdafactorShape& s,
                                      float weight, size_t row) {
  const float norm = Fp32Norm(LaneSquares(grad + row * s.cols, s.cols));
  const float mean = Div(Mul(norm, norm), static_cast<float>(s.cols));
  row_var[row] = TorchLerp(row_var[row], mean, weight);
}

// Item (b * row_blocks + block) * cols + k: column k of batch b over the
// block's rows, in order.
SHARDOPT_KERNEL_FN void ColumnBlockItem(const float* grad, double* partials,
                                        const AdafactorShape& s, size_t item) {
  const size_t k = item % s.cols;
  const size_t batch_block = item / s.cols;
  const size_t b = batch_block / s.row_blocks(), block = batch_block % s.row_blocks();
  const size_t first = block * kAdafactorColumnBlockRows;
  const size_t last =
      first + kAdafactorColumnBlockRows < s.rows ? first + kAdafactorColumnBlockRows : s.rows;
  const float* g = grad + b * s.rows * s.cols + k;
  double squares = 0;
  for (size_t r = first; r < last; ++r) squares = AddD(squares, SquareD(g[r * s.cols]));
  partials[item] = squares;
}

// Item b * cols + k: column k of batch b, its blocks' sums in order.
SHARDOPT_KERNEL_FN void FactorColumnItem(const double* partials, float* col_var,
                                         const AdafactorShape& s, float weight, size_t item) {
  const size_t b = item / s.cols, k = item % s.cols;
  double squares = 0;
  for (size_t block = 0; block < s.row_blocks(); ++block) {
    squares = AddD(squares, partials[(b * s.row_blocks() + block) * s.cols + k]);
  }
  const float norm = Fp32Norm(squares);
  const float mean = Div(Mul(norm, norm), static_cast<float>(s.rows));
  col_var[item] = TorchLerp(col_var[item], mean, weight);
}

SHARDOPT_KERNEL_FN void RowDenominatorItem(const float* row_var, float* denominators,
                                           const AdafactorShape& s, float eps1, size_t b) {
  double sum = 0;
  for (size_t r = 0; r < s.rows; ++r) {
    sum = AddD(sum, static_cast<double>(row_var[b * s.rows + r]));
  }
  denominators[b] = MaxF(static_cast<float>(DivD(sum, static_cast<double>(s.rows))), eps1);
}

SHARDOPT_KERNEL_FN void VarianceItem(const float* grad, float* variance, float sign, float weight,
                                     size_t i) {
  const float g = Mul(sign, grad[i]);
  variance[i] = TorchLerp(variance[i], Mul(g, g), weight);
}

// U[i], as the CPU kernel computes it.
SHARDOPT_KERNEL_FN float UpdateOf(const AdafactorUpdateArgs& a, size_t i) {
  float v;
  if (a.shape.factored) {
    const size_t row = i / a.shape.cols;
    const size_t b = row / a.shape.rows;
    const size_t k = i % a.shape.cols;
    v = Div(Mul(a.row_var[row], a.col_var[b * a.shape.cols + k]), a.denominators[b]);
  } else {
    v = a.row_var[i];
  }
  return Mul(Div(1.0f, Sqrt(MaxF(v, a.variance_floor))), Mul(a.sign, a.grad[i]));
}

SHARDOPT_KERNEL_FN void UpdateSquaresItem(const AdafactorUpdateArgs& a, double* sums, size_t k) {
  size_t start, count;
  PieceOf(a.shape, k, start, count);
  sums[k] = LaneSquaresOf(count, [&](size_t i) { return UpdateOf(a, start + i); });
}

SHARDOPT_KERNEL_FN void ApplyItem(const AdafactorUpdateArgs& a, float* params, float step_scale,
                                  size_t i) {
  params[i] = Add(params[i], Mul(step_scale, UpdateOf(a, i)));
}

}  // namespace body
}  // namespace internal
}  // namespace gpu
}  // namespace shardopt

#endif  // SHARDOPT_SERVER_CUDA_ADAFACTOR_KERNEL_BODY_H_
