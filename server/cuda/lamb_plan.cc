#include "server/cuda/lamb_plan.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "server/optim/lamb_rules.h"

namespace shardopt {
namespace gpu {

static_assert(kLambBlockElements == kTrustBlockElements,
              "the kernels' blocks are the CPU kernel's norm blocks");

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
  // Many blocks are split over threads, each adding its share into sums of
  // its own, merged exactly after: the same bits as one thread.
  const size_t workers =
      std::min<size_t>({kMaxPartialThreads, std::max(1u, std::thread::hardware_concurrency()),
                        std::max<size_t>(1, blocks_.size() / kBlocksPerPartialThread)});
  if (workers == 1) {
    AddBlocks(0, blocks_.size(), weight_squares, update_squares, &partials);
    return partials;
  }
  std::vector<std::vector<TrustPartial>> shares(workers, std::vector<TrustPartial>(pieces_.size()));
  std::vector<std::thread> threads;
  const size_t per_worker = (blocks_.size() + workers - 1) / workers;
  for (size_t w = 0; w < workers; ++w) {
    const size_t first = std::min(blocks_.size(), w * per_worker);
    const size_t last = std::min(blocks_.size(), first + per_worker);
    threads.emplace_back([this, first, last, weight_squares, update_squares, &shares, w] {
      AddBlocks(first, last, weight_squares, update_squares, &shares[w]);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::vector<TrustPartial>& share : shares) {
    for (size_t p = 0; p < pieces_.size(); ++p) {
      partials[p].weight_squares.Add(share[p].weight_squares);
      partials[p].update_squares.Add(share[p].update_squares);
    }
  }
  return partials;
}

void LambPlan::AddBlocks(size_t first, size_t last, const double* weight_squares,
                         const double* update_squares, std::vector<TrustPartial>* into) const {
  // Each piece's blocks are consecutive: added as one span (exactly, in
  // bins, common/exact_sum.h). A negative sum cannot come from squares; a
  // NaN or inf makes the partial NaN or inf, as one Add at a time would.
  while (first < last) {
    size_t end = first;
    while (end < last && blocks_[end].piece == blocks_[first].piece) ++end;
    TrustPartial& sums = (*into)[blocks_[first].piece];
    sums.weight_squares.AddParts(absl::MakeConstSpan(weight_squares + first, end - first));
    sums.update_squares.AddParts(absl::MakeConstSpan(update_squares + first, end - first));
    first = end;
  }
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
