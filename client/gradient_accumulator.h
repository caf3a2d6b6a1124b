// GradientAccumulator: gradient accumulation over micro-batches, so that a
// trainer pushes once per optimizer step.
//
// Add() each micro-batch's gradient (the gradient of that micro-batch's MEAN
// loss) with its number of samples; Mean() returns the sample-weighted mean
// sum_i(n_i * g_i) / sum_i(n_i), which is the gradient of the mean loss over
// all the step's samples. While every micro-batch has the same size, the
// gradients are summed unweighted and Mean() is exactly (g_1 + ... + g_m) / m,
// as PyTorch's `.grad +=` over backward passes followed by a division gives.
// Sums are fp32, in Add() order.
#ifndef SHARDOPT_CLIENT_GRADIENT_ACCUMULATOR_H_
#define SHARDOPT_CLIENT_GRADIENT_ACCUMULATOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace shardopt {

class GradientAccumulator {
 public:
  // For flat gradients of `size` elements.
  explicit GradientAccumulator(size_t size) : sum_(size, 0.0f) {}

  // INVALID_ARGUMENT for a gradient of the wrong size or samples == 0.
  absl::Status Add(absl::Span<const float> micro_batch_gradient, uint64_t samples = 1);

  uint64_t samples() const { return samples_; }
  int micro_batches() const { return micro_batches_; }

  // The weighted mean of what was added since the last Mean(), written to
  // `out`, and starts over. FAILED_PRECONDITION when nothing was added.
  absl::Status Mean(absl::Span<float> out);

 private:
  std::vector<float> sum_;  // Unweighted while `uniform_`, else weighted.
  uint64_t samples_ = 0;
  int micro_batches_ = 0;
  uint64_t first_samples_ = 0;
  bool uniform_ = true;
};

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_GRADIENT_ACCUMULATOR_H_
