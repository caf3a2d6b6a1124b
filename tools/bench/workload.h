// What shardopt_bench's sections (b), (c) and (d) feed the code they time:
// the benchmark's gradients and parameters, its plain SGD, the message sizes
// of a push+pull run.
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

// Small finite values, the same for every run: element i of each.
float GradientAt(size_t i);
float ParamAt(size_t i);
void FillGradients(std::vector<float>& g);
void FillParams(std::vector<float>& p);

// Plain SGD, small lr, no momentum: a real but cheap update (reads p, g;
// writes p).
OptimizerConfig BenchSgd();

}  // namespace shardopt::bench

#endif  // SHARDOPT_TOOLS_BENCH_WORKLOAD_H_
