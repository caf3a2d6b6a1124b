#include "server/cuda/adafactor_step.h"

#include <algorithm>

#include "server/optim/adafactor_rules.h"

namespace shardopt {
namespace gpu {

static_assert(gpu::kAdafactorPieceElements == shardopt::kAdafactorPieceElements,
              "the kernels' pieces are the CPU kernel's");
static_assert(gpu::kAdafactorColumnBlockRows == shardopt::kAdafactorColumnBlockRows,
              "the kernels' column blocks are the CPU kernel's");

AdafactorPlan::AdafactorPlan(const std::vector<RangeTensor>& tensors,
                             const std::vector<uint64_t>& row_at,
                             const std::vector<uint64_t>& col_at) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const RangeTensor& t = tensors[i];
    AdafactorTensor a;
    a.offset = t.offset;
    a.shape.n = t.size;
    a.shape.factored = t.shape.size() >= 2 ? 1 : 0;
    a.shape.batches = a.shape.rows = a.shape.cols = 0;
    if (a.shape.factored) {
      a.shape.cols = static_cast<size_t>(t.shape.back());
      a.shape.rows = static_cast<size_t>(t.shape[t.shape.size() - 2]);
      const size_t matrix = a.shape.rows * a.shape.cols;
      a.shape.batches = matrix == 0 ? 0 : t.size / matrix;
    }
    a.row_at = i < row_at.size() ? row_at[i] : 0;
    a.col_at = i < col_at.size() ? col_at[i] : 0;
    max_pieces_ = std::max(max_pieces_, a.shape.n == 0 ? size_t{0} : a.shape.pieces());
    max_batches_ = std::max(max_batches_, a.shape.batches);
    if (a.shape.factored) {
      max_column_partials_ = std::max(max_column_partials_, a.shape.column_partials());
    }
    tensors_.push_back(a);
  }
}

absl::Status AdafactorPlan::Step(const OptimizerConfig& config, int64_t step, float* params,
                                 const float* grad, float* row_store, float* col_store,
                                 double* device_sums, double* host_sums, float* denominators,
                                 double* column_partials, void* stream) const {
  const AdafactorScalars s = AdafactorScalarsOf(config, step);
  // The pieces' sums, added in order on the host.
  auto ordered_sum = [&](size_t pieces, double* sum) -> absl::Status {
    if (absl::Status st = CopySumsToHost(host_sums, device_sums, pieces, stream); !st.ok()) {
      return st;
    }
    *sum = 0;
    for (size_t k = 0; k < pieces; ++k) *sum += host_sums[k];
    return absl::OkStatus();
  };
  for (const AdafactorTensor& t : tensors_) {
    const AdafactorShape& shape = t.shape;
    if (shape.n == 0) continue;
    float* const p = params + t.offset;
    const float* const g = grad + t.offset;
    float* const rows = row_store + t.row_at;
    float* const cols = col_store + t.col_at;
    double param_squares = 0;
    if (absl::Status st = PieceSquares(p, shape, device_sums, stream); !st.ok()) return st;
    if (absl::Status st = ordered_sum(shape.pieces(), &param_squares); !st.ok()) return st;
    const double alpha = AdafactorAlpha(config, s, param_squares, shape.n);
    if (s.decays) {
      if (absl::Status st = ScaleParams(p, shape.n, s.decay, stream); !st.ok()) return st;
    }
    if (shape.factored) {
      // device_sums is free again: the parameters' sums went to the host.
      if (absl::Status st = FactorRows(g, rows, shape, s.weight, device_sums, stream); !st.ok()) {
        return st;
      }
      if (absl::Status st = FactorColumnBlocks(g, column_partials, shape, stream); !st.ok()) {
        return st;
      }
      if (absl::Status st = FactorColumns(column_partials, cols, shape, s.weight, stream);
          !st.ok()) {
        return st;
      }
      if (absl::Status st = RowDenominators(rows, denominators, shape, s.eps1, stream); !st.ok()) {
        return st;
      }
    } else {
      if (absl::Status st = UpdateVariance(g, rows, shape.n, s.sign, s.weight, stream); !st.ok()) {
        return st;
      }
    }
    const AdafactorUpdateArgs update{shape, g, rows, cols, denominators, s.sign, s.variance_floor};
    double update_squares = 0;
    if (absl::Status st = UpdateSquares(update, device_sums, stream); !st.ok()) return st;
    if (absl::Status st = ordered_sum(shape.pieces(), &update_squares); !st.ok()) return st;
    const float step_scale = AdafactorStepScale(config, alpha, update_squares, shape.n);
    if (absl::Status st = ApplyUpdate(update, p, step_scale, stream); !st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace shardopt
