#include "common/step_protocol.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace shardopt {

double ClipCoefficient(double max_grad_norm, double grad_norm) {
  if (max_grad_norm <= 0) return 1.0;
  return std::min(1.0, max_grad_norm / (grad_norm + 1e-6));
}

StepDecision DecideStep(absl::Span<const StepStats> stats_in_shard_order, double max_grad_norm) {
  StepDecision decision;
  double total = 0;
  for (const StepStats& s : stats_in_shard_order) {
    total += s.sum_of_squares;
    decision.skip = decision.skip || s.found_inf;
  }
  decision.skip = decision.skip || !std::isfinite(total);
  if (!decision.skip) {
    decision.grad_norm = std::sqrt(total);
    decision.clip_coef = ClipCoefficient(max_grad_norm, decision.grad_norm);
  }
  return decision;
}

absl::Status CheckDecision(const StepDecision& decision, double max_grad_norm) {
  if (decision.skip) return absl::OkStatus();
  const double expected = ClipCoefficient(max_grad_norm, decision.grad_norm);
  if (!std::isfinite(decision.grad_norm) || decision.grad_norm < 0 ||
      static_cast<float>(decision.clip_coef) != static_cast<float>(expected) ||
      !(static_cast<float>(decision.clip_coef) >= std::numeric_limits<float>::min())) {
    return absl::InvalidArgumentError(
        absl::StrCat("clip coefficient ", decision.clip_coef, " does not follow from grad norm ",
                     decision.grad_norm, " and max_grad_norm ", max_grad_norm, " (expected ",
                     expected, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckLossScale(double loss_scale) {
  int exponent = 0;
  if (!(loss_scale > 0) || !std::isfinite(loss_scale) || std::frexp(loss_scale, &exponent) != 0.5 ||
      exponent < -100 || exponent > 101) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss scale ", loss_scale, " is not a power of two in [2^-101, 2^100]"));
  }
  return absl::OkStatus();
}

float GradientMultiplier(const StepDecision& decision, double loss_scale) {
  return static_cast<float>(decision.clip_coef) * static_cast<float>(1.0 / loss_scale);
}

bool StepsNeedDecisions(double max_grad_norm, bool loss_scaling) {
  return max_grad_norm > 0 || loss_scaling;
}

StepPosition PositionOfStep(int64_t version, int64_t step) {
  if (step <= version) return StepPosition::kApplied;
  if (step == version + 1) return StepPosition::kNext;
  return StepPosition::kAhead;
}

}  // namespace shardopt
