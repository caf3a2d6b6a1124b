// ProgressReport: rank 0's console output, one line per report.
//
// Keeps the throughput bookkeeping (steps and bytes since the previous line
// and since the start) so the training loop only records what happened.
// Writes to a FILE* (stdout in the trainer) and flushes after every line,
// since the launcher streams it through a pipe, where stdio would otherwise
// buffer the whole run. Not thread-safe.
#ifndef SHARDOPT_TOOLS_TRAIN_PROGRESS_H_
#define SHARDOPT_TOOLS_TRAIN_PROGRESS_H_

#include <cstdint>
#include <cstdio>
#include <optional>

#include "absl/time/time.h"
#include "tools/train/mlp_loss.h"

namespace shardopt::train {

class ProgressReport {
 public:
  ProgressReport(FILE* out, absl::Time start) : out_(out), start_(start), interval_start_(start) {}

  // One finished step that moved `bytes` over the network (push + pull).
  void RecordStep(uint64_t bytes);

  // The line for the parameters before training.
  void PrintInitial(const MlpMetrics& eval);

  // The line for step `step`: the train loss of this trainer's share, the
  // full-dataset metrics when this step was evaluated, and the rates since
  // the previous line. Starts a new rate interval.
  void PrintStep(int64_t step, double train_loss, const std::optional<MlpMetrics>& eval,
                 absl::Time now);

  // Steps this process ran so far (a trainer restarted into a running job
  // runs only the rest), and steps/s and MB/s over them.
  int64_t total_steps() const { return total_steps_; }
  double TotalStepsPerSecond(absl::Time now) const;
  double TotalMegabytesPerSecond(absl::Time now) const;

 private:
  FILE* out_;
  absl::Time start_;
  absl::Time interval_start_;
  int64_t interval_steps_ = 0;
  uint64_t interval_bytes_ = 0;
  int64_t total_steps_ = 0;
  uint64_t total_bytes_ = 0;
};

}  // namespace shardopt::train

#endif  // SHARDOPT_TOOLS_TRAIN_PROGRESS_H_
