// shardopt_bench section (d): bytes on the wire and time per step for each
// push/pull element type (fp32/fp32, bf16/fp32, bf16/bf16, fp16/fp16), from
// the client's own count and from what the loopback device received.
#ifndef SHARDOPT_TOOLS_BENCH_WIRE_TYPES_H_
#define SHARDOPT_TOOLS_BENCH_WIRE_TYPES_H_

#include "absl/status/status.h"
#include "tools/bench/workload.h"

namespace shardopt::bench {

// The whole section for a model of `mib` MiB of fp32 parameters: its
// introduction and one table row per wire type, each timed for about
// `seconds`.
absl::Status RunWireTypes(int mib, int threads, double seconds, ChunkSizes chunks);

}  // namespace shardopt::bench

#endif  // SHARDOPT_TOOLS_BENCH_WIRE_TYPES_H_
