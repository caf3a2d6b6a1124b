// shardopt_bench: one-run throughput picture of a shardopt shard on this
// machine, printed as plain tables (see tools/bench/README.md).
//
//   bazel run -c opt //tools/bench:shardopt_bench [-- --sizes_mib=4,64,256 ...]
//
// (a) raw TCP loopback throughput (two sockets of its own, 4 MiB write()s);
// (b) TrainerClient::Step (push + pull) payload throughput against an
//     in-process ShardServer, one trainer, one shard, plain SGD, and its ratio
//     to (a);
// (c) CPU optimizer update rate (AdamW, SGD-momentum, Adagrad, plain SGD) over
//     a ThreadPool, next to a memcpy bandwidth reference from the same run;
// (d) bytes on the wire and step time per step with fp32, bf16 and fp16
//     gradients and parameters.
//
// GB means 10^9 bytes, MiB 2^20 bytes. Everything the tables need goes to
// stdout; the server's own log lines go to stderr.
//
// This file holds the flags, their checks and the order of the run (header,
// sections, summary); each section is a file of its own: tcp_loopback (a),
// push_pull (b), optimizer_rate (c), wire_types (d), with run_info (header,
// load average), bench_util (timing, statistics, tables) and workload (the
// data and SGD the sections run).
#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "server/malloc_tuning.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/optimizer_rate.h"
#include "tools/bench/pipelining.h"
#include "tools/bench/push_pull.h"
#include "tools/bench/run_info.h"
#include "tools/bench/tcp_loopback.h"
#include "tools/bench/transports.h"
#include "tools/bench/wire_types.h"

ABSL_FLAG(std::vector<std::string>, sizes_mib, std::vector<std::string>({"4", "64", "256"}),
          "Push+pull payload sizes in MiB of fp32 gradients (one tensor of MiB * 262144 "
          "elements each).");
ABSL_FLAG(int64_t, optimizer_params, int64_t{64} << 20,
          "Parameters per optimizer update in section (c).");
ABSL_FLAG(double, seconds_per_case, 3.0,
          "Approximate timed seconds per case (each push+pull size, each optimizer and "
          "thread count).");
ABSL_FLAG(bool, skip_tcp, false, "Skip (a), the raw TCP loopback measurement.");
ABSL_FLAG(bool, skip_push_pull, false, "Skip (b), the shardopt push+pull measurement.");
ABSL_FLAG(bool, skip_optimizer, false, "Skip (c), the optimizer and memcpy measurement.");
ABSL_FLAG(int, wire_mib, 64,
          "(d): MiB of fp32 parameters for the wire element-type comparison; 0 skips it.");
ABSL_FLAG(std::vector<std::string>, pipeline_sizes_mib, std::vector<std::string>({"64", "256"}),
          "Model sizes (MiB) of (e), whole against pipelined steps with Adam; empty skips it.");
ABSL_FLAG(int, pipeline_rounds, 3, "Interleaved rounds of (e).");
ABSL_FLAG(std::vector<std::string>, transport_sizes_mib, std::vector<std::string>({"64", "256"}),
          "Sizes of (f), the data planes (gRPC, shared memory) side by side; empty: skip (f).");
ABSL_FLAG(int, transport_rounds, 3, "Interleaved rounds of (f).");
ABSL_FLAG(int, threads, 0,
          "Threads for the server's optimizer pool and for the multi-threaded rows of (c); "
          "0 = std::thread::hardware_concurrency().");
ABSL_FLAG(int64_t, tcp_mib, 1024, "MiB sent per raw TCP repetition.");
ABSL_FLAG(int, tcp_repeats, 3, "Raw TCP repetitions (after one short warm-up).");
ABSL_FLAG(std::vector<std::string>, tcp_parallel_connections, {},
          "Also time (a)'s bytes split over this many loopback connections at once (e.g. 2,4), "
          "each with its own sender and receiver thread, next to one connection.");
ABSL_FLAG(int64_t, memcpy_mib, 1024, "MiB copied per memcpy repetition in (c).");
ABSL_FLAG(int, warmup_steps, 2, "Untimed push+pull steps before the timed ones.");
ABSL_FLAG(bool, tune_malloc, true,
          "Apply shardopt_server's malloc settings (server/malloc_tuning.h) to this process.");
ABSL_FLAG(int, chunk_kib, 4096,
          "KiB of gradient data per pushed message in (b) and (d): the client's chunk_bytes "
          "(default 4096, as TrainerClientOptions; at most 32768).");
ABSL_FLAG(int, pull_chunk_kib, 1024,
          "KiB of parameter data per pulled message in (b) and (d): the server's "
          "pull_chunk_bytes (default 1024, as shardopt_server's --pull_chunk_kib).");

namespace shardopt::bench {
namespace {

// The sizes of a --*_sizes_mib flag, each in [1, max_mib]; nullopt (after
// saying which) when one is not.
std::optional<std::vector<int>> SizesOf(const std::vector<std::string>& values, const char* flag,
                                        int max_mib) {
  std::vector<int> sizes;
  for (const std::string& s : values) {
    int mib = 0;
    if (!absl::SimpleAtoi(s, &mib) || mib <= 0 || mib > max_mib) {
      std::fprintf(stderr, "--%s: '%s' is not a size in MiB in [1, %d]\n", flag, s.c_str(),
                   max_mib);
      return std::nullopt;
    }
    sizes.push_back(mib);
  }
  return sizes;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "shardopt throughput benchmark: raw TCP loopback, push+pull, optimizer update rate");
  absl::ParseCommandLine(argc, argv);
  SetLogTag("shardopt_bench");
  // The daemon tunes malloc at start-up (server/malloc_tuning.h); so does the
  // in-process server here, which also tunes the client side of (b).
  const bool malloc_tuned = absl::GetFlag(FLAGS_tune_malloc) && TuneMallocForLargeMessages();

  int threads = absl::GetFlag(FLAGS_threads);
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const double seconds = std::max(0.0, absl::GetFlag(FLAGS_seconds_per_case));
  const std::optional<std::vector<int>> push_pull_sizes =
      SizesOf(absl::GetFlag(FLAGS_sizes_mib), "sizes_mib", 4096);
  const std::optional<std::vector<int>> pipeline_sizes =
      SizesOf(absl::GetFlag(FLAGS_pipeline_sizes_mib), "pipeline_sizes_mib", 1 << 16);
  const std::optional<std::vector<int>> transport_sizes =
      SizesOf(absl::GetFlag(FLAGS_transport_sizes_mib), "transport_sizes_mib", 1 << 16);
  if (!push_pull_sizes || !pipeline_sizes || !transport_sizes) return 2;
  const std::vector<int>& sizes = *push_pull_sizes;
  const int64_t optimizer_params = absl::GetFlag(FLAGS_optimizer_params);
  const int64_t tcp_mib = absl::GetFlag(FLAGS_tcp_mib);
  const int64_t memcpy_mib = absl::GetFlag(FLAGS_memcpy_mib);
  const int tcp_repeats = absl::GetFlag(FLAGS_tcp_repeats);
  const int chunk_kib = absl::GetFlag(FLAGS_chunk_kib);
  if (chunk_kib <= 0 || chunk_kib > 32768) {
    std::fprintf(stderr, "--chunk_kib must be in [1, 32768]\n");
    return 2;
  }
  const int pull_chunk_kib = absl::GetFlag(FLAGS_pull_chunk_kib);
  if (pull_chunk_kib <= 0 || pull_chunk_kib > 32768) {
    std::fprintf(stderr, "--pull_chunk_kib must be in [1, 32768]\n");
    return 2;
  }
  const ChunkSizes chunks{static_cast<size_t>(chunk_kib) << 10, static_cast<size_t>(pull_chunk_kib)
                                                                    << 10};
  if (optimizer_params <= 0 || tcp_mib <= 0 || memcpy_mib <= 0 || tcp_repeats <= 0) {
    std::fprintf(
        stderr, "--optimizer_params, --tcp_mib, --memcpy_mib and --tcp_repeats must be positive\n");
    return 2;
  }

  PrintHeader(argc, argv, threads);
  absl::PrintF("  malloc:    %s\n",
               malloc_tuned ? "tuned as in shardopt_server (server/malloc_tuning.h; applies "
                              "to the client half of (b) too)"
                            : "glibc defaults (--notune_malloc)");
  const Clock::time_point run_start = Clock::now();

  std::optional<TcpResult> tcp;
  if (!absl::GetFlag(FLAGS_skip_tcp)) {
    absl::PrintF("\n(a) raw TCP loopback throughput\n");
    absl::StatusOr<TcpResult> r = RunTcp(static_cast<uint64_t>(tcp_mib) * kMiB, tcp_repeats);
    if (!r.ok()) {
      std::fprintf(stderr, "raw TCP: %s\n", r.status().ToString().c_str());
      return 1;
    }
    tcp = *r;
    for (const std::string& text : absl::GetFlag(FLAGS_tcp_parallel_connections)) {
      int connections = 0;
      if (!absl::SimpleAtoi(text, &connections) || connections < 1) {
        std::fprintf(stderr, "--tcp_parallel_connections: '%s' is not a count\n", text.c_str());
        return 2;
      }
      absl::StatusOr<TcpResult> p =
          RunTcpParallel(static_cast<uint64_t>(tcp_mib) * kMiB, tcp_repeats, connections);
      if (!p.ok()) {
        std::fprintf(stderr, "raw TCP, %d connections: %s\n", connections,
                     p.status().ToString().c_str());
        return 1;
      }
      absl::PrintF("  %d connections at once: best %s GB/s in all, median %s (%sx one's best)\n",
                   connections, Fixed(p->best, 2), Fixed(p->median, 2),
                   Fixed(p->best / tcp->best, 2));
    }
  }

  std::vector<PushPullRow> rows;
  if (!absl::GetFlag(FLAGS_skip_push_pull) && !sizes.empty()) {
    PrintPushPullIntro(threads, chunk_kib, pull_chunk_kib, absl::GetFlag(FLAGS_warmup_steps),
                       seconds);
    for (int mib : sizes) {
      absl::StatusOr<PushPullRow> r =
          RunPushPull(mib, threads, seconds, absl::GetFlag(FLAGS_warmup_steps), chunks);
      if (!r.ok()) {
        std::fprintf(stderr, "push+pull %d MiB: %s\n", mib, r.status().ToString().c_str());
        return 1;
      }
      rows.push_back(*r);
    }
    PrintPushPullTables(rows, tcp ? std::optional<double>(tcp->best) : std::nullopt);
  }

  if (!absl::GetFlag(FLAGS_skip_optimizer)) {
    std::vector<int> thread_counts = {threads};
    if (threads != 1) thread_counts.push_back(1);
    if (absl::Status s = RunOptimizerSection(static_cast<uint64_t>(optimizer_params), memcpy_mib,
                                             thread_counts, seconds);
        !s.ok()) {
      std::fprintf(stderr, "optimizer: %s\n", s.ToString().c_str());
      return 1;
    }
  }

  if (const int wire_mib = absl::GetFlag(FLAGS_wire_mib); wire_mib > 0) {
    if (absl::Status s = RunWireTypes(wire_mib, threads, seconds, chunks); !s.ok()) {
      std::fprintf(stderr, "wire types: %s\n", s.ToString().c_str());
      return 1;
    }
  }

  if (!pipeline_sizes->empty()) {
    if (absl::Status s = RunPipeliningSection(
            *pipeline_sizes, threads, std::max(1, absl::GetFlag(FLAGS_pipeline_rounds)), seconds,
            chunks, tcp ? std::optional<double>(tcp->best) : std::nullopt);
        !s.ok()) {
      std::fprintf(stderr, "pipelining: %s\n", s.ToString().c_str());
      return 1;
    }
  }

  if (!transport_sizes->empty()) {
    if (absl::Status s = RunTransportsSection(
            *transport_sizes, threads, std::max(1, absl::GetFlag(FLAGS_transport_rounds)), seconds,
            chunks, tcp ? std::optional<double>(tcp->best) : std::nullopt);
        !s.ok()) {
      std::fprintf(stderr, "data planes: %s\n", s.ToString().c_str());
      return 1;
    }
  }

  absl::PrintF("\nsummary\n");
  if (tcp) {
    absl::PrintF("  raw TCP loopback: %s GB/s best, %s GB/s median of %zu\n",
                 Fixed(tcp->best, 2).c_str(), Fixed(tcp->median, 2).c_str(), tcp->gbps.size());
  }
  for (const PushPullRow& r : rows) {
    const double gbps = r.bytes_per_step / Mean(r.step_s) / 1e9;
    absl::PrintF("  push+pull %d MiB: %s ms/step, %s GB/s payload%s\n", r.mib,
                 Fixed(Mean(r.step_s) * 1e3, 2).c_str(), Fixed(gbps, 3).c_str(),
                 tcp ? absl::StrFormat(" = %.3fx raw TCP best", gbps / tcp->best).c_str() : "");
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  absl::PrintF("  peak RSS: %s MiB; wall time: %s s; loadavg at end: %s\n",
               Fixed(usage.ru_maxrss / 1024.0, 0).c_str(), Fixed(Since(run_start), 1).c_str(),
               LoadAverage().c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace shardopt::bench

int main(int argc, char** argv) { return shardopt::bench::Main(argc, argv); }
