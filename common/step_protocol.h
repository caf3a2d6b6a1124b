// The rules of a synchronous step that trainers and shards share, in one
// place: what a shard reports about a step, the decision every trainer takes
// from those reports, what a valid decision and a valid loss scale are, and
// which steps a shard at some version takes. The client computes with these
// functions and the server checks with the same ones; neither re-derives them.
//
// A step k (k >= 1) turns version k - 1 into version k. With gradient
// control (clipping or loss scaling) every shard first reports its StepStats
// for k; every trainer computes the same StepDecision from them (DecideStep,
// in shard order, so every trainer gets the same bits) and sends it; each
// shard checks it (CheckDecision) and applies the first one it gets.
#ifndef SHARDOPT_COMMON_STEP_PROTOCOL_H_
#define SHARDOPT_COMMON_STEP_PROTOCOL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace shardopt {

// A shard's part of a step's global decision, once all trainers pushed.
struct StepStats {
  int64_t step = 0;
  double sum_of_squares = 0;  // Of the unscaled reduced gradient, this range.
  bool found_inf = false;     // Some trainer's gradient here had inf/NaN.
  double loss_scale = 1;
};

// What every shard does with a step that needs a decision.
struct StepDecision {
  bool skip = false;       // Leave parameters and optimizer state as they are.
  double clip_coef = 1.0;  // Gradient multiplier (after unscaling), <= 1.
  double grad_norm = 0;    // The global norm it came from (for the record).
  // Equal when they apply the same: skip alike, or the same fp32 multiplier.
  bool operator==(const StepDecision& o) const {
    return skip == o.skip &&
           (skip || static_cast<float>(clip_coef) == static_cast<float>(o.clip_coef));
  }
  bool operator!=(const StepDecision& o) const { return !(*this == o); }
};

// Whether a model's steps wait for a decision: with clipping (max_grad_norm
// > 0) or loss scaling. Without either, a shard applies a step as soon as
// every trainer's push of it is in.
bool StepsNeedDecisions(double max_grad_norm, bool loss_scaling);

// torch.nn.utils.clip_grad_norm_'s coefficient: max_norm / (norm + 1e-6)
// when that is below 1, else 1 (also without clipping: max_grad_norm 0).
double ClipCoefficient(double max_grad_norm, double grad_norm);

// The decision from every shard's statistics of one step, in shard order:
// skip when any shard saw inf/NaN or the summed squares overflow, else the
// global norm and its clip coefficient.
StepDecision DecideStep(absl::Span<const StepStats> stats_in_shard_order, double max_grad_norm);

// OK for a decision DecideStep can give under `max_grad_norm`: a skip, or a
// finite norm with the coefficient it implies (at fp32) that leaves a
// non-zero multiplier. INVALID_ARGUMENT otherwise: a client cannot make one
// shard clip differently from the others.
absl::Status CheckDecision(const StepDecision& decision, double max_grad_norm);

// Loss scales are powers of two in [2^-101, 2^100]: unscaling g * 2^-k is
// then exact, so clipping after it is one rounding, as g / scale * coef
// would be. INVALID_ARGUMENT otherwise.
absl::Status CheckLossScale(double loss_scale);

// The fp32 multiplier that unscales and clips in one multiply (both factors
// exact powers of two or a single rounding).
float GradientMultiplier(const StepDecision& decision, double loss_scale);

// Where a push of `step` stands on a shard at `version`: applied already, the
// step the shard collects, or ahead of it (the shard lacks earlier steps:
// it restarted from a checkpoint, and the trainers must re-push them).
enum class StepPosition { kApplied, kNext, kAhead };
StepPosition PositionOfStep(int64_t version, int64_t step);

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_STEP_PROTOCOL_H_
