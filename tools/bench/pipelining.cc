// shardopt_bench section (e): whole steps against pipelined ones
// (pipelining.h).
#include "tools/bench/pipelining.h"

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "proto/shardopt/v1/shard_service.pb.h"
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

// Where the last step's time went on the shard (its --step_timeline, ms
// from the step's first push): the push's ranges arriving, the last range's
// update, the pull from the first range read to the last.
struct TimeSplit {
  double first_arrival = 0, last_arrival = 0, last_update = 0, first_pull = 0, last_pull = 0;
  int ranges = 0;
};

std::optional<TimeSplit> SplitOf(TrainerClient& client) {
  absl::StatusOr<std::vector<std::string>> inspected = client.InspectJson();
  if (!inspected.ok() || inspected->empty()) {
    std::fprintf(stderr, "no timeline: %s\n", inspected.status().ToString().c_str());
    return std::nullopt;
  }
  v1::InspectResponse response;
  if (const auto parsed = google::protobuf::util::JsonStringToMessage((*inspected)[0], &response);
      !parsed.ok() || !response.has_step_timeline()) {
    std::fprintf(stderr, "no timeline in Inspect: %s\n", parsed.ToString().c_str());
    return std::nullopt;
  }
  TimeSplit split;
  const v1::StepTimeline& t = response.step_timeline();
  split.ranges = t.ranges_size();
  split.first_arrival = split.first_pull = 1e300;
  for (const v1::RangeTimeline& r : t.ranges()) {
    split.first_arrival = std::min(split.first_arrival, r.arrived_ms());
    split.last_arrival = std::max(split.last_arrival, r.arrived_ms());
    split.last_update = std::max(split.last_update, r.updated_ms());
    split.first_pull = std::min(split.first_pull, r.pulled_ms());
    split.last_pull = std::max(split.last_pull, r.pulled_ms());
  }
  return split.ranges > 0 ? std::optional<TimeSplit>(split) : std::nullopt;
}

struct ShapeRun {
  std::vector<double> times;
  std::optional<TimeSplit> split;  // With the timeline on.
};

// Seconds per step of one job of `mib` with `shape`: one warm-up step, then
// steps for about `seconds`; with `timeline`, the last step's time split.
absl::StatusOr<ShapeRun> TimeShape(int mib, const Shape& shape, int threads, double seconds,
                                   ChunkSizes chunks, bool timeline) {
  StepShape step_shape;
  step_shape.step_timeline = timeline;
  step_shape.optimizer = OptimizerConfig::Adam(1e-4);
  step_shape.overlap_pull = shape.client_overlap;
  if (!shape.server_ranges) step_shape.pipeline_range_elements = 0;
  const uint64_t elements = static_cast<uint64_t>(mib) * (kMiB / sizeof(float));
  absl::StatusOr<BenchJob> job =
      StartBenchJob(absl::StrCat("pipe", mib, shape.name), elements, threads, chunks,
                    DType::kFloat32, DType::kFloat32, step_shape);
  if (!job.ok()) return job.status();
  int64_t steps = 0;
  absl::StatusOr<std::vector<double>> times =
      TimeSteps(*job->client, job->grads, absl::MakeSpan(job->params), seconds, &steps);
  if (!times.ok()) return times.status();
  ShapeRun run;
  run.times = *std::move(times);
  if (timeline) run.split = SplitOf(*job->client);
  return run;
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
  std::vector<std::pair<int, TimeSplit>> splits;
  for (int mib : sizes_mib) {
    std::vector<std::vector<double>> per_shape(std::size(kShapes));
    for (int round = 0; round < rounds; ++round) {
      for (size_t s = 0; s < std::size(kShapes); ++s) {
        // The timeline (one more Inspect) only in the last round of "both".
        const bool timeline = round == rounds - 1 && s + 1 == std::size(kShapes);
        absl::StatusOr<ShapeRun> t =
            TimeShape(mib, kShapes[s], threads, seconds_per_case, chunks, timeline);
        if (!t.ok()) {
          return absl::Status(t.status().code(), absl::StrCat(mib, " MiB, ", kShapes[s].name, ": ",
                                                              t.status().message()));
        }
        per_shape[s].insert(per_shape[s].end(), t->times.begin(), t->times.end());
        if (t->split) splits.emplace_back(mib, *t->split);
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
  absl::PrintF(
      "\n  where the last step of \"both\" went on the shard (--step_timeline, ms from its\n"
      "  first push): ranges arriving (the push), the last update after the last arrival,\n"
      "  the pull from the first range read to the last\n");
  Table where({"size", "ranges", "arrivals", "last update", "pull", "pull began", "total"});
  for (const auto& [mib, s] : splits) {
    where.AddRow({absl::StrCat(mib, " MiB"), absl::StrCat(s.ranges),
                  Fixed(s.first_arrival, 1) + ".." + Fixed(s.last_arrival, 1),
                  "+" + Fixed(s.last_update - s.last_arrival, 1),
                  Fixed(s.first_pull, 1) + ".." + Fixed(s.last_pull, 1),
                  s.first_pull < s.last_arrival ? std::string("during-push")
                                                : std::string("after-push"),
                  Fixed(s.last_pull, 1)});
  }
  where.Print();
  return absl::OkStatus();
}

}  // namespace shardopt::bench
