// Lion (Chen et al. 2023) as the reference lion-pytorch update does it, per
// element in fp32 in its operation order (see LionConfig in the proto):
//   g = maximize ? -grad : grad
//   if weight_decay != 0: p = p * decay            (p.mul_(1 - lr * wd))
//   c = m * beta1 + (1 - beta1) * g                (exp_avg.mul(beta1).add(g, alpha=1 - beta1))
//   p = p + (-lr) * sign(c)                        (p.add_(c.sign(), alpha=-lr))
//   m = m * beta2 + (1 - beta2) * g                (exp_avg.mul_(beta2).add_(g, alpha=1 - beta2))
// with decay = 1 - lr * wd and every scalar rounded to fp32, as torch's ops
// take them.
#include <cassert>
#include <memory>

#include "server/optim/optimizer.h"
#include "server/optim/optimizer_internal.h"

namespace shardopt {
namespace optim_internal {
namespace {

// torch.sign for floats: -1, 0 or 1 (the sign of zero is zero).
inline float Sign(float x) { return static_cast<float>((x > 0.0f) - (x < 0.0f)); }

template <bool kMaximize, bool kWeightDecay>
SHARDOPT_ELEMENTWISE_KERNEL
void LionKernel(float* __restrict p, const float* __restrict grad, float* __restrict m,
                size_t begin, size_t end, float decay, float beta1, float one_minus_beta1,
                float beta2, float one_minus_beta2, float neg_lr) {
  for (size_t i = begin; i < end; ++i) {
    const float g = kMaximize ? -grad[i] : grad[i];
    float x = p[i];
    if (kWeightDecay) x = x * decay;
    const float c = m[i] * beta1 + one_minus_beta1 * g;
    p[i] = x + neg_lr * Sign(c);
    m[i] = m[i] * beta2 + one_minus_beta2 * g;
  }
}

class Lion final : public Optimizer {
 public:
  Lion(const OptimizerConfig& config, size_t size) : Optimizer(config, size) {
    exp_avg_ = AddSlot("exp_avg", 0.0f);
  }

  void Update(int64_t step, float* params, const float* grad, size_t begin, size_t end) override {
    assert(step >= 1 && begin <= end && end <= size());
    (void)step;  // Lion has no step-dependent scalar.
    const OptimizerConfig& c = config();
    const float decay = static_cast<float>(1.0 - c.lr * c.weight_decay);
    const float beta1 = static_cast<float>(c.beta1);
    const float one_minus_beta1 = static_cast<float>(1.0 - c.beta1);
    const float beta2 = static_cast<float>(c.beta2);
    const float one_minus_beta2 = static_cast<float>(1.0 - c.beta2);
    const float neg_lr = static_cast<float>(-c.lr);
    float* const m = exp_avg_;
    DispatchBool(c.maximize, [&](auto maximize) {
      DispatchBool(c.weight_decay != 0.0, [&](auto weight_decay) {
        LionKernel<decltype(maximize)::value, decltype(weight_decay)::value>(
            params, grad, m, begin, end, decay, beta1, one_minus_beta1, beta2, one_minus_beta2,
            neg_lr);
      });
    });
  }

 private:
  float* exp_avg_ = nullptr;
};

}  // namespace

std::unique_ptr<Optimizer> NewLion(const OptimizerConfig& config, size_t size) {
  return std::make_unique<Lion>(config, size);
}

}  // namespace optim_internal
}  // namespace shardopt
