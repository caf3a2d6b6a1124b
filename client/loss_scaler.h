// LossScaler: dynamic loss scaling as Megatron-LM's DynamicGradScaler does it.
//
// The trainer multiplies its loss (or its gradients) by scale() before
// pushing; after each step, Update(found_inf) with what the shards decided:
// an overflow spends one unit of hysteresis and, when none is left, backs
// the scale off (never below min_scale); `growth_interval` steps in a row
// without overflow grow it and refill the hysteresis. Deterministic: every
// trainer fed the same decisions holds the same scale.
#ifndef SHARDOPT_CLIENT_LOSS_SCALER_H_
#define SHARDOPT_CLIENT_LOSS_SCALER_H_

#include <cstdint>

#include "absl/status/status.h"

namespace shardopt {

struct LossScalerOptions {
  double initial_scale = 4294967296.0;  // 2^32, Megatron's default.
  double min_scale = 1.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 1000;
  int64_t hysteresis = 2;

  // INVALID_ARGUMENT unless scales are positive, growth > 1, backoff in
  // (0, 1), and the interval and hysteresis at least 1.
  absl::Status Validate() const;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerOptions& options = {});

  double scale() const { return scale_; }
  void Update(bool found_inf);

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t hysteresis_tracker_;
};

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_LOSS_SCALER_H_
