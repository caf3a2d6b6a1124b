#include "server/model_shard_testing.h"

#include <algorithm>
#include <random>

#include "gtest/gtest.h"

// The pipelined variants of the ModelShard tests build this file with a
// range size, so that every one of them runs range by range too.
#ifndef SHARDOPT_TEST_PIPELINE_RANGE
#define SHARDOPT_TEST_PIPELINE_RANGE 0
#endif

namespace shardopt::testing {

std::vector<float> RandomGradient(uint32_t rank, int64_t step, size_t n) {
  std::mt19937 rng(rank * 1000003u + static_cast<uint32_t>(step));
  std::normal_distribution<float> dist;
  std::vector<float> g(n);
  for (float& v : g) v = dist(rng);
  if (n == TestLayout().ShardSize(0)) ZeroPadding(TestLayout(), kShard, &g);
  return g;
}

void ZeroPadding(const ModelLayout& layout, uint32_t shard, std::vector<float>* values) {
  shardopt::ZeroPadding(layout, layout.ShardRange(shard), values->data());
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

ModelLayout TestLayout() {
  return ModelLayout::Create({{"a", {1000, 3}}, {"b", {77}}}, 16, kShards).value();
}

std::unique_ptr<ModelShard> MakeShard(ThreadPool* pool, uint32_t trainers,
                                      OptimizerConfig optimizer) {
  ModelShardOptions options{"m", TestLayout(), kShard, optimizer, trainers, true};
  options.pipeline_range_elements = SHARDOPT_TEST_PIPELINE_RANGE;
  std::vector<float> init(options.layout.ShardSize(0));
  for (size_t i = 0; i < init.size(); ++i) init[i] = 0.001f * static_cast<float>(i % 97);
  ZeroPadding(options.layout, kShard, &init);
  return ModelShard::Create(std::move(options), std::move(init), pool).value();
}

absl::StatusOr<PushResult> PushAll(ModelShard& shard, uint32_t rank, int64_t step,
                                   size_t chunk) {
  return PushInChunks(shard, rank, step, RandomGradient(rank, step, shard.size()), chunk);
}

std::vector<float> ReadAll(ModelShard& shard, int64_t version) {
  std::vector<float> out(shard.size());
  EXPECT_TRUE(shard.ReadParameters(version, 0, out.size(), out.data()).ok());
  return out;
}

}  // namespace shardopt::testing
