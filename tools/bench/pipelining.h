// shardopt_bench section (e): whole steps against pipelined ones, with Adam,
// 1 trainer and 1 shard on loopback. Four shapes of a step, run in
// interleaved rounds so that the machine's noise falls on all alike:
//   whole      server --pipeline_range_elements=0, client overlap_pull off
//              (push, then the whole update, then the pull);
//   server     ranges updated as they arrive, pull after the push;
//   client     whole steps on the server, the pull opened during the push;
//   both       the defaults: ranges updated as they arrive and pulled at once.
// Per shape and size: the median step time over the rounds, its speed-up
// over `whole`, and the payload (push + pull) in GB/s as a fraction of the
// raw TCP best (push and pull bytes both counted: they now overlap).
#ifndef SHARDOPT_TOOLS_BENCH_PIPELINING_H_
#define SHARDOPT_TOOLS_BENCH_PIPELINING_H_

#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "tools/bench/workload.h"

namespace shardopt::bench {

absl::Status RunPipeliningSection(const std::vector<int>& sizes_mib, int threads, int rounds,
                                  double seconds_per_case, ChunkSizes chunks,
                                  std::optional<double> tcp_best);

}  // namespace shardopt::bench

#endif  // SHARDOPT_TOOLS_BENCH_PIPELINING_H_
