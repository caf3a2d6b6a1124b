// Adafactor as torch.optim.Adafactor (PyTorch 2.5+, its single-tensor
// path) computes it, one whole tensor at a time (see AdafactorConfig in the
// proto). Per element in fp32, with the scalars rounded to fp32 as torch's
// ops take them. Where torch reduces (norms, means), the sums are taken in
// double in a fixed order (SumOfSquares) and rounded to fp32 once, as
// torch's reductions return fp32: the result differs from torch's own
// reduction order by fp32 rounding only, and depends on nothing but the
// tensor's values.
//
// State: a tensor of shape (..., R, C) keeps its B*R row factors (B the
// product of the leading dimensions) at the start of its part of slot
// "row_var" and its B*C column factors at the start of its part of
// "col_var"; a tensor of fewer than two dimensions keeps torch's "variance"
// in "row_var". Both slots are packed (Optimizer::AddPackedSlot): only
// those elements are stored, and the rest of each slot reads as zero.
#include <algorithm>
#include <cassert>
#include <cfloat>
#include <cmath>
#include <memory>
#include <vector>

#include "server/optim/adafactor_rules.h"
#include "server/optim/optimizer.h"
#include "server/optim/optimizer_internal.h"

namespace shardopt {
namespace optim_internal {
namespace {

inline double Fp32Norm(double sum_of_squares) { return AdafactorFp32Norm(sum_of_squares); }

// The squares of x[0, n) summed in the update's pieces: rows of
// `row_length` elements (n for tensors of fewer than two dimensions) cut
// into kScratchElements, each piece's SumOfSquares added in order. The
// pieces are independent, so the GPU backend sums them in parallel and
// adds them in this order on the host: the same bits.
static_assert(kAdafactorPieceElements == kScratchElements,
              "the update's pieces are the scratch blocks it is computed in");
double PiecewiseSquares(const float* x, size_t n, size_t row_length) {
  double sum = 0;
  for (size_t row = 0; row < n; row += row_length) {
    for (size_t k0 = 0; k0 < row_length; k0 += kScratchElements) {
      sum += SumOfSquares(x + row + k0, std::min(kScratchElements, row_length - k0));
    }
  }
  return sum;
}

class Adafactor final : public WholeTensorOptimizer {
 public:
  Adafactor(const OptimizerConfig& config, size_t size) : WholeTensorOptimizer(config, size) {}

  void UpdateTensor(int64_t step, float* params, const float* grad, size_t tensor) override {
    assert(step >= 1);
    const RangeTensor& t = tensors()[tensor];
    if (t.size == 0) return;
    DispatchBool(config().maximize, [&](auto maximize) {
      Apply<decltype(maximize)::value>(step, params + t.offset, grad + t.offset, t,
                                       row_var_[tensor], col_var_[tensor]);
    });
  }

 private:
  void AddTensorSlots() override {
    row_var_ = AddPackedSlot("row_var");
    col_var_ = AddPackedSlot("col_var");
  }

  // `rows` and `cols`: the tensor's stored elements of row_var and col_var.
  template <bool kMaximize>
  void Apply(int64_t step, float* __restrict p, const float* __restrict grad, const RangeTensor& t,
             float* const rows, float* const cols) {
    const OptimizerConfig& c = config();
    const size_t n = t.size;
    const AdafactorScalars s = AdafactorScalarsOf(c, step);
    const float weight = s.weight;
    const size_t row_length = t.shape.size() >= 2 ? static_cast<size_t>(t.shape.back()) : n;
    const double alpha = AdafactorAlpha(c, s, PiecewiseSquares(p, n, row_length), n);
    if (s.decays) {
      for (size_t i = 0; i < n; ++i) p[i] = p[i] * s.decay;
    }
    const float variance_floor = s.variance_floor;
    // The gradient's sign as the formulas see it (squares do not care).
    const float sign = kMaximize ? -1.0f : 1.0f;

    // Each piece of the update, U = rsqrt(max(V, eps1^2)) * g, is computed
    // into `u` by a `for_each_piece` below, which ApplyClipped runs twice.
    float u[kScratchElements];
    if (t.shape.size() >= 2) {
      const size_t num_cols = static_cast<size_t>(t.shape.back());
      const size_t num_rows = static_cast<size_t>(t.shape[t.shape.size() - 2]);
      const size_t batches = n / (num_rows * num_cols);
      // A column's squares are summed per block of kAdafactorColumnBlockRows
      // rows, the blocks' sums then added in order: the GPU sums the blocks
      // in parallel (a column of a tall matrix is too long for one thread).
      std::vector<double> col_squares(num_cols);
      std::vector<double> block_squares(num_cols);
      std::vector<float> row_denominator(batches);
      for (size_t b = 0; b < batches; ++b) {
        std::fill(col_squares.begin(), col_squares.end(), 0.0);
        for (size_t r0 = 0; r0 < num_rows; r0 += kAdafactorColumnBlockRows) {
          std::fill(block_squares.begin(), block_squares.end(), 0.0);
          const size_t r_end = std::min<size_t>(num_rows, r0 + kAdafactorColumnBlockRows);
          for (size_t r = r0; r < r_end; ++r) {
            const float* __restrict g = grad + (b * num_rows + r) * num_cols;
            // Piece by piece, as the GPU sums a row (a row of a wide
            // matrix is too long for one warp's lane chains).
            const float norm = static_cast<float>(Fp32Norm(PiecewiseSquares(g, num_cols, num_cols)));
            const float mean = norm * norm / static_cast<float>(num_cols);
            rows[b * num_rows + r] = TorchLerp(rows[b * num_rows + r], mean, weight);
            for (size_t k = 0; k < num_cols; ++k) {
              block_squares[k] += static_cast<double>(g[k]) * g[k];
            }
          }
          for (size_t k = 0; k < num_cols; ++k) col_squares[k] += block_squares[k];
        }
        for (size_t k = 0; k < num_cols; ++k) {
          const float norm = static_cast<float>(Fp32Norm(col_squares[k]));
          const float mean = norm * norm / static_cast<float>(num_rows);
          cols[b * num_cols + k] = TorchLerp(cols[b * num_cols + k], mean, weight);
        }
        double row_sum = 0;
        for (size_t r = 0; r < num_rows; ++r) row_sum += rows[b * num_rows + r];
        row_denominator[b] =
            std::max(static_cast<float>(row_sum / static_cast<double>(num_rows)), s.eps1);
      }
      // Row by row, in pieces of at most kScratchElements columns.
      auto for_each_piece = [&](auto&& use) {
        for (size_t b = 0; b < batches; ++b) {
          for (size_t r = 0; r < num_rows; ++r) {
            const size_t row = b * num_rows + r;
            const float row_factor = rows[row];
            const float* __restrict col_factor = cols + b * num_cols;
            for (size_t k0 = 0; k0 < num_cols; k0 += kScratchElements) {
              const size_t count = std::min(kScratchElements, num_cols - k0);
              const float* __restrict g = grad + row * num_cols + k0;
              for (size_t k = 0; k < count; ++k) {
                const float v = row_factor * col_factor[k0 + k] / row_denominator[b];
                u[k] = (1.0f / std::sqrt(std::max(v, variance_floor))) * (sign * g[k]);
              }
              use(row * num_cols + k0, count);
            }
          }
        }
      };
      ApplyClipped(p, n, alpha, u, for_each_piece);
      return;
    }
    for (size_t i = 0; i < n; ++i) {
      const float g = sign * grad[i];
      rows[i] = TorchLerp(rows[i], g * g, weight);
    }
    auto for_each_piece = [&](auto&& use) {
      for (size_t at = 0; at < n; at += kScratchElements) {
        const size_t count = std::min(kScratchElements, n - at);
        for (size_t k = 0; k < count; ++k) {
          u[k] = (1.0f / std::sqrt(std::max(rows[at + k], variance_floor))) * (sign * grad[at + k]);
        }
        use(at, count);
      }
    };
    ApplyClipped(p, n, alpha, u, for_each_piece);
  }

  // p = p - alpha / max(1, RMS(U) / d) * U for the n elements of U that
  // for_each_piece(use) computes into `u` piece by piece, calling use(at,
  // count) for elements [at, at + count): run twice, once for the norm and
  // once to apply (same values, same operations: the same bits).
  template <typename Pieces>
  void ApplyClipped(float* p, size_t n, double alpha, const float* u, const Pieces& for_each_piece) {
    double u_squares = 0;
    for_each_piece([&](size_t, size_t count) { u_squares += SumOfSquares(u, count); });
    const float step_scale = AdafactorStepScale(config(), alpha, u_squares, n);
    for_each_piece([&](size_t at, size_t count) {
      for (size_t k = 0; k < count; ++k) p[at + k] = p[at + k] + step_scale * u[k];
    });
  }

  // Per tensor, in tensors() order.
  std::vector<float*> row_var_;
  std::vector<float*> col_var_;
};

}  // namespace

std::unique_ptr<Optimizer> NewAdafactor(const OptimizerConfig& config, size_t size) {
  return std::make_unique<Adafactor>(config, size);
}

}  // namespace optim_internal
}  // namespace shardopt
