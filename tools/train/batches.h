// BatchSchedule: which examples form the global batch of each step, and
// ShareOf: which part of it one data-parallel trainer processes.
//
// Step k (k >= 1) takes the next `batch_size` examples of a seeded random
// permutation of the dataset, drawing a fresh permutation for every epoch;
// a batch that crosses an epoch boundary takes the rest of one epoch and the
// start of the next. Every trainer builds the same schedule from the same
// seed, so no trainer ever ships indices to another.
//
// Contract: GlobalBatch(k) depends only on (dataset_size, batch_size, seed,
// k), not on the order of calls. Not thread-safe (it caches one epoch).
#ifndef SHARDOPT_TOOLS_TRAIN_BATCHES_H_
#define SHARDOPT_TOOLS_TRAIN_BATCHES_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace shardopt::train {

class BatchSchedule {
 public:
  // INVALID_ARGUMENT unless 0 < batch_size <= dataset_size.
  static absl::StatusOr<BatchSchedule> Create(int dataset_size, int batch_size, uint64_t seed);

  // The example indices of step `step` (>= 1), batch_size of them.
  std::vector<int> GlobalBatch(int64_t step);

  int batch_size() const { return batch_size_; }

 private:
  BatchSchedule(int dataset_size, int batch_size, uint64_t seed)
      : dataset_size_(dataset_size), batch_size_(batch_size), seed_(seed) {}

  const std::vector<int>& Permutation(int64_t epoch);

  int dataset_size_;
  int batch_size_;
  uint64_t seed_;
  int64_t cached_epoch_ = -1;
  std::vector<int> cached_permutation_;
};

// Trainer `rank` of `num_trainers` takes the contiguous slice
// [rank * B / T, (rank + 1) * B / T) of a global batch of B examples. The
// slices partition the batch; they are equal when T divides B, which is what
// makes the servers' mean of the trainers' mean gradients equal the
// full-batch mean gradient.
absl::Span<const int> ShareOf(absl::Span<const int> batch, uint32_t rank, uint32_t num_trainers);

}  // namespace shardopt::train

#endif  // SHARDOPT_TOOLS_TRAIN_BATCHES_H_
