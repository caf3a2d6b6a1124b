#include "server/cuda/lamb_plan.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/optim/lamb_rules.h"

namespace shardopt {
namespace gpu {

static_assert(kLambBlockElements == kTrustBlockElements,
              "the kernels' blocks are the CPU kernel's norm blocks");

absl::StatusOr<LambPlan> LambPlan::Create(std::vector<LambPiece> pieces) {
  for (size_t i = 0; i < pieces.size(); ++i) {
    const LambPiece& p = pieces[i];
    if (!p.whole && p.start % kTrustBlockElements != 0) {
      return absl::InvalidArgumentError(absl::StrCat("lamb cannot update a piece of tensor ",
                                                     p.tensor_index, " starting at its element ",
                                                     p.start));
    }
    if (i > 0 && p.tensor_index <= pieces[i - 1].tensor_index) {
      return absl::InvalidArgumentError(
          absl::StrCat("lamb's tensor pieces must name distinct layout tensors in order: piece ", i,
                       " names tensor ", p.tensor_index, " after ", pieces[i - 1].tensor_index));
    }
  }
  return LambPlan(std::move(pieces));
}

LambPlan::LambPlan(std::vector<LambPiece> pieces) : pieces_(std::move(pieces)) {
  for (uint32_t p = 0; p < pieces_.size(); ++p) {
    const LambPiece& piece = pieces_[p];
    if (!piece.whole) needs_every_shards_norms_ = true;
    for (uint64_t done = 0; done < piece.size; done += kLambBlockElements) {
      const uint64_t count = std::min<uint64_t>(kLambBlockElements, piece.size - done);
      blocks_.push_back(TrustBlock{piece.offset + done, static_cast<uint32_t>(count), p});
    }
  }
}

std::vector<TrustPartial> LambPlan::Partials(const double* weight_squares,
                                             const double* update_squares) const {
  std::vector<TrustPartial> partials(pieces_.size());
  for (size_t p = 0; p < pieces_.size(); ++p) {
    partials[p].tensor_index = pieces_[p].tensor_index;
    partials[p].whole_tensor = pieces_[p].whole;
  }
  // Each piece's blocks are consecutive: added as one span (exactly, in
  // bins, common/exact_sum.h). A negative sum cannot come from squares; a
  // NaN or inf makes the partial NaN or inf, as one Add at a time would.
  for (size_t first = 0; first < blocks_.size();) {
    size_t last = first;
    while (last < blocks_.size() && blocks_[last].piece == blocks_[first].piece) ++last;
    TrustPartial& into = partials[blocks_[first].piece];
    into.weight_squares.AddParts(absl::MakeConstSpan(weight_squares + first, last - first));
    into.update_squares.AddParts(absl::MakeConstSpan(update_squares + first, last - first));
    first = last;
  }
  return partials;
}

absl::StatusOr<std::vector<float>> LambPlan::StepSizes(const OptimizerConfig& config,
                                                       absl::Span<const TensorNorms> norms) const {
  std::vector<float> sizes;
  sizes.reserve(pieces_.size());
  for (const LambPiece& piece : pieces_) {
    if (piece.tensor_index >= norms.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("no norms for tensor ", piece.tensor_index, " (", norms.size(), " given)"));
    }
    sizes.push_back(LambStepSize(config, norms[piece.tensor_index]));
  }
  return sizes;
}

std::vector<TensorNorms> LambPlan::OwnNorms(const std::vector<TrustPartial>& partials) {
  std::vector<TensorNorms> norms;
  for (const TrustPartial& p : partials) {
    if (norms.size() <= p.tensor_index) norms.resize(p.tensor_index + 1);
    norms[p.tensor_index] = {p.weight_squares.Rounded(), p.update_squares.Rounded()};
  }
  return norms;
}

LambKernelScalars LambPlan::Scalars(const OptimizerConfig& config, int64_t step, float multiplier) {
  const LambScalars s = LambScalarsOf(config, step);
  LambKernelScalars k;
  k.beta1 = s.beta1;
  k.one_minus_beta1 = s.one_minus_beta1;
  k.beta2 = s.beta2;
  k.one_minus_beta2 = s.one_minus_beta2;
  k.c1 = s.c1;
  k.c2 = s.c2;
  k.eps = s.eps;
  k.weight_decay = s.weight_decay;
  k.multiplier = multiplier;
  k.maximize = config.maximize ? 1 : 0;
  return k;
}

}  // namespace gpu
}  // namespace shardopt
