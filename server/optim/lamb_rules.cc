#include "server/optim/lamb_rules.h"

#include <algorithm>
#include <cassert>
#include <cmath>

namespace shardopt {

LambScalars LambScalarsOf(const OptimizerConfig& c, int64_t step) {
  assert(step >= 1);
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
  return s;
}

float LambStepSize(const OptimizerConfig& c, const TensorNorms& norms) {
  double ratio = 1.0;
  if (norms.weight_squares > 0 && norms.update_squares > 0) {
    ratio = std::sqrt(norms.weight_squares) / std::sqrt(norms.update_squares);
    ratio = std::max(ratio, c.min_trust_ratio);
    if (c.max_trust_ratio > 0) ratio = std::min(ratio, c.max_trust_ratio);
  }
  return static_cast<float>(c.lr * ratio);
}

}  // namespace shardopt
