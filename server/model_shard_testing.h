// Test helpers for ModelShard: reproducible gradients and chunked pushes.
#ifndef SHARDOPT_SERVER_MODEL_SHARD_TESTING_H_
#define SHARDOPT_SERVER_MODEL_SHARD_TESTING_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "server/model_shard.h"

namespace shardopt::testing {

// N(0, 1) values, the same for the same (rank, step, n); zeros on the
// padding when n is the size of TestLayout()'s shard kShard.
std::vector<float> RandomGradient(uint32_t rank, int64_t step, size_t n);

inline constexpr uint32_t kShards = 2;
inline constexpr uint32_t kShard = 1;

// Tensors of odd sizes over 2 shards; the tests use shard 1's range.
ModelLayout TestLayout();
// Shard kShard of TestLayout() for `trainers` trainers, with known initial
// values.
std::unique_ptr<ModelShard> MakeShard(ThreadPool* pool, uint32_t trainers,
                                      OptimizerConfig optimizer = OptimizerConfig::AdamW(0.01));
// Zeros the padding of shard `shard`'s range in `values` (the whole range),
// as a trainer's buffers hold it.
void ZeroPadding(const ModelLayout& layout, uint32_t shard, std::vector<float>* values);
// Pushes rank's RandomGradient of `step` in chunks of `chunk` elements.
absl::StatusOr<PushResult> PushAll(ModelShard& shard, uint32_t rank, int64_t step,
                                   size_t chunk = 333);
// The whole range at `version` (expects it to be there).
std::vector<float> ReadAll(ModelShard& shard, int64_t version);

// Pushes `grad` (the whole range) as `rank`'s gradient for `step` in chunks
// of `chunk` elements, then commits; the immediate answer for duplicates.
absl::StatusOr<PushResult> PushInChunks(ModelShard& shard, uint32_t rank, int64_t step,
                                        const std::vector<float>& grad, size_t chunk);

}  // namespace shardopt::testing

#endif  // SHARDOPT_SERVER_MODEL_SHARD_TESTING_H_
