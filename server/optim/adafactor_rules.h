// Adafactor's per-step and per-tensor scalars (server/optim/adafactor.cc
// has the formulas): one definition for the CPU kernel and the GPU backend
// (server/cuda/adafactor_step.h), so both round the same doubles to the
// same floats.
#ifndef SHARDOPT_SERVER_OPTIM_ADAFACTOR_RULES_H_
#define SHARDOPT_SERVER_OPTIM_ADAFACTOR_RULES_H_

#include <cstddef>
#include <cstdint>

#include "common/optimizer_config.h"

namespace shardopt {

// The update's pieces: each row (each tensor of fewer than two dimensions)
// cut into this many elements; its sums of squares (the parameters', a
// row's gradient's, the update's) are summed piece by piece, in order (the
// GPU's kernels use the same length).
inline constexpr uint64_t kAdafactorPieceElements = 2048;
// A column's squares are summed per block of this many rows, in order, and
// the blocks' sums added in order.
inline constexpr uint64_t kAdafactorColumnBlockRows = 64;

struct AdafactorScalars {
  float weight;          // step^beta2_decay: the factors' lerp weight
  double rho;            // min(lr, 1 / sqrt(step))
  float eps1;            // eps1, FLT_EPSILON when the config says "None"
  float variance_floor;  // eps1^2
  bool decays;           // weight_decay != 0
  float decay;           // 1 - lr * weight_decay
  float sign;            // -1 when maximizing
};
AdafactorScalars AdafactorScalarsOf(const OptimizerConfig& config, int64_t step);

// A norm as torch returns it: fp32, from a sum of squares in double.
double AdafactorFp32Norm(double sum_of_squares);

// alpha = max(eps2, RMS(p)) * rho, from the parameters' squares before decay.
double AdafactorAlpha(const OptimizerConfig& config, const AdafactorScalars& s,
                      double param_squares, uint64_t n);

// float(-alpha / max(1, RMS(U) / clip_threshold)), from U's squares.
float AdafactorStepScale(const OptimizerConfig& config, double alpha, double update_squares,
                         uint64_t n);

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_OPTIM_ADAFACTOR_RULES_H_
