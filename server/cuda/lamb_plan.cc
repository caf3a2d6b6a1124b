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
  for (size_t b = 0; b < blocks_.size(); ++b) {
    TrustPartial& into = partials[blocks_[b].piece];
    into.weight_squares.Add(weight_squares[b]);
    into.update_squares.Add(update_squares[b]);
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
