// torch.optim.Adagrad (1.13, foreach=False, dense gradients), per element in
// fp32, in PyTorch's operation order:
//   g = maximize ? -grad : grad
//   if weight_decay != 0: g = g + weight_decay * p     (grad.add(param, alpha=wd))
//   sum = sum + g * g                                  (state_sum.addcmul_(g, g, value=1))
//   std = sqrt(sum) + eps
//   p = p + ((-clr) * g) / std                         (param.addcdiv_(g, std, value=-clr))
// with clr = lr / (1 + (step - 1) * lr_decay) in double on the host.
#include <cassert>
#include <cmath>
#include <memory>

#include "server/optim/optimizer.h"
#include "server/optim/optimizer_internal.h"

namespace shardopt {
namespace optim_internal {
namespace {

template <bool kMaximize, bool kWeightDecay>
SHARDOPT_ELEMENTWISE_KERNEL
void AdagradKernel(float* __restrict p, const float* __restrict grad, float* __restrict sum,
                   size_t begin, size_t end, float wd, float eps, float neg_clr) {
  for (size_t i = begin; i < end; ++i) {
    float g = kMaximize ? -grad[i] : grad[i];
    if (kWeightDecay) g = g + wd * p[i];
    const float s = sum[i] + g * g;
    sum[i] = s;
    const float std_dev = std::sqrt(s) + eps;
    p[i] = p[i] + (neg_clr * g) / std_dev;
  }
}

class Adagrad final : public Optimizer {
 public:
  Adagrad(const OptimizerConfig& config, size_t size) : Optimizer(config, size) {
    sum_ = AddSlot("sum", static_cast<float>(config.initial_accumulator_value));
  }

  void Update(int64_t step, float* params, const float* grad, size_t begin, size_t end) override {
    assert(step >= 1 && begin <= end && end <= size());
    const OptimizerConfig& c = config();
    const double clr = c.lr / (1.0 + (TorchStep(step) - 1.0) * c.lr_decay);
    const float wd = static_cast<float>(c.weight_decay);
    const float eps = static_cast<float>(c.eps);
    const float neg_clr = static_cast<float>(-clr);
    float* const sum = sum_;
    DispatchBool(c.maximize, [&](auto maximize) {
      DispatchBool(c.weight_decay != 0.0, [&](auto weight_decay) {
        AdagradKernel<decltype(maximize)::value, decltype(weight_decay)::value>(
            params, grad, sum, begin, end, wd, eps, neg_clr);
      });
    });
  }

 private:
  float* sum_ = nullptr;
};

}  // namespace

std::unique_ptr<Optimizer> NewAdagrad(const OptimizerConfig& config, size_t size) {
  return std::make_unique<Adagrad>(config, size);
}

}  // namespace optim_internal
}  // namespace shardopt
