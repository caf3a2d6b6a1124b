#include "client/loss_scaler.h"

#include <algorithm>

namespace shardopt {

absl::Status LossScalerOptions::Validate() const {
  if (!(initial_scale > 0) || !(min_scale > 0) || !(growth_factor > 1) ||
      !(backoff_factor > 0 && backoff_factor < 1) || growth_interval < 1 || hysteresis < 1) {
    return absl::InvalidArgumentError(
        "loss scaler: scales > 0, growth_factor > 1, backoff_factor in (0, 1), "
        "growth_interval and hysteresis >= 1");
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
    scale_ *= options_.growth_factor;
  }
}

}  // namespace shardopt
