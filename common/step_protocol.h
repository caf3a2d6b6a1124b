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
// LAMB on a flat partition adds a second half (StepsNeedTrustNorms): each
// shard's trust partials under the clip decision, combined by every trainer
// into the tensor norms the shards then update with.
#ifndef SHARDOPT_COMMON_STEP_PROTOCOL_H_
#define SHARDOPT_COMMON_STEP_PROTOCOL_H_

#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/consistency.h"
#include "common/exact_sum.h"
#include "common/layout.h"
#include "common/optimizer_config.h"

namespace shardopt {

// LAMB on the flat partition (StepsNeedTrustNorms): one shard's part of a
// tensor's squared norms for a step, over the piece of it the shard holds:
// sums of p^2 and u^2 (u: LAMB's update direction under the step's clip
// decision), each block of kTrustBlockElements elements (counted from the
// tensor's start) summed in double, the blocks added exactly.
struct TrustPartial {
  uint32_t tensor_index = 0;  // In the layout's declaration order.
  bool whole_tensor = false;  // The shard holds all of the tensor.
  ExactSum weight_squares;
  ExactSum update_squares;
};
inline constexpr uint32_t kTrustBlockElements = 64;

// A tensor's squared norms over every shard: the ExactSums of all its
// partials, rounded.
struct TensorNorms {
  double weight_squares = 0;
  double update_squares = 0;
  // (NaN equals NaN here: the same diverged sums.)
  bool operator==(const TensorNorms& o) const {
    return SameSquares(weight_squares, o.weight_squares) &&
           SameSquares(update_squares, o.update_squares);
  }
  static bool SameSquares(double a, double b) { return std::isnan(a) ? std::isnan(b) : a == b; }
  bool operator!=(const TensorNorms& o) const { return !(*this == o); }
};

// A shard's part of a step's global decision, once all trainers pushed.
struct StepStats {
  int64_t step = 0;
  double sum_of_squares = 0;  // Of the unscaled reduced gradient, this range.
  bool found_inf = false;     // Some trainer's gradient here had inf/NaN.
  double loss_scale = 1;
  // With trust norms, once the step's clip decision is taken: one per tensor
  // piece of the range, in layout order.
  std::vector<TrustPartial> trust_partials;
};

// What every shard does with a step that needs a decision.
struct StepDecision {
  bool skip = false;       // Leave parameters and optimizer state as they are.
  double clip_coef = 1.0;  // Gradient multiplier (after unscaling), <= 1.
  double grad_norm = 0;    // The global norm it came from (for the record).
  // With trust norms and no skip: every tensor's norms, in layout order
  // (CombineTrustPartials). Empty in the first half of such a decision.
  std::vector<TensorNorms> tensor_norms;
  // Equal when they apply the same: skip alike, or the same fp32 multiplier
  // and the same tensor norms.
  bool operator==(const StepDecision& o) const {
    return SameClip(o) && (skip || tensor_norms == o.tensor_norms);
  }
  bool operator!=(const StepDecision& o) const { return !(*this == o); }
  // The same skip and multiplier, whatever the tensor norms.
  bool SameClip(const StepDecision& o) const {
    return skip == o.skip &&
           (skip || static_cast<float>(clip_coef) == static_cast<float>(o.clip_coef));
  }
};

// Whether a model's steps wait for a decision: with clipping (max_grad_norm
// > 0) or loss scaling. Without either, a shard applies a step as soon as
// every trainer's push of it is in.
bool StepsNeedDecisions(double max_grad_norm, bool loss_scaling);

// Whether a model's steps need every tensor's norms gathered from all shards
// before the update: LAMB's trust ratio on the flat partition with more than
// one shard (a tensor may straddle shards). Those steps need decisions too
// (synchronous consistency only), in two halves: the clip decision, then,
// from every shard's trust partials under it, the tensor norms.
bool StepsNeedTrustNorms(OptimizerKind kind, const ModelLayout& layout);

// Whether a model may take LAMB's steps on its partition: OK unless its
// steps need trust norms (StepsNeedTrustNorms) and it is not synchronous
// (asynchronous updates have no step-wide decision to carry the norms) or
// its alignment is not a multiple of kTrustBlockElements (norm blocks must
// not straddle shards); INVALID_ARGUMENT saying what to change then. Every
// other optimizer's fit is CheckOptimizerFitsPartition's.
absl::Status CheckTrustNormsFit(OptimizerKind kind, const ModelLayout& layout,
                                Consistency consistency);

// Whether the shards decide a model's steps: synchronous models with
// gradient control (ShardsDecideSteps) or whose steps need trust norms.
bool ModelStepsNeedDecisions(Consistency consistency, double max_grad_norm, bool loss_scaling,
                             OptimizerKind kind, const ModelLayout& layout);

// The tensor norms from every shard's trust partials (StepStats of the
// second half of a decision, in shard order): INVALID_ARGUMENT unless each
// shard's partials are exactly the tensor pieces of its range in `layout`
// (tensor and whole-ness, in order). Tensors of no elements get norms 0.
absl::StatusOr<std::vector<TensorNorms>> CombineTrustPartials(absl::Span<const StepStats> stats,
                                                              const ModelLayout& layout);

// A shard's check of the norms a decision brings against its own partials:
// INVALID_ARGUMENT unless there is one per tensor, each finite and
// non-negative, no smaller than the shard's own part, and equal to it for a
// tensor the shard holds whole. A client cannot make a shard scale its
// update by norms its own values contradict.
absl::Status CheckTensorNorms(absl::Span<const TensorNorms> norms, size_t tensor_count,
                              absl::Span<const TrustPartial> own);

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
