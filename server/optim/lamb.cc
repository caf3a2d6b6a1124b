// LAMB (You et al. 2019) as apex's FusedLAMB computes it in adam_w_mode
// (the trust ratio always applied, as with its use_nvlamb), with the trust
// ratio clamped as DeepSpeed's FusedLamb clamps it (its min_coeff,
// max_coeff), per tensor (see LambConfig in the proto). DeepSpeed's own
// update places the bias correction and eps otherwise: the two agree only
// without bias correction.
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g * g
//   u = (m / c1) / (sqrt(v / c2) + eps) + weight_decay * p
//   r = clamp(||p|| / ||u||, min_trust_ratio, max_trust_ratio), 1 if a norm is 0
//   p = p - float(lr * r) * u
// Per element in fp32 with the scalars rounded to fp32. The squared norms
// are sums over blocks of kTrustBlockElements elements counted from the
// tensor's start, each block summed in double (SumOfSquares), the blocks
// added exactly (ExactSum) and rounded once: they depend on nothing but the
// tensor's values, not on how the tensor is split over shards or threads.
// MeasureTrust computes m, v and u without writing them; UpdateWithTrust
// computes them again from the same fp32 values with the same operations
// (the build does not contract to FMA), so both passes agree to the bit and
// no scratch copy of the tensor is needed.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <memory>

#include "common/exact_sum.h"
#include "server/optim/lamb_rules.h"
#include "server/optim/optimizer.h"
#include "server/optim/optimizer_internal.h"

namespace shardopt {
namespace optim_internal {
namespace {

inline float LambDirection(const LambScalars& s, float m, float v, float p) {
  return (m / s.c1) / (std::sqrt(v / s.c2) + s.eps) + s.weight_decay * p;
}

class Lamb final : public WholeTensorOptimizer {
 public:
  Lamb(const OptimizerConfig& config, size_t size) : WholeTensorOptimizer(config, size) {
    exp_avg_ = AddSlot("exp_avg", 0.0f);
    exp_avg_sq_ = AddSlot("exp_avg_sq", 0.0f);
  }

  bool measures_trust() const override { return true; }

  void UpdateTensor(int64_t step, float* params, const float* grad, size_t tensor) override {
    const RangeTensor& t = tensors()[tensor];
    assert(t.whole);  // (A piece's norms are every shard's: UpdateWithTrust.)
    TrustPartial partial;
    MeasureTrust(step, params, grad, 1.0f, tensor, t.offset, t.offset + t.size, &partial);
    const TensorNorms norms{partial.weight_squares.Rounded(), partial.update_squares.Rounded()};
    UpdateWithTrust(step, params, grad, tensor, t.offset, t.offset + t.size, norms);
  }

  void MeasureTrust(int64_t step, const float* params, const float* grad, float multiplier,
                    size_t piece, uint64_t begin, uint64_t end,
                    TrustPartial* partial) const override {
    CheckPart(piece, begin, end);
    const LambScalars s = LambScalarsOf(config(), step);
    DispatchBool(config().maximize, [&](auto maximize) {
      Measure<decltype(maximize)::value>(s, params, grad, multiplier, begin, end, partial);
    });
  }

  void UpdateWithTrust(int64_t step, float* params, const float* grad, size_t piece, uint64_t begin,
                       uint64_t end, const TensorNorms& norms) override {
    CheckPart(piece, begin, end);
    const LambScalars s = LambScalarsOf(config(), step);
    const float step_size = LambStepSize(config(), norms);
    DispatchBool(config().maximize, [&](auto maximize) {
      Apply<decltype(maximize)::value>(s, step_size, params, grad, begin, end);
    });
  }

 private:
  void CheckPart(size_t piece, uint64_t begin, uint64_t end) const {
    assert(piece < tensors().size());
    const RangeTensor& t = tensors()[piece];
    assert(begin >= t.offset && begin <= end && end <= t.offset + t.size);
    assert((begin - t.offset) % kTrustBlockElements == 0);
    (void)t;
    (void)begin;
    (void)end;
  }

  // The gradient as UpdateWithTrust will read it: multiplied in place by the
  // backend (g * multiplier in fp32), then negated when maximizing.
  template <bool kMaximize>
  void Measure(const LambScalars& s, const float* __restrict params, const float* __restrict grad,
               float multiplier, size_t begin, size_t end, TrustPartial* partial) const {
    const float* __restrict m = exp_avg_;
    const float* __restrict v = exp_avg_sq_;
    float u[kTrustBlockElements];
    for (size_t block = begin; block < end; block += kTrustBlockElements) {
      const size_t n = std::min<size_t>(kTrustBlockElements, end - block);
      for (size_t k = 0; k < n; ++k) {
        const size_t i = block + k;
        const float scaled = grad[i] * multiplier;
        const float g = kMaximize ? -scaled : scaled;
        const float m_next = s.beta1 * m[i] + s.one_minus_beta1 * g;
        const float v_next = s.beta2 * v[i] + s.one_minus_beta2 * g * g;
        u[k] = LambDirection(s, m_next, v_next, params[i]);
      }
      partial->weight_squares.Add(SumOfSquares(params + block, n));
      partial->update_squares.Add(SumOfSquares(u, n));
    }
  }

  template <bool kMaximize>
  void Apply(const LambScalars& s, float step_size, float* __restrict params,
             const float* __restrict grad, size_t begin, size_t end) {
    float* __restrict m = exp_avg_;
    float* __restrict v = exp_avg_sq_;
    for (size_t i = begin; i < end; ++i) {
      const float g = kMaximize ? -grad[i] : grad[i];
      m[i] = s.beta1 * m[i] + s.one_minus_beta1 * g;
      v[i] = s.beta2 * v[i] + s.one_minus_beta2 * g * g;
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
