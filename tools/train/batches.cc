#include "tools/train/batches.h"

#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tools/train/random.h"

namespace shardopt::train {

absl::StatusOr<BatchSchedule> BatchSchedule::Create(int dataset_size, int batch_size,
                                                    uint64_t seed) {
  if (batch_size <= 0 || batch_size > dataset_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch size ", batch_size, " is not in [1, dataset size ", dataset_size, "]"));
  }
  return BatchSchedule(dataset_size, batch_size, seed);
}

const std::vector<int>& BatchSchedule::Permutation(int64_t epoch) {
  if (epoch != cached_epoch_) {
    cached_permutation_.resize(dataset_size_);
    std::iota(cached_permutation_.begin(), cached_permutation_.end(), 0);
    // Fisher-Yates with our own generator: std::shuffle's output is not
    // specified, and all trainers must agree on it.
    SplitMix64 rng(seed_ ^ (0x5851f42d4c957f2dull * static_cast<uint64_t>(epoch + 1)));
    for (int i = dataset_size_ - 1; i > 0; --i) {
      std::swap(cached_permutation_[i], cached_permutation_[rng.Below(i + 1)]);
    }
    cached_epoch_ = epoch;
  }
  return cached_permutation_;
}

std::vector<int> BatchSchedule::GlobalBatch(int64_t step) {
  std::vector<int> batch;
  batch.reserve(batch_size_);
  int64_t position = (step - 1) * batch_size_;
  for (int i = 0; i < batch_size_; ++i, ++position) {
    batch.push_back(Permutation(position / dataset_size_)[position % dataset_size_]);
  }
  return batch;
}

absl::Span<const int> ShareOf(absl::Span<const int> batch, uint32_t rank, uint32_t num_trainers) {
  const size_t begin = batch.size() * rank / num_trainers;
  const size_t end = batch.size() * (rank + 1) / num_trainers;
  return batch.subspan(begin, end - begin);
}

}  // namespace shardopt::train
