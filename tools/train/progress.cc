#include "tools/train/progress.h"

namespace shardopt::train {
namespace {

double PerSecond(double amount, absl::Duration elapsed) {
  const double seconds = absl::ToDoubleSeconds(elapsed);
  return seconds > 0 ? amount / seconds : 0.0;
}

}  // namespace

void ProgressReport::RecordStep(uint64_t bytes) {
  ++interval_steps_;
  ++total_steps_;
  interval_bytes_ += bytes;
  total_bytes_ += bytes;
}

void ProgressReport::PrintInitial(const MlpMetrics& eval) {
  fprintf(out_, "step %5d  %-17s  eval loss %.4f  acc %5.1f%%\n", 0, "(initial)", eval.loss,
          100 * eval.accuracy);
  fflush(out_);
}

void ProgressReport::PrintStep(int64_t step, double train_loss,
                               const std::optional<MlpMetrics>& eval, absl::Time now) {
  char eval_text[64] = "                             ";
  if (eval) {
    snprintf(eval_text, sizeof(eval_text), "eval loss %.4f  acc %5.1f%%", eval->loss,
             100 * eval->accuracy);
  }
  const absl::Duration elapsed = now - interval_start_;
  fprintf(out_, "step %5ld  train loss %.4f  %s  %7.1f steps/s  %6.2f MB/s\n",
          static_cast<long>(step), train_loss, eval_text, PerSecond(interval_steps_, elapsed),
          PerSecond(interval_bytes_ / 1e6, elapsed));
  fflush(out_);
  interval_start_ = now;
  interval_steps_ = 0;
  interval_bytes_ = 0;
}

double ProgressReport::TotalStepsPerSecond(absl::Time now) const {
  return PerSecond(total_steps_, now - start_);
}

double ProgressReport::TotalMegabytesPerSecond(absl::Time now) const {
  return PerSecond(total_bytes_ / 1e6, now - start_);
}

}  // namespace shardopt::train
