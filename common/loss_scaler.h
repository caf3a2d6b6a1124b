// LossScaler: dynamic loss scaling as Megatron-LM's DynamicGradScaler does it.
//
// The trainer multiplies its loss (or its gradients) by scale() before
// pushing; after each step, Update(found_inf) with what the shards decided:
// an overflow spends one unit of hysteresis and, when none is left, backs
// the scale off (never below min_scale); `growth_interval` steps in a row
// without overflow grow it and refill the hysteresis. Deterministic: every
// trainer fed the same decisions holds the same scale, and so does the
// replica every shard keeps (ModelShard), which a restarted trainer resumes
// from.
#ifndef SHARDOPT_COMMON_LOSS_SCALER_H_
#define SHARDOPT_COMMON_LOSS_SCALER_H_

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
  // Growth stops here (2^100: the shards refuse larger scales).
  double max_scale = 1267650600228229401496703205376.0;

  // INVALID_ARGUMENT unless scales are positive, growth > 1, backoff in
  // (0, 1), and the interval and hysteresis at least 1.
  absl::Status Validate() const;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerOptions& options = {});

  double scale() const { return scale_; }
  void Update(bool found_inf);

  // Everything that changes: a scaler set to another's state behaves as it
  // does from then on (a restarted trainer takes the shards' mirror).
  struct State {
    double scale = 1;
    int64_t growth_tracker = 0;
    int64_t hysteresis_tracker = 0;
    bool operator==(const State& o) const {
      return scale == o.scale && growth_tracker == o.growth_tracker &&
             hysteresis_tracker == o.hysteresis_tracker;
    }
  };
  State state() const { return {scale_, growth_tracker_, hysteresis_tracker_}; }
  void set_state(const State& state) {
    scale_ = state.scale;
    growth_tracker_ = state.growth_tracker;
    hysteresis_tracker_ = state.hysteresis_tracker;
  }
  const LossScalerOptions& options() const { return options_; }

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t hysteresis_tracker_;
};

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_LOSS_SCALER_H_
