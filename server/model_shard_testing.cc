#include "server/model_shard_testing.h"

#include <algorithm>
#include <random>

namespace shardopt::testing {

std::vector<float> RandomGradient(uint32_t rank, int64_t step, size_t n) {
  std::mt19937 rng(rank * 1000003u + static_cast<uint32_t>(step));
  std::normal_distribution<float> dist;
  std::vector<float> g(n);
  for (float& v : g) v = dist(rng);
  return g;
}

absl::StatusOr<PushResult> PushInChunks(ModelShard& shard, uint32_t rank, int64_t step,
                                        const std::vector<float>& grad, size_t chunk) {
  absl::StatusOr<ModelShard::PushStart> start = shard.BeginPush(rank, step, grad.size());
  if (!start.ok()) return start.status();
  if (start->immediate) return *start->immediate;
  for (size_t off = 0; off < grad.size(); off += chunk) {
    const size_t count = std::min(chunk, grad.size() - off);
    absl::Status s = start->writer->Write(off, grad.data() + off, count * sizeof(float));
    if (!s.ok()) return s;
  }
  return start->writer->Commit();
}

}  // namespace shardopt::testing
