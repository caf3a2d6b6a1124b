// shardopt_bench section (d): wire element types (wire_types.h).
#include "tools/bench/wire_types.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/bench/bench_job.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/run_info.h"

namespace shardopt::bench {
namespace {

struct WireRow {
  DType push = DType::kFloat32, pull = DType::kFloat32;
  int steps = 0;
  double step_ms = 0;
  uint64_t payload_per_step = 0;
  double loopback_per_step = 0;
};

// Push + pull steps of one model with the given wire types.
absl::StatusOr<WireRow> RunWire(DType push, DType pull, uint64_t n, int threads, double seconds,
                                ChunkSizes chunks) {
  WireRow row;
  row.push = push;
  row.pull = pull;
  absl::StatusOr<BenchJob> job = StartBenchJob("wire", n, threads, chunks, push, pull);
  if (!job.ok()) return job.status();
  int64_t step = 0;
  auto do_step = [&]() -> absl::Status {
    absl::StatusOr<StepResult> r =
        job->client->Step(++step, job->grads, absl::MakeSpan(job->params));
    if (!r.ok()) return r.status();
    row.payload_per_step = r->bytes_pushed + r->bytes_pulled;
    return absl::OkStatus();
  };
  if (absl::Status s = do_step(); !s.ok()) return s;  // Warm-up.
  const uint64_t lo_before = LoopbackReceivedBytes();
  const Clock::time_point t0 = Clock::now();
  do {
    if (absl::Status s = do_step(); !s.ok()) return s;
    ++row.steps;
  } while (Since(t0) < seconds || row.steps < 3);
  row.step_ms = 1e3 * Since(t0) / row.steps;
  row.loopback_per_step = static_cast<double>(LoopbackReceivedBytes() - lo_before) / row.steps;
  return row;
}

}  // namespace

absl::Status RunWireTypes(int mib, int threads, double seconds, ChunkSizes chunks) {
  const uint64_t n = static_cast<uint64_t>(mib) * (kMiB / sizeof(float));
  absl::PrintF(
      "\n(d) bytes on the wire per step by element type: %d MiB of fp32 parameters (%d "
      "elements),\n  1 trainer, 1 shard; payload = push + pull bytes as counted by the "
      "client; loopback = bytes\n  the lo device received (/proc/net/dev, machine-wide: "
      "headers and framing included)\n",
      mib, n);
  const std::pair<DType, DType> cases[] = {{DType::kFloat32, DType::kFloat32},
                                           {DType::kBFloat16, DType::kFloat32},
                                           {DType::kBFloat16, DType::kBFloat16},
                                           {DType::kFloat16, DType::kFloat16}};
  std::vector<WireRow> rows;
  for (const auto& [push, pull] : cases) {
    absl::StatusOr<WireRow> row = RunWire(push, pull, n, threads, seconds, chunks);
    if (!row.ok()) return row.status();
    rows.push_back(*row);
  }
  Table table({"push / pull", "steps", "ms/step", "payload MB/step", "loopback MB/step",
               "vs fp32 bytes", "vs fp32 time"});
  for (const WireRow& r : rows) {
    table.AddRow({absl::StrCat(DTypeName(r.push), " / ", DTypeName(r.pull)), absl::StrCat(r.steps),
                  Fixed(r.step_ms, 2), Fixed(r.payload_per_step / 1e6, 1),
                  Fixed(r.loopback_per_step / 1e6, 1),
                  Fixed(r.loopback_per_step / rows[0].loopback_per_step, 3) + "x",
                  Fixed(r.step_ms / rows[0].step_ms, 3) + "x"});
  }
  table.Print();
  return absl::OkStatus();
}

}  // namespace shardopt::bench
