// shardopt_bench section (c): the CPU optimizer update rate (AdamW,
// SGD-momentum, Adagrad, plain SGD) split over a ThreadPool, next to a memcpy
// bandwidth reference from the same run.
#ifndef SHARDOPT_TOOLS_BENCH_OPTIMIZER_RATE_H_
#define SHARDOPT_TOOLS_BENCH_OPTIMIZER_RATE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace shardopt::bench {

// The whole section: its introduction, the memcpy table for each of
// `thread_counts` (a buffer of `memcpy_mib` MiB), then one row per optimizer
// and thread count over `params` parameters, each case timed for about
// `seconds`.
absl::Status RunOptimizerSection(uint64_t params, int64_t memcpy_mib,
                                 const std::vector<int>& thread_counts, double seconds);

}  // namespace shardopt::bench

#endif  // SHARDOPT_TOOLS_BENCH_OPTIMIZER_RATE_H_
