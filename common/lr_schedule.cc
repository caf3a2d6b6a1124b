#include "common/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shardopt {

absl::Status LrSchedule::Validate() const {
  if (warmup_steps < 0 || total_steps < 0 || !(warmup_start_lr >= 0) || !(min_lr >= 0) ||
      !std::isfinite(warmup_start_lr) || !std::isfinite(min_lr)) {
    return absl::InvalidArgumentError("lr schedule values must be finite and >= 0");
  }
  if (kind != Kind::kConstant && warmup_type == WarmupType::kLog && warmup_steps == 1) {
    return absl::InvalidArgumentError("a log warmup needs at least 2 warmup steps");
  }
  if ((kind == Kind::kWarmupLinearDecay || kind == Kind::kWarmupCosine) &&
      total_steps <= warmup_steps) {
    return absl::InvalidArgumentError(
        absl::StrCat("total_steps ", total_steps, " must be past warmup_steps ", warmup_steps));
  }
  return absl::OkStatus();
}

double LrSchedule::LearningRate(double base_lr, int64_t step) const {
  if (kind == Kind::kConstant) return base_lr;
  const double i = static_cast<double>(step - 1);
  const double w = static_cast<double>(warmup_steps);
  if (i < w) {
    const double gamma = warmup_type == WarmupType::kLinear ? i / w : std::log(i + 1) / std::log(w);
    return warmup_start_lr + (base_lr - warmup_start_lr) * gamma;
  }
  const double n = static_cast<double>(total_steps);
  switch (kind) {
    case Kind::kWarmupLinearDecay:
      return warmup_start_lr + (base_lr - warmup_start_lr) * std::max(0.0, (n - i) / (n - w));
    case Kind::kWarmupCosine: {
      const double progress = std::min(1.0, (i - w) / (n - w));
      return min_lr + (base_lr - min_lr) * (1.0 + std::cos(M_PI * progress)) / 2.0;
    }
    default:
      return base_lr;
  }
}

std::string LrSchedule::DebugString() const {
  const char* names[] = {"constant", "warmup", "warmup_linear_decay", "warmup_cosine"};
  if (kind == Kind::kConstant) return "constant";
  return absl::StrFormat("%s(warmup_steps=%d %s from %g, total_steps=%d, min_lr=%g)",
                         names[static_cast<int>(kind)], warmup_steps,
                         warmup_type == WarmupType::kLinear ? "linear" : "log", warmup_start_lr,
                         total_steps, min_lr);
}

}  // namespace shardopt
