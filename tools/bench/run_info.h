// What shardopt_bench says about the machine and the run: the header printed
// first (date, CPU model, cores, threads, build mode, load average, the exact
// command line), the load average the summary repeats, and small readers of
// /proc files.
#ifndef SHARDOPT_TOOLS_BENCH_RUN_INFO_H_
#define SHARDOPT_TOOLS_BENCH_RUN_INFO_H_

#include <cstdint>
#include <string>

namespace shardopt::bench {

// The whole file ("" when it cannot be read).
std::string ReadFile(const std::string& path);

// `s` without leading and trailing ASCII whitespace.
std::string Trim(const std::string& s);

// Bytes the loopback device has received so far (/proc/net/dev, "lo"): what
// actually crossed the "wire", headers and framing included. Machine-wide,
// so other loopback traffic during a run shows up too. 0 when unreadable.
uint64_t LoopbackReceivedBytes();

// The 1, 5 and 15 minute load averages of /proc/loadavg ("0.12 0.30 0.25").
std::string LoadAverage();

// Prints the header block to stdout; `threads` is the resolved --threads.
void PrintHeader(int argc, char** argv, int threads);

}  // namespace shardopt::bench

#endif  // SHARDOPT_TOOLS_BENCH_RUN_INFO_H_
