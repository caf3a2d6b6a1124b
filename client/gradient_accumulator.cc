#include "client/gradient_accumulator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace shardopt {

absl::Status GradientAccumulator::Add(absl::Span<const float> gradient, uint64_t samples) {
  if (gradient.size() != sum_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("micro-batch gradient has ", gradient.size(),
                                                   " elements, expected ", sum_.size()));
  }
  if (samples == 0) return absl::InvalidArgumentError("a micro-batch needs at least 1 sample");
  if (micro_batches_ == 0) {
    std::copy(gradient.begin(), gradient.end(), sum_.begin());
    first_samples_ = samples;
    uniform_ = true;
  } else if (uniform_ && samples == first_samples_) {
    for (size_t i = 0; i < sum_.size(); ++i) sum_[i] += gradient[i];
  } else {
    if (uniform_) {
      // Sizes differ after all: weigh what was summed so far.
      const float first = static_cast<float>(first_samples_);
      for (float& v : sum_) v *= first;
      uniform_ = false;
    }
    const float weight = static_cast<float>(samples);
    for (size_t i = 0; i < sum_.size(); ++i) sum_[i] += weight * gradient[i];
  }
  samples_ += samples;
  ++micro_batches_;
  return absl::OkStatus();
}

absl::Status GradientAccumulator::Mean(absl::Span<float> out) {
  if (micro_batches_ == 0) return absl::FailedPreconditionError("no micro-batch was added");
  if (out.size() != sum_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("output has ", out.size(), " elements, expected ", sum_.size()));
  }
  const float divisor = static_cast<float>(uniform_ ? micro_batches_ : samples_);
  for (size_t i = 0; i < sum_.size(); ++i) out[i] = sum_[i] / divisor;
  samples_ = 0;
  micro_batches_ = 0;
  return absl::OkStatus();
}

}  // namespace shardopt
