// LAMB's per-step scalars and its trust-ratio rule (server/optim/lamb.cc has
// the formulas): one definition for the CPU kernel and the GPU backend
// (server/cuda/lamb_plan.h), so that both round the same doubles to the
// same floats.
#ifndef SHARDOPT_SERVER_OPTIM_LAMB_RULES_H_
#define SHARDOPT_SERVER_OPTIM_LAMB_RULES_H_

#include <cstdint>

#include "common/optimizer_config.h"
#include "common/step_protocol.h"

namespace shardopt {

// The fp32 scalars of step `step` (>= 1): betas, 1 - betas, the bias
// corrections c1 and c2 (1 without bias_correction), eps and weight_decay,
// each computed in double and rounded once.
struct LambScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, c1, c2, eps, weight_decay;
};
LambScalars LambScalarsOf(const OptimizerConfig& config, int64_t step);

// float(lr * r): r = clamp(||p|| / ||u||, min_trust_ratio, max_trust_ratio)
// (no upper clamp when max_trust_ratio is 0), 1 when either norm is 0.
float LambStepSize(const OptimizerConfig& config, const TensorNorms& norms);

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_OPTIM_LAMB_RULES_H_
