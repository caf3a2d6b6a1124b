// LAMB (You et al. 2019) as DeepSpeed's FusedLamb computes it (apex's
// FusedLAMB in adam_w_mode, with DeepSpeed's clamp of the trust ratio), one
// whole tensor at a time (see LambConfig in the proto):
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g * g
//   u = (m / c1) / (sqrt(v / c2) + eps) + weight_decay * p
//   r = clamp(||p|| / ||u||, min_trust_ratio, max_trust_ratio), 1 if a norm is 0
//   p = p - float(lr * r) * u
// Per element in fp32 with the scalars rounded to fp32; the norms are sums
// of squares in double in a fixed order (SumOfSquares over fixed blocks, so
// they depend on nothing but the tensor's values). u is computed twice, before and after the norms,
// from the same fp32 values with the same operations, so both passes agree to the bit and no
// scratch copy of the tensor is needed.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <memory>

#include "server/optim/optimizer.h"
#include "server/optim/optimizer_internal.h"

namespace shardopt {
namespace optim_internal {
namespace {

struct LambScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, c1, c2, eps, weight_decay;
};

inline float LambDirection(const LambScalars& s, float m, float v, float p) {
  return (m / s.c1) / (std::sqrt(v / s.c2) + s.eps) + s.weight_decay * p;
}

class Lamb final : public WholeTensorOptimizer {
 public:
  Lamb(const OptimizerConfig& config, size_t size) : WholeTensorOptimizer(config, size) {
    exp_avg_ = AddSlot("exp_avg", 0.0f);
    exp_avg_sq_ = AddSlot("exp_avg_sq", 0.0f);
  }

  void UpdateTensor(int64_t step, float* params, const float* grad, size_t tensor) override {
    assert(step >= 1);
    const OptimizerConfig& c = config();
    const double t = static_cast<double>(step);
    LambScalars s;
    s.beta1 = static_cast<float>(c.beta1);
    s.one_minus_beta1 = static_cast<float>(1.0 - c.beta1);
    s.beta2 = static_cast<float>(c.beta2);
    s.one_minus_beta2 = static_cast<float>(1.0 - c.beta2);
    s.c1 = c.bias_correction ? static_cast<float>(1.0 - std::pow(c.beta1, t)) : 1.0f;
    s.c2 = c.bias_correction ? static_cast<float>(1.0 - std::pow(c.beta2, t)) : 1.0f;
    s.eps = static_cast<float>(c.eps);
    s.weight_decay = static_cast<float>(c.weight_decay);
    DispatchBool(c.maximize, [&](auto maximize) {
      Apply<decltype(maximize)::value>(s, params, grad, tensors()[tensor]);
    });
  }

 private:
  template <bool kMaximize>
  void Apply(const LambScalars& s, float* __restrict params, const float* __restrict grad,
             const RangeTensor& tensor) {
    const size_t begin = tensor.offset, end = tensor.offset + tensor.size;
    float* __restrict m = exp_avg_;
    float* __restrict v = exp_avg_sq_;
    float u[kScratchElements];
    double p_squares = 0, u_squares = 0;
    for (size_t block = begin; block < end; block += kScratchElements) {
      const size_t n = std::min(kScratchElements, end - block);
      for (size_t k = 0; k < n; ++k) {
        const size_t i = block + k;
        const float g = kMaximize ? -grad[i] : grad[i];
        m[i] = s.beta1 * m[i] + s.one_minus_beta1 * g;
        v[i] = s.beta2 * v[i] + s.one_minus_beta2 * g * g;
        u[k] = LambDirection(s, m[i], v[i], params[i]);
      }
      p_squares += SumOfSquares(params + block, n);
      u_squares += SumOfSquares(u, n);
    }
    const OptimizerConfig& c = config();
    double ratio = 1.0;
    if (p_squares > 0 && u_squares > 0) {
      ratio = std::sqrt(p_squares) / std::sqrt(u_squares);
      ratio = std::max(ratio, c.min_trust_ratio);
      if (c.max_trust_ratio > 0) ratio = std::min(ratio, c.max_trust_ratio);
    }
    const float step_size = static_cast<float>(c.lr * ratio);
    for (size_t i = begin; i < end; ++i) {
      params[i] = params[i] - step_size * LambDirection(s, m[i], v[i], params[i]);
    }
  }

  float* exp_avg_ = nullptr;
  float* exp_avg_sq_ = nullptr;
};

}  // namespace

std::unique_ptr<Optimizer> NewLamb(const OptimizerConfig& config, size_t size) {
  return std::make_unique<Lamb>(config, size);
}

}  // namespace optim_internal
}  // namespace shardopt
