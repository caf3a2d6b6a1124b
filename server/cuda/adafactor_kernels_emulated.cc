// adafactor_kernels.h on HOST memory, for tests: adafactor_kernel_body.h's
// per-item code run for every item, in order (each item's result depends
// on its own inputs alone, so the order does not matter), and its staged
// sums warp after warp, lane after lane. Never link it
// together with the real kernels (:adafactor).
#include <cstring>

#include "server/cuda/adafactor_kernel_body.h"
#include "server/cuda/adafactor_kernels.h"

namespace shardopt {
namespace gpu {

namespace body = internal::body;

absl::Status PieceSquares(const float* x, const AdafactorShape& s, double* sums, void*) {
  body::RunStagedSquaresOnHost(body::PieceSquaresJob{x, s, sums});
  return absl::OkStatus();
}

absl::Status ScaleParams(float* x, size_t n, float factor, void*) {
  for (size_t i = 0; i < n; ++i) x[i] = body::Mul(x[i], factor);
  return absl::OkStatus();
}

absl::Status FactorRows(const float* grad, float* row_var, const AdafactorShape& s, float weight,
                        double* piece_sums, void*) {
  if (absl::Status st = PieceSquares(grad, s, piece_sums, nullptr); !st.ok()) return st;
  for (size_t row = 0; row < s.batches * s.rows; ++row) {
    body::FactorRowItem(piece_sums, row_var, s, weight, row);
  }
  return absl::OkStatus();
}

absl::Status FactorColumnBlocks(const float* grad, double* partials, const AdafactorShape& s,
                                void*) {
  for (size_t item = 0; item < s.column_partials(); ++item) {
    body::ColumnBlockItem(grad, partials, s, item);
  }
  return absl::OkStatus();
}

absl::Status FactorColumns(const double* partials, float* col_var, const AdafactorShape& s,
                           float weight, void*) {
  for (size_t item = 0; item < s.batches * s.cols; ++item) {
    body::FactorColumnItem(partials, col_var, s, weight, item);
  }
  return absl::OkStatus();
}

absl::Status RowDenominators(const float* row_var, float* denominators, const AdafactorShape& s,
                             float eps1, void*) {
  for (size_t b = 0; b < s.batches; ++b)
    body::RowDenominatorItem(row_var, denominators, s, eps1, b);
  return absl::OkStatus();
}

absl::Status UpdateVariance(const float* grad, float* variance, size_t n, float sign, float weight,
                            void*) {
  for (size_t i = 0; i < n; ++i) body::VarianceItem(grad, variance, sign, weight, i);
  return absl::OkStatus();
}

absl::Status UpdateSquares(const AdafactorUpdateArgs& a, double* sums, void*) {
  body::RunStagedSquaresOnHost(body::UpdateSquaresJob{a, sums});
  return absl::OkStatus();
}

absl::Status ApplyUpdate(const AdafactorUpdateArgs& a, float* params, float step_scale, void*) {
  for (size_t i = 0; i < a.shape.n; ++i) body::ApplyItem(a, params, step_scale, i);
  return absl::OkStatus();
}

absl::Status CopySumsToHost(double* host, const double* device, size_t count, void*) {
  if (count > 0) std::memcpy(host, device, count * sizeof(double));
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace shardopt
