// Test helpers for ModelShard: reproducible gradients and chunked pushes.
#ifndef SHARDOPT_SERVER_MODEL_SHARD_TESTING_H_
#define SHARDOPT_SERVER_MODEL_SHARD_TESTING_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "server/model_shard.h"

namespace shardopt::testing {

// N(0, 1) values, the same for the same (rank, step, n).
std::vector<float> RandomGradient(uint32_t rank, int64_t step, size_t n);

// Pushes `grad` (the whole range) as `rank`'s gradient for `step` in chunks
// of `chunk` elements, then commits; the immediate answer for duplicates.
absl::StatusOr<PushResult> PushInChunks(ModelShard& shard, uint32_t rank, int64_t step,
                                        const std::vector<float>& grad, size_t chunk);

}  // namespace shardopt::testing

#endif  // SHARDOPT_SERVER_MODEL_SHARD_TESTING_H_
