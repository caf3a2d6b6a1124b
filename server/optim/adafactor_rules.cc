#include "server/optim/adafactor_rules.h"

#include <algorithm>
#include <cassert>
#include <cfloat>
#include <cmath>

namespace shardopt {

AdafactorScalars AdafactorScalarsOf(const OptimizerConfig& c, int64_t step) {
  assert(step >= 1);
  // torch's step as a float (exact up to 2^24, as server/optim's TorchStep).
  constexpr int64_t kFloatStepLimit = int64_t{1} << 24;
  const double step_float = static_cast<double>(step < kFloatStepLimit ? step : kFloatStepLimit);
  AdafactorScalars s;
  s.weight = static_cast<float>(std::pow(step_float, c.beta2_decay));
  s.rho = std::min(c.lr, 1.0 / std::sqrt(step_float));
  const double eps1 = c.eps1 < 0 ? static_cast<double>(FLT_EPSILON) : c.eps1;
  s.eps1 = static_cast<float>(eps1);
  s.variance_floor = static_cast<float>(eps1 * eps1);
  s.decays = c.weight_decay != 0;
  s.decay = static_cast<float>(1.0 - c.lr * c.weight_decay);
  s.sign = c.maximize ? -1.0f : 1.0f;
  return s;
}

double AdafactorFp32Norm(double sum_of_squares) {
  return static_cast<float>(std::sqrt(sum_of_squares));
}

double AdafactorAlpha(const OptimizerConfig& c, const AdafactorScalars& s, double param_squares,
                      uint64_t n) {
  return std::max(c.eps2, AdafactorFp32Norm(param_squares) / std::sqrt(static_cast<double>(n))) *
         s.rho;
}

float AdafactorStepScale(const OptimizerConfig& c, double alpha, double update_squares,
                         uint64_t n) {
  const double denominator =
      std::max(1.0, AdafactorFp32Norm(update_squares) /
                        (std::sqrt(static_cast<double>(n)) * c.clip_threshold));
  return static_cast<float>(-alpha / denominator);
}

}  // namespace shardopt
