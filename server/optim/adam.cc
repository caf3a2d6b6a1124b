// torch.optim.Adam and torch.optim.AdamW (1.13, foreach=False, not capturable),
// per element in fp32, in PyTorch's operation order:
//   g = maximize ? -grad : grad
//   Adam, if weight_decay != 0: g = g + weight_decay * p     (grad.add(param, alpha=wd))
//   AdamW:                      p = p * (1 - lr * weight_decay)
//   m = m * beta1 + (1 - beta1) * g              (exp_avg.mul_(b1).add_(grad, alpha=1-b1))
//   v = v * beta2 + ((1 - beta2) * g) * g        (exp_avg_sq.mul_(b2).addcmul_(g, g, value=1-b2))
//   amsgrad: vmax = maximum(vmax, v); v' = vmax, else v' = v
//   denom = sqrt(v') / sqrt(bias_correction2) + eps
//   p = p + ((-step_size) * m) / denom           (param.addcdiv_(m, denom, value=-step_size))
// with, in double on the host, bias_correction1 = 1 - beta1^step,
// bias_correction2 = 1 - beta2^step, step_size = lr / bias_correction1.
// Every double that PyTorch hands a tensor op as a Python float becomes fp32.
// Note addcdiv_ computes (value * m) / denom, not value * (m / denom).
#include <cassert>
#include <cmath>
#include <memory>

#include "server/optim/optimizer.h"
#include "server/optim/optimizer_internal.h"

namespace shardopt {
namespace optim_internal {
namespace {

struct AdamScalars {
  float weight_decay;  // Adam's L2 term.
  float decay;         // AdamW's 1 - lr * weight_decay.
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float bias_correction2_sqrt;
  float eps;
  float neg_step_size;
};

template <bool kMaximize, bool kL2, bool kDecoupled, bool kAmsgrad>
SHARDOPT_ELEMENTWISE_KERNEL
void AdamKernel(float* __restrict p, const float* __restrict grad, float* __restrict m,
                float* __restrict v, float* __restrict vmax, size_t begin, size_t end,
                const AdamScalars s) {
  for (size_t i = begin; i < end; ++i) {
    float g = kMaximize ? -grad[i] : grad[i];
    float param = p[i];
    if (kL2) g = g + s.weight_decay * param;
    if (kDecoupled) param = param * s.decay;
    const float m_new = m[i] * s.beta1 + s.one_minus_beta1 * g;
    const float v_new = v[i] * s.beta2 + (s.one_minus_beta2 * g) * g;
    m[i] = m_new;
    v[i] = v_new;
    float v_hat = v_new;
    if (kAmsgrad) {
      v_hat = TorchMaximum(vmax[i], v_new);
      vmax[i] = v_hat;
    }
    const float denom = std::sqrt(v_hat) / s.bias_correction2_sqrt + s.eps;
    p[i] = param + (s.neg_step_size * m_new) / denom;
  }
}

class Adam final : public Optimizer {
 public:
  Adam(const OptimizerConfig& config, size_t size) : Optimizer(config, size) {
    exp_avg_ = AddSlot("exp_avg", 0.0f);
    exp_avg_sq_ = AddSlot("exp_avg_sq", 0.0f);
    if (config.amsgrad) max_exp_avg_sq_ = AddSlot("max_exp_avg_sq", 0.0f);
  }

  void Update(int64_t step, float* params, const float* grad, size_t begin, size_t end) override {
    assert(step >= 1 && begin <= end && end <= size());
    const OptimizerConfig& c = config();
    const bool adamw = c.kind == OptimizerKind::kAdamW;
    const double t = TorchStep(step);
    const double bias_correction1 = 1.0 - std::pow(c.beta1, t);
    const double bias_correction2 = 1.0 - std::pow(c.beta2, t);
    const double step_size = c.lr / bias_correction1;
    AdamScalars s;
    s.weight_decay = static_cast<float>(c.weight_decay);
    s.decay = static_cast<float>(1.0 - c.lr * c.weight_decay);
    s.beta1 = static_cast<float>(c.beta1);
    s.one_minus_beta1 = static_cast<float>(1.0 - c.beta1);
    s.beta2 = static_cast<float>(c.beta2);
    s.one_minus_beta2 = static_cast<float>(1.0 - c.beta2);
    s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
    s.eps = static_cast<float>(c.eps);
    s.neg_step_size = static_cast<float>(-step_size);
    // AdamW multiplies by 1 - lr * wd unconditionally; skipping a multiply by
    // exactly 1.0f changes nothing.
    const bool l2 = !adamw && c.weight_decay != 0.0;
    const bool decoupled = adamw && s.decay != 1.0f;
    float* const m = exp_avg_;
    float* const v = exp_avg_sq_;
    float* const vmax = max_exp_avg_sq_;
    DispatchBool(c.maximize, [&](auto maximize) {
      DispatchBool(l2, [&](auto l2_c) {
        DispatchBool(decoupled, [&](auto decoupled_c) {
          DispatchBool(c.amsgrad, [&](auto amsgrad) {
            AdamKernel<decltype(maximize)::value, decltype(l2_c)::value,
                       decltype(decoupled_c)::value, decltype(amsgrad)::value>(params, grad, m, v,
                                                                               vmax, begin, end, s);
          });
        });
      });
    });
  }

 private:
  float* exp_avg_ = nullptr;
  float* exp_avg_sq_ = nullptr;
  float* max_exp_avg_sq_ = nullptr;  // Only with amsgrad.
};

}  // namespace

std::unique_ptr<Optimizer> NewAdam(const OptimizerConfig& config, size_t size) {
  return std::make_unique<Adam>(config, size);
}

}  // namespace optim_internal
}  // namespace shardopt
