// shardopt_bench section (f): the data planes side by side. Push + update +
// pull of one fp32 tensor with plain SGD (the update nearly free), 1 trainer
// and 1 shard on this host, in interleaved rounds:
//   grpc       payloads in the gRPC streams (the defaults otherwise);
//   shm-copy   through shared memory, the client copying the caller's
//              buffers through its segment;
//   shm        through shared memory with the client's shared buffers (the
//              shard reads the gradient and writes the parameters in place);
// next to a single-threaded memcpy of the same bytes in both directions
// (push + pull) and the raw TCP best of (a).
#ifndef SHARDOPT_TOOLS_BENCH_TRANSPORTS_H_
#define SHARDOPT_TOOLS_BENCH_TRANSPORTS_H_

#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "tools/bench/workload.h"

namespace shardopt::bench {

absl::Status RunTransportsSection(const std::vector<int>& sizes_mib, int threads, int rounds,
                                  double seconds_per_case, ChunkSizes chunks,
                                  std::optional<double> tcp_best);

}  // namespace shardopt::bench

#endif  // SHARDOPT_TOOLS_BENCH_TRANSPORTS_H_
