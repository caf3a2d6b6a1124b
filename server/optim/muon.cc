// Muon as torch.optim.Muon defines it (see MuonConfig in the proto), one
// whole 2-D tensor at a time, with the Newton-Schulz products in fp32
// through BLAS (torch runs them in bf16: the orthogonalised updates differ
// by bf16 rounding). The elementwise parts (the momentum lerps, weight
// decay, the update) are fp32 in torch's operation order with the scalars
// rounded to fp32.
//
// BLAS: one thread per matrix (the shard's pool runs matrices in parallel,
// so OpenBLAS's own threads would only oversubscribe the cores); set once,
// through dlsym, so that any CBLAS works.
#include <dlfcn.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <memory>
#include <mutex>
#include <vector>

#include "server/optim/blas.h"
#include "server/optim/muon_workspace.h"
#include "server/optim/optimizer.h"
#include "server/optim/optimizer_internal.h"

namespace shardopt {
namespace optim_internal {
namespace {

class Muon final : public WholeTensorOptimizer {
 public:
  Muon(const OptimizerConfig& config, size_t size) : WholeTensorOptimizer(config, size) {
    momentum_buffer_ = AddSlot("momentum_buffer", 0.0f);
    UseOneBlasThread();
  }

  void UpdateTensor(int64_t step, float* params, const float* grad, size_t tensor) override {
    assert(step >= 1);
    const RangeTensor& t = tensors()[tensor];
    // (2-D only: CheckOptimizerFitsTensor refused anything else.)
    assert(t.shape.size() == 2);
    if (t.size == 0) return;
    const size_t rows = static_cast<size_t>(t.shape[0]);
    const size_t cols = static_cast<size_t>(t.shape[1]);
    const OptimizerConfig& c = config();
    float* const p = params + t.offset;
    const float* const g = grad + t.offset;
    float* const buf = momentum_buffer_ + t.offset;

    // The update before orthogonalisation, laid out m x n with m <= n.
    const bool transpose = rows > cols;
    const size_t m = transpose ? cols : rows;
    const size_t n = transpose ? rows : cols;
    MuonWorkspace workspace;
    workspace.Add(rows, cols);
    std::vector<float> x(workspace.matrix_elements), y(workspace.matrix_elements),
        gram(workspace.gram_elements), poly(workspace.gram_elements);
    const float keep = static_cast<float>(1.0 - c.momentum);
    const float momentum = static_cast<float>(c.momentum);
    for (size_t i = 0; i < rows; ++i) {
      for (size_t j = 0; j < cols; ++j) {
        const size_t e = i * cols + j;
        buf[e] = TorchLerp(buf[e], g[e], keep);
        const float u = c.nesterov ? TorchLerp(g[e], buf[e], momentum) : buf[e];
        x[transpose ? j * rows + i : e] = u;
      }
    }
    const float norm = std::max(static_cast<float>(std::sqrt(SumOfSquares(x.data(), x.size()))),
                                static_cast<float>(c.eps));
    for (float& v : x) v = v / norm;
    const float a = static_cast<float>(c.ns_a), b = static_cast<float>(c.ns_b),
                cc = static_cast<float>(c.ns_c);
    for (int k = 0; k < c.ns_steps; ++k) {
      // gram = X X^T; poly = b gram + c gram gram; y = a X + poly X.
      blas::Sgemm(false, true, m, m, n, 1.0f, x.data(), n, x.data(), n, 0.0f, gram.data(), m);
      poly = gram;
      blas::Sgemm(false, false, m, m, m, cc, gram.data(), m, gram.data(), m, b, poly.data(), m);
      y = x;
      blas::Sgemm(false, false, m, n, m, 1.0f, poly.data(), m, x.data(), n, a, y.data(), n);
      x.swap(y);
    }
    const double ratio = c.adjust_lr == MuonAdjustLr::kOriginal
                             ? std::sqrt(std::max(1.0, static_cast<double>(rows) / cols))
                             : 0.2 * std::sqrt(static_cast<double>(std::max(rows, cols)));
    const float decay = static_cast<float>(1.0 - c.lr * c.weight_decay);
    const float neg_lr = static_cast<float>(-c.lr * ratio);
    for (size_t i = 0; i < rows; ++i) {
      for (size_t j = 0; j < cols; ++j) {
        const size_t e = i * cols + j;
        p[e] = p[e] * decay + neg_lr * x[transpose ? j * rows + i : e];
      }
    }
  }

 private:
  static void UseOneBlasThread() {
    static std::once_flag once;
    std::call_once(once, [] {
      using SetThreads = void (*)(int);
      if (auto set =
              reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
        set(1);
      }
    });
  }

  float* momentum_buffer_ = nullptr;
};

}  // namespace

std::unique_ptr<Optimizer> NewMuon(const OptimizerConfig& config, size_t size) {
  return std::make_unique<Muon>(config, size);
}

}  // namespace optim_internal
}  // namespace shardopt
