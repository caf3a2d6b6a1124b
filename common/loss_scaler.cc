#include "common/loss_scaler.h"

#include <algorithm>
#include <cmath>

namespace shardopt {

namespace {

bool PowerOfTwo(double x) {
  int exponent = 0;
  return x > 0 && std::isfinite(x) && std::frexp(x, &exponent) == 0.5;
}

}  // namespace

absl::Status LossScalerOptions::Validate() const {
  // Powers of two keep every scale a power of two, which keeps unscaling on
  // the servers exact (and what the shards check).
  if (!PowerOfTwo(initial_scale) || !PowerOfTwo(min_scale) || !PowerOfTwo(growth_factor) ||
      !PowerOfTwo(backoff_factor) || !(growth_factor > 1) || !(backoff_factor < 1) ||
      !PowerOfTwo(max_scale) || min_scale > initial_scale || initial_scale > max_scale ||
      max_scale > 1267650600228229401496703205376.0 || growth_interval < 1 || hysteresis < 1) {
    return absl::InvalidArgumentError(
        "loss scaler: initial_scale, min_scale, growth_factor and backoff_factor must be "
        "powers of two (as max_scale, at most 2^100) with min_scale <= initial_scale <= "
        "max_scale, growth_factor > 1 and "
        "backoff_factor < 1; growth_interval and hysteresis >= 1");
  }
  return absl::OkStatus();
}

LossScaler::LossScaler(const LossScalerOptions& options)
    : options_(options), scale_(options.initial_scale), hysteresis_tracker_(options.hysteresis) {}

void LossScaler::Update(bool found_inf) {
  if (found_inf) {
    growth_tracker_ = 0;
    --hysteresis_tracker_;
    if (hysteresis_tracker_ <= 0) {
      scale_ = std::max(scale_ * options_.backoff_factor, options_.min_scale);
    }
    return;
  }
  ++growth_tracker_;
  if (growth_tracker_ == options_.growth_interval) {
    growth_tracker_ = 0;
    hysteresis_tracker_ = options_.hysteresis;
    scale_ = std::min(scale_ * options_.growth_factor, options_.max_scale);
  }
}

}  // namespace shardopt
