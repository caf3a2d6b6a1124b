// Internal to //server/cuda: the per-work-item code of Adafactor's kernels,
// written once for the device (adafactor_kernels.cu) and the host
// (adafactor_kernels_emulated.cc, which runs it item after item). The fp32
// operations are fused_kernel_body.h's; the double ones lane_squares_body.h's
// and DivD / SqrtD below (__ddiv_rn / __dsqrt_rn on the device). The sums of
// squares over pieces and rows are lane_squares_body.h jobs (a warp per 32
// runs, read coalesced).
#ifndef SHARDOPT_SERVER_CUDA_ADAFACTOR_KERNEL_BODY_H_
#define SHARDOPT_SERVER_CUDA_ADAFACTOR_KERNEL_BODY_H_

#include "server/cuda/adafactor_kernels.h"
#include "server/cuda/lane_squares_body.h"

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

// sums[k] = SumOfSquares of x over piece k.
struct PieceSquaresJob {
  static constexpr int kValues = 1;
  static constexpr int kBatch = 16;
  struct Raw {
    float x;
  };
  const float* x;
  AdafactorShape shape;
  double* sums;

  SHARDOPT_KERNEL_FN size_t runs() const { return shape.pieces(); }
  SHARDOPT_KERNEL_FN void Describe(size_t k, StagedRun& r) const {
    size_t start, count;
    PieceOf(shape, k, start, count);
    r.start = start;
    r.count = count;
  }
  SHARDOPT_KERNEL_FN void Load(const StagedRun& r, size_t k, Raw& raw) const {
    raw.x = x[r.start + k];
  }
  SHARDOPT_KERNEL_FN void Values(const Raw& raw, float (&v)[1]) const { v[0] = raw.x; }
  SHARDOPT_KERNEL_FN void Write(size_t k, const double (&squares)[1]) const { sums[k] = squares[0]; }
};

// Row factors (factored): row_var[row] = lerp(row_var[row], ||g_row||^2 /
// cols, weight), the norm in fp32 from the row's pieces' sums (a
// PieceSquaresJob over g) added in order.
SHARDOPT_KERNEL_FN void FactorRowItem(const double* piece_sums, float* row_var,
                                      const AdafactorShape& s, float weight, size_t row) {
  const size_t per_row = s.pieces_per_row();
  double squares = 0;
  for (size_t j = 0; j < per_row; ++j) squares = AddD(squares, piece_sums[row * per_row + j]);
  const float norm = Fp32Norm(squares);
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

// A batch's denominator from the sum of its row factors, added in order.
SHARDOPT_KERNEL_FN float RowDenominatorOf(double row_sum, const AdafactorShape& s, float eps1) {
  return MaxF(static_cast<float>(DivD(row_sum, static_cast<double>(s.rows))), eps1);
}

SHARDOPT_KERNEL_FN void RowDenominatorItem(const float* row_var, float* denominators,
                                           const AdafactorShape& s, float eps1, size_t b) {
  double sum = 0;
  for (size_t r = 0; r < s.rows; ++r) {
    sum = AddD(sum, static_cast<double>(row_var[b * s.rows + r]));
  }
  denominators[b] = RowDenominatorOf(sum, s, eps1);
}

SHARDOPT_KERNEL_FN void VarianceItem(const float* grad, float* variance, float sign, float weight,
                                     size_t i) {
  const float g = Mul(sign, grad[i]);
  variance[i] = TorchLerp(variance[i], Mul(g, g), weight);
}

// What U at one element reads: the gradient and the second moment's
// estimate's parts (factored: row factor, column factor, denominator;
// unfactored: the variance, in `row`).
struct UpdateInputs {
  float g, row, col, denominator;
};

// U, as the CPU kernel computes it, from what it reads.
SHARDOPT_KERNEL_FN float UpdateFrom(const AdafactorUpdateArgs& a, const UpdateInputs& in) {
  const float v = a.shape.factored ? Div(Mul(in.row, in.col), in.denominator) : in.row;
  return Mul(Div(1.0f, Sqrt(MaxF(v, a.variance_floor))), Mul(a.sign, in.g));
}

// U[i]'s inputs; factored, i is in row `row` (of batch `batch`) and column
// `col`.
SHARDOPT_KERNEL_FN UpdateInputs UpdateInputsAt(const AdafactorUpdateArgs& a, size_t i, size_t row,
                                               size_t batch, size_t col) {
  UpdateInputs in;
  in.g = a.grad[i];
  if (a.shape.factored) {
    in.row = a.row_var[row];
    in.col = a.col_var[batch * a.shape.cols + col];
    in.denominator = a.denominators[batch];
  } else {
    in.row = a.row_var[i];
    in.col = in.denominator = 0;
  }
  return in;
}

SHARDOPT_KERNEL_FN float UpdateAt(const AdafactorUpdateArgs& a, size_t i, size_t row, size_t batch,
                                  size_t col) {
  return UpdateFrom(a, UpdateInputsAt(a, i, row, batch, col));
}

// U[i] from i alone: 32-bit divisions where the tensor allows (a 64-bit one
// costs several times more, and the apply pass does two per element).
SHARDOPT_KERNEL_FN float UpdateOf(const AdafactorUpdateArgs& a, size_t i) {
  if (!a.shape.factored) return UpdateAt(a, i, 0, 0, 0);
  if (a.shape.n <= 0xffffffffu) {
    const uint32_t i32 = static_cast<uint32_t>(i);
    const uint32_t cols = static_cast<uint32_t>(a.shape.cols);
    const uint32_t row = i32 / cols;
    return UpdateAt(a, i, row, row / static_cast<uint32_t>(a.shape.rows), i32 - row * cols);
  }
  const size_t row = i / a.shape.cols;
  return UpdateAt(a, i, row, row / a.shape.rows, i - row * a.shape.cols);
}

// sums[k] = SumOfSquares of U over piece k (a piece lies in one row).
struct UpdateSquaresJob {
  static constexpr int kValues = 1;
  static constexpr int kBatch = 8;
  using Raw = UpdateInputs;
  AdafactorUpdateArgs a;
  double* sums;

  SHARDOPT_KERNEL_FN size_t runs() const { return a.shape.pieces(); }
  SHARDOPT_KERNEL_FN void Describe(size_t k, StagedRun& r) const {
    size_t start, count;
    PieceOf(a.shape, k, start, count);
    r.start = start;
    r.count = count;
    if (a.shape.factored) {
      r.row = start / a.shape.cols;
      r.batch = r.row / a.shape.rows;
    }
  }
  SHARDOPT_KERNEL_FN void Load(const StagedRun& r, size_t k, Raw& raw) const {
    const size_t i = r.start + k;
    raw = UpdateInputsAt(a, i, r.row, r.batch, a.shape.factored ? i - r.row * a.shape.cols : 0);
  }
  SHARDOPT_KERNEL_FN void Values(const Raw& raw, float (&v)[1]) const { v[0] = UpdateFrom(a, raw); }
  SHARDOPT_KERNEL_FN void Write(size_t k, const double (&squares)[1]) const { sums[k] = squares[0]; }
};

SHARDOPT_KERNEL_FN void ApplyItem(const AdafactorUpdateArgs& a, float* params, float step_scale,
                                  size_t i) {
  params[i] = Add(params[i], Mul(step_scale, UpdateOf(a, i)));
}

// The same for element i of a factored tensor whose row, batch and column
// the caller knows (the device's row-wise apply).
SHARDOPT_KERNEL_FN void ApplyAt(const AdafactorUpdateArgs& a, float* params, float step_scale,
                                size_t i, size_t row, size_t batch, size_t col) {
  params[i] = Add(params[i], Mul(step_scale, UpdateAt(a, i, row, batch, col)));
}

}  // namespace body
}  // namespace internal
}  // namespace gpu
}  // namespace shardopt

#endif  // SHARDOPT_SERVER_CUDA_ADAFACTOR_KERNEL_BODY_H_
