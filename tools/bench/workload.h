// What shardopt_bench's sections (b), (c) and (d) feed the code they time:
// the benchmark's gradients and parameters, its plain SGD, the message sizes
// of a push+pull run, and ModelShard::ApplyStep's split of an update.
#ifndef SHARDOPT_TOOLS_BENCH_WORKLOAD_H_
#define SHARDOPT_TOOLS_BENCH_WORKLOAD_H_

#include <cstddef>
#include <vector>

#include "common/optimizer_config.h"

namespace shardopt::bench {

// Bytes of tensor data per streamed message, each way.
struct ChunkSizes {
  size_t push;  // the client's chunk_bytes
  size_t pull;  // the server's pull_chunk_bytes
};

// What ModelShard::ApplyStep uses (server/model_shard.cc), for the
// update-only estimate of (b) and the thread split of (c).
constexpr size_t kServerGrainElements = 16;
constexpr size_t kServerBlockElements = 8192;

// Small finite values, the same for every run.
void FillGradients(std::vector<float>& g);
void FillParams(std::vector<float>& p);

// Plain SGD, small lr, no momentum: a real but cheap update (reads p, g;
// writes p).
OptimizerConfig BenchSgd();

}  // namespace shardopt::bench

#endif  // SHARDOPT_TOOLS_BENCH_WORKLOAD_H_
