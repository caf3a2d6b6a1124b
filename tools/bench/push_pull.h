// shardopt_bench section (b): TrainerClient::Step (push + pull) against an
// in-process ShardServer, one trainer, one shard, one fp32 tensor, plain SGD;
// then Push and Pull timed separately, and the server's compute of a step
// (the SGD update, the staging copy with its NaN/inf scan) timed standalone.
#ifndef SHARDOPT_TOOLS_BENCH_PUSH_PULL_H_
#define SHARDOPT_TOOLS_BENCH_PUSH_PULL_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/bench/workload.h"

namespace shardopt::bench {

struct PushPullRow {
  int mib = 0;
  uint64_t elements = 0;
  int steps = 0;
  std::vector<double> step_s;
  uint64_t bytes_per_step = 0;
  int split_steps = 0;
  double push_s = 0, pull_s = 0;  // Means over the split pass.
  double update_s = 0;            // Median, standalone (server's split).
  double scan_s = 0;              // Median, standalone CopyAndFindNonFinite.
};

// The section's introduction: the set-up the rows below it measure.
void PrintPushPullIntro(int threads, int chunk_kib, int pull_chunk_kib, int warmup_steps,
                        double seconds);

// One model of `mib` MiB: `warmup_steps` (at least 1) untimed steps, then
// enough timed ones for about `seconds`, then the breakdown pass.
absl::StatusOr<PushPullRow> RunPushPull(int mib, int threads, double seconds, int warmup_steps,
                                        ChunkSizes chunks);

// The main table (with the ratio to `tcp_best`, the best raw TCP GB/s, when
// there is one) and the breakdown table.
void PrintPushPullTables(const std::vector<PushPullRow>& rows, std::optional<double> tcp_best);

}  // namespace shardopt::bench

#endif  // SHARDOPT_TOOLS_BENCH_PUSH_PULL_H_
