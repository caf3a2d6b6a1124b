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
  if (decision.skip) {
    if (decision.tensor_norms.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError("a skipped step carries no tensor norms");
  }
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

bool StepsNeedTrustNorms(OptimizerKind kind, const ModelLayout& layout) {
  return kind == OptimizerKind::kLamb && layout.partition() == Partition::kFlat &&
         layout.shard_count() > 1;
}

bool ModelStepsNeedDecisions(Consistency consistency, double max_grad_norm, bool loss_scaling,
                             OptimizerKind kind, const ModelLayout& layout) {
  return ShardsDecideSteps(consistency, max_grad_norm, loss_scaling) ||
         (!IsAsynchronous(consistency) && StepsNeedTrustNorms(kind, layout));
}

absl::Status CheckTrustNormsFit(OptimizerKind kind, const ModelLayout& layout,
                                Consistency consistency) {
  if (!StepsNeedTrustNorms(kind, layout)) return absl::OkStatus();
  if (IsAsynchronous(consistency)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lamb on the flat partition over ", layout.shard_count(),
                     " shards gathers every tensor's norms from all shards in each step: it needs "
                     "consistency sync, not ",
                     ConsistencyName(consistency), " (or the partition whole_tensors)"));
  }
  if (layout.alignment() % kTrustBlockElements != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lamb on the flat partition needs an alignment that is a multiple of ", kTrustBlockElements,
        " (its norm blocks must not straddle shards), not ", layout.alignment()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TensorNorms>> CombineTrustPartials(absl::Span<const StepStats> stats,
                                                              const ModelLayout& layout) {
  if (stats.size() != layout.shard_count()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trust partials of ", stats.size(), " shards; the layout has ", layout.shard_count()));
  }
  const size_t tensor_count = layout.tensors().size();
  std::vector<ExactSum> weights(tensor_count), updates(tensor_count);
  for (uint32_t shard = 0; shard < stats.size(); ++shard) {
    // Exactly the shard's pieces, in order: nothing counted twice or missed.
    const std::vector<TensorPiece> pieces = layout.PiecesIn(layout.ShardRange(shard));
    const std::vector<TrustPartial>& partials = stats[shard].trust_partials;
    bool fits = partials.size() == pieces.size();
    for (size_t i = 0; fits && i < pieces.size(); ++i) {
      const bool whole = pieces[i].size == layout.tensors()[pieces[i].tensor_index].size;
      fits =
          partials[i].tensor_index == pieces[i].tensor_index && partials[i].whole_tensor == whole;
    }
    if (!fits) {
      return absl::InvalidArgumentError(absl::StrCat("shard ", shard, " sent ", partials.size(),
                                                     " trust partials that are not those of the ",
                                                     pieces.size(), " tensor pieces of its range"));
    }
    for (const TrustPartial& p : partials) {
      weights[p.tensor_index].Add(p.weight_squares);
      updates[p.tensor_index].Add(p.update_squares);
    }
  }
  // (A tensor of no elements lies on no shard: its norms are 0.)
  std::vector<TensorNorms> norms(tensor_count);
  for (size_t t = 0; t < tensor_count; ++t) {
    norms[t] = TensorNorms{weights[t].Rounded(), updates[t].Rounded()};
  }
  return norms;
}

namespace {

// Rounded exact sums, where NaN (a NaN was added) is the largest value.
bool NotBelow(double total, double part) {
  if (std::isnan(total)) return true;
  return !std::isnan(part) && total >= part;
}

}  // namespace

absl::Status CheckTensorNorms(absl::Span<const TensorNorms> norms, size_t tensor_count,
                              absl::Span<const TrustPartial> own) {
  if (norms.size() != tensor_count) {
    return absl::InvalidArgumentError(absl::StrCat("the decision has tensor norms for ",
                                                   norms.size(), " tensors; the model has ",
                                                   tensor_count));
  }
  for (size_t t = 0; t < norms.size(); ++t) {
    for (double v : {norms[t].weight_squares, norms[t].update_squares}) {
      // (+inf and NaN are what a diverged tensor's exact sums round to.)
      if (v < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor ", t, "'s squared norm ", v, " is negative"));
      }
    }
  }
  for (const TrustPartial& p : own) {
    if (p.tensor_index >= norms.size()) {
      return absl::InternalError(absl::StrCat("trust partial of tensor ", p.tensor_index));
    }
    const TensorNorms& total = norms[p.tensor_index];
    const double weight = p.weight_squares.Rounded(), update = p.update_squares.Rounded();
    // (Rounding is monotonic: a sum of non-negative parts cannot round below one of them.)
    const bool fits = p.whole_tensor ? TensorNorms::SameSquares(total.weight_squares, weight) &&
                                           TensorNorms::SameSquares(total.update_squares, update)
                                     : NotBelow(total.weight_squares, weight) &&
                                           NotBelow(total.update_squares, update);
    if (!fits) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", p.tensor_index, "'s norms in the decision (", total.weight_squares, ", ",
          total.update_squares, ") contradict this shard's own part of them (", weight, ", ",
          update, p.whole_tensor ? ", the whole tensor" : "", ")"));
    }
  }
  return absl::OkStatus();
}

StepPosition PositionOfStep(int64_t version, int64_t step) {
  if (step <= version) return StepPosition::kApplied;
  if (step == version + 1) return StepPosition::kNext;
  return StepPosition::kAhead;
}

}  // namespace shardopt
