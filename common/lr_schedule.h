// LrSchedule: the learning rate of every step, computed the same way on every
// shard (and by the reference in tests) from the base lr of the optimizer.
//
// Step t >= 1 is PyTorch's optimizer step; its iteration is i = t - 1. The
// shapes are those of DeepSpeed's WarmupLR / WarmupDecayLR (linear or log
// warmup from warmup_start_lr to the base lr, then linear decay to zero), but
// the step alignment is our own: step 1 runs at i = 0, and W < 2 is taken as
// given (DeepSpeed clamps it to 2). Steps are absolute: a schedule installed
// mid-run continues from its position at that step. With
// W = warmup_steps, N = total_steps, base = the optimizer's lr, lo =
// warmup_start_lr:
//   constant:             base
//   warmup (WarmupLR):     i < W: lo + (base - lo) * g(i), else base, where
//                          g(i) = i / W (linear) or ln(i + 1) / ln(W) (log);
//   warmup_linear_decay    as warmup, then from i = W:
//     (WarmupDecayLR):     lo + (base - lo) * max(0, (N - i) / (N - W));
//   warmup_cosine:         as warmup, then from i = W:
//                          min_lr + (base - min_lr) * (1 + cos(pi * p)) / 2,
//                          p = min(1, (i - W) / (N - W)).
// Computed in double; the kernels then cast it to fp32 as they cast lr.
#ifndef SHARDOPT_COMMON_LR_SCHEDULE_H_
#define SHARDOPT_COMMON_LR_SCHEDULE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace shardopt {

struct LrSchedule {
  enum class Kind { kConstant, kWarmup, kWarmupLinearDecay, kWarmupCosine };
  enum class WarmupType { kLinear, kLog };

  Kind kind = Kind::kConstant;
  WarmupType warmup_type = WarmupType::kLinear;
  int64_t warmup_steps = 0;
  double warmup_start_lr = 0.0;
  int64_t total_steps = 0;  // Decay kinds only.
  double min_lr = 0.0;      // Cosine only.

  // INVALID_ARGUMENT for negative values, a log warmup shorter than 2 steps,
  // or a decay whose total_steps is not past warmup_steps.
  absl::Status Validate() const;

  // The lr of optimizer step `step` (>= 1) for base learning rate `base_lr`.
  double LearningRate(double base_lr, int64_t step) const;

  std::string DebugString() const;

  bool operator==(const LrSchedule& o) const {
    return kind == o.kind && warmup_type == o.warmup_type && warmup_steps == o.warmup_steps &&
           warmup_start_lr == o.warmup_start_lr && total_steps == o.total_steps &&
           min_lr == o.min_lr;
  }
};

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_LR_SCHEDULE_H_
