// torch.optim.SGD (1.13, foreach=False), per element in fp32:
//   g = maximize ? -grad : grad
//   if weight_decay != 0: g = g + weight_decay * p          (d_p.add(param, alpha=wd))
//   if momentum != 0:
//     step 1: buf = g                                       (torch.clone(d_p))
//     else:   buf = buf * momentum + (1 - dampening) * g    (buf.mul_(m).add_(d_p, alpha=1-d))
//     g = nesterov ? g + momentum * buf : buf
//   p = p + (-lr) * g                                       (param.add_(d_p, alpha=-lr))
#include <cassert>
#include <memory>

#include "server/optim/optimizer.h"
#include "server/optim/optimizer_internal.h"

namespace shardopt {
namespace optim_internal {
namespace {

template <bool kMaximize, bool kWeightDecay>
inline float Grad(const float* __restrict grad, const float* __restrict p, size_t i, float wd) {
  float g = kMaximize ? -grad[i] : grad[i];
  if (kWeightDecay) g = g + wd * p[i];
  return g;
}

template <bool kMaximize, bool kWeightDecay>
SHARDOPT_ELEMENTWISE_KERNEL
void SgdPlain(float* __restrict p, const float* __restrict grad, size_t begin, size_t end, float wd,
              float neg_lr) {
  for (size_t i = begin; i < end; ++i) {
    const float g = Grad<kMaximize, kWeightDecay>(grad, p, i, wd);
    p[i] = p[i] + neg_lr * g;
  }
}

template <bool kMaximize, bool kWeightDecay, bool kFirstStep, bool kNesterov>
SHARDOPT_ELEMENTWISE_KERNEL
void SgdMomentum(float* __restrict p, const float* __restrict grad, float* __restrict buf,
                 size_t begin, size_t end, float wd, float neg_lr, float momentum,
                 float one_minus_dampening) {
  for (size_t i = begin; i < end; ++i) {
    const float g = Grad<kMaximize, kWeightDecay>(grad, p, i, wd);
    const float b = kFirstStep ? g : buf[i] * momentum + one_minus_dampening * g;
    buf[i] = b;
    const float d = kNesterov ? g + momentum * b : b;
    p[i] = p[i] + neg_lr * d;
  }
}

class Sgd final : public Optimizer {
 public:
  Sgd(const OptimizerConfig& config, size_t size) : Optimizer(config, size) {
    if (config.momentum != 0.0) buf_ = AddSlot("momentum_buffer", 0.0f);
  }

  void Update(int64_t step, float* params, const float* grad, size_t begin, size_t end) override {
    assert(step >= 1 && begin <= end && end <= size());
    const OptimizerConfig& c = config();
    // PyTorch passes these Python floats to tensor ops, which cast them to fp32.
    const float wd = static_cast<float>(c.weight_decay);
    const float neg_lr = static_cast<float>(-c.lr);
    const float momentum = static_cast<float>(c.momentum);
    const float one_minus_dampening = static_cast<float>(1.0 - c.dampening);
    float* const buf = buf_;
    DispatchBool(c.maximize, [&](auto maximize) {
      DispatchBool(c.weight_decay != 0.0, [&](auto weight_decay) {
        constexpr bool kMax = decltype(maximize)::value;
        constexpr bool kWd = decltype(weight_decay)::value;
        if (buf == nullptr) {
          SgdPlain<kMax, kWd>(params, grad, begin, end, wd, neg_lr);
          return;
        }
        DispatchBool(step == 1, [&](auto first) {
          DispatchBool(c.nesterov, [&](auto nesterov) {
            SgdMomentum<kMax, kWd, decltype(first)::value, decltype(nesterov)::value>(
                params, grad, buf, begin, end, wd, neg_lr, momentum, one_minus_dampening);
          });
        });
      });
    });
  }

 private:
  float* buf_ = nullptr;  // "momentum_buffer", or null when momentum == 0.
};

}  // namespace

std::unique_ptr<Optimizer> NewSgd(const OptimizerConfig& config, size_t size) {
  return std::make_unique<Sgd>(config, size);
}

}  // namespace optim_internal
}  // namespace shardopt
