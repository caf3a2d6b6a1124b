// shardopt_bench section (e): whole steps against pipelined ones
// (pipelining.h).
#include "tools/bench/pipelining.h"

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/bench/bench_job.h"
#include "tools/bench/bench_util.h"

namespace shardopt::bench {
namespace {

struct Shape {
  const char* name;
  bool server_ranges;
  bool client_overlap;
};
constexpr Shape kShapes[] = {{"whole", false, false},
                             {"server", true, false},
                             {"client", false, true},
                             {"both", true, true}};

// Median seconds per step of one job of `mib` with `shape`: one warm-up
// step, then steps for about `seconds`.
absl::StatusOr<std::vector<double>> TimeShape(int mib, const Shape& shape, int threads,
                                              double seconds, ChunkSizes chunks) {
  StepShape step_shape;
  step_shape.optimizer = OptimizerConfig::Adam(1e-4);
  step_shape.overlap_pull = shape.client_overlap;
  if (!shape.server_ranges) step_shape.pipeline_range_elements = 0;
  const uint64_t elements = static_cast<uint64_t>(mib) * (kMiB / sizeof(float));
  absl::StatusOr<BenchJob> job =
      StartBenchJob(absl::StrCat("pipe", mib, shape.name), elements, threads, chunks,
                    DType::kFloat32, DType::kFloat32, step_shape);
  if (!job.ok()) return job.status();
  int64_t step = 0;
  absl::Status failed;
  const auto one = [&] {
    absl::StatusOr<StepResult> r =
        job->client->Step(++step, job->grads, absl::MakeSpan(job->params));
    if (!r.ok() && failed.ok()) failed = r.status();
  };
  one();
  std::vector<double> times = TimeRepeated(seconds, 3, 1000, one);
  if (!failed.ok()) return failed;
  return times;
}

}  // namespace

absl::Status RunPipeliningSection(const std::vector<int>& sizes_mib, int threads, int rounds,
                                  double seconds_per_case, ChunkSizes chunks,
                                  std::optional<double> tcp_best) {
  absl::PrintF(
      "\n(e) pipelined steps: Adam, 1 trainer, 1 shard, %d optimizer threads, %d interleaved\n"
      "  rounds of ~%s s per shape; whole = no ranges, pull after push; server = ranges\n"
      "  updated as they arrive (--pipeline_range_elements, default 1M); client = pull\n"
      "  opened during the push (overlap_pull); both = the defaults. Payload GB/s = (push +\n"
      "  pull bytes, both directions counted) / median step; vs TCP = that over the raw TCP\n"
      "  best of (a)\n",
      threads, rounds, Fixed(seconds_per_case, 1));
  std::fflush(stdout);
  Table table({"size", "shape", "steps", "median ms", "min ms", "speed-up", "GB/s", "vs TCP"});
  for (int mib : sizes_mib) {
    std::vector<std::vector<double>> per_shape(std::size(kShapes));
    for (int round = 0; round < rounds; ++round) {
      for (size_t s = 0; s < std::size(kShapes); ++s) {
        absl::StatusOr<std::vector<double>> t =
            TimeShape(mib, kShapes[s], threads, seconds_per_case, chunks);
        if (!t.ok()) {
          return absl::Status(t.status().code(), absl::StrCat(mib, " MiB, ", kShapes[s].name, ": ",
                                                              t.status().message()));
        }
        per_shape[s].insert(per_shape[s].end(), t->begin(), t->end());
      }
    }
    const double whole = Median(per_shape[0]);
    const double bytes = 2.0 * static_cast<double>(mib) * kMiB;
    for (size_t s = 0; s < std::size(kShapes); ++s) {
      const double median = Median(per_shape[s]);
      const double gbps = bytes / median / 1e9;
      table.AddRow({absl::StrCat(mib, " MiB"), kShapes[s].name, absl::StrCat(per_shape[s].size()),
                    Fixed(median * 1e3, 2), Fixed(Min(per_shape[s]) * 1e3, 2),
                    Fixed(whole / median, 2) + "x", Fixed(gbps, 3),
                    tcp_best ? Fixed(gbps / *tcp_best, 3) + "x" : std::string("-")});
    }
  }
  table.Print();
  return absl::OkStatus();
}

}  // namespace shardopt::bench
