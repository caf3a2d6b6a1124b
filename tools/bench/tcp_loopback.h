// shardopt_bench section (a): raw TCP throughput on loopback, two sockets of
// its own on 127.0.0.1, the reference every push+pull ratio is taken against.
#ifndef SHARDOPT_TOOLS_BENCH_TCP_LOOPBACK_H_
#define SHARDOPT_TOOLS_BENCH_TCP_LOOPBACK_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace shardopt::bench {

struct TcpResult {
  std::vector<double> gbps;  // One per repetition.
  double best = 0;
  double median = 0;
};

// One short warm-up, then `repeats` transfers of `total` bytes from a sender
// thread to a receiver thread over one accept()ed connection; prints the
// socket settings and a table of the repetitions, best and median.
absl::StatusOr<TcpResult> RunTcp(uint64_t total, int repeats);

// The same bytes split over `connections` connections at once, each with
// its own sender and receiver thread: the aggregate GB/s of each of
// `repeats` transfers (after a warm-up). Tells whether one connection, or
// the CPUs, bound a loopback transfer (the pipelining issue's connection
// pool question).
absl::StatusOr<TcpResult> RunTcpParallel(uint64_t total, int repeats, int connections);

}  // namespace shardopt::bench

#endif  // SHARDOPT_TOOLS_BENCH_TCP_LOOPBACK_H_
