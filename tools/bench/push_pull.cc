// shardopt_bench section (b): push+pull through TrainerClient and an
// in-process ShardServer, and its breakdown (push_pull.h).
#include "tools/bench/push_pull.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/finite.h"
#include "server/cpu_backend.h"
#include "server/optim/optimizer.h"
#include "server/parallel_for.h"
#include "tools/bench/bench_job.h"
#include "tools/bench/bench_util.h"

namespace shardopt::bench {
namespace {

// Server-side costs of one step measured outside gRPC: the SGD update split
// the way CpuBackend::Apply splits it (grain and blocks), and the copy into staging with
// its fused NaN/inf scan that each pushed chunk gets (PushWriter::Write).
absl::Status EstimateServerCompute(uint64_t n, int threads, double budget_s, PushPullRow& row) {
  absl::StatusOr<std::unique_ptr<Optimizer>> opt = Optimizer::Create(BenchSgd(), n);
  if (!opt.ok()) return opt.status();
  std::vector<float> params(n), grads(n);
  FillParams(params);
  FillGradients(grads);
  ThreadPool pool(threads);
  int64_t step = 1;
  std::vector<double> update = TimeRepeated(budget_s, 3, 1000, [&] {
    pool.ParallelFor(n, CpuBackend::kGrainElements, [&](size_t begin, size_t end) {
      for (size_t block = begin; block < end; block += CpuBackend::kBlockElements) {
        (*opt)->Update(step, params.data(), grads.data(), block,
                       std::min(end, block + CpuBackend::kBlockElements));
      }
    });
    ++step;
  });
  size_t bad = 0;
  std::vector<float> staging(n);
  std::vector<double> scan = TimeRepeated(
      budget_s, 3, 1000, [&] { bad += n - CopyAndFindNonFinite(staging.data(), grads.data(), n); });
  if (bad != 0) return absl::InternalError("benchmark gradients are not finite");
  row.update_s = Median(update);
  row.scan_s = Median(scan);
  return absl::OkStatus();
}

}  // namespace

void PrintPushPullIntro(int threads, int chunk_kib, int pull_chunk_kib, int warmup_steps,
                        double seconds) {
  absl::PrintF(
      "\n(b) shardopt push+pull: TrainerClient::Step against an in-process ShardServer\n"
      "  127.0.0.1:0, 1 shard, %d optimizer threads; 1 trainer; 1 fp32 tensor; plain SGD\n"
      "  lr=1e-4 (no momentum); %d KiB per pushed message (client chunk_bytes%s), %d KiB\n"
      "  per pulled message (server pull_chunk_bytes%s); %d warm-up steps, then N steps\n"
      "  for ~%s s; payload = push bytes + pull bytes\n",
      threads, chunk_kib, chunk_kib == 4096 ? ", the default" : "; default 4096", pull_chunk_kib,
      pull_chunk_kib == 1024 ? ", the default" : "; default 1024", std::max(1, warmup_steps),
      Fixed(seconds, 1));
  std::fflush(stdout);
}

absl::StatusOr<PushPullRow> RunPushPull(int mib, int threads, double seconds, int warmup_steps,
                                        ChunkSizes chunks) {
  PushPullRow row;
  row.mib = mib;
  row.elements = static_cast<uint64_t>(mib) * (kMiB / sizeof(float));
  const uint64_t n = row.elements;

  // First the standalone estimates, so their buffers are gone before the
  // server and client allocate theirs.
  if (absl::Status s = EstimateServerCompute(n, threads, std::max(0.05, 0.1 * seconds), row);
      !s.ok()) {
    return s;
  }

  std::fflush(stdout);
  absl::StatusOr<BenchJob> job =
      StartBenchJob(absl::StrCat("bench_", mib, "mib"), n, threads, chunks);
  if (!job.ok()) return job.status();
  TrainerClient& client = *job->client;
  std::vector<float>& params = job->params;
  const std::vector<float>& grads = job->grads;
  const float initial_param = params[1];

  int64_t step = 0;
  auto do_step = [&]() -> absl::StatusOr<double> {
    ++step;
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<StepResult> r = client.Step(step, grads, absl::MakeSpan(params));
    const double dt = Since(t0);
    if (!r.ok()) return r.status();
    if (r->version != step || !r->applied_here) {
      return absl::InternalError(absl::StrCat("step ", step, " came back as version ", r->version,
                                              " applied=", r->applied_here));
    }
    row.bytes_per_step = r->bytes_pushed + r->bytes_pulled;
    return dt;
  };

  double warm_s = 0;
  for (int i = 0; i < std::max(1, warmup_steps); ++i) {
    absl::StatusOr<double> dt = do_step();
    if (!dt.ok()) return dt.status();
    warm_s = *dt;
  }
  row.steps =
      static_cast<int>(std::clamp(std::ceil(seconds / std::max(warm_s, 1e-6)), 3.0, 100000.0));
  for (int i = 0; i < row.steps; ++i) {
    absl::StatusOr<double> dt = do_step();
    if (!dt.ok()) return dt.status();
    row.step_s.push_back(*dt);
  }
  if (row.bytes_per_step != 2 * sizeof(float) * n) {
    return absl::InternalError(absl::StrCat("a step moved ", row.bytes_per_step,
                                            " payload bytes, expected ", 2 * sizeof(float) * n));
  }

  // Breakdown pass: the same two calls Step makes, timed separately.
  row.split_steps = std::max(2, row.steps / 3);
  std::vector<double> push_s, pull_s;
  for (int i = 0; i < row.split_steps; ++i) {
    ++step;
    Clock::time_point t0 = Clock::now();
    absl::StatusOr<StepResult> pushed = client.Push(step, grads);
    push_s.push_back(Since(t0));
    if (!pushed.ok()) return pushed.status();
    t0 = Clock::now();
    absl::StatusOr<int64_t> version = client.Pull(step, absl::MakeSpan(params));
    pull_s.push_back(Since(t0));
    if (!version.ok()) return version.status();
    if (*version != step) return absl::InternalError("pull returned the wrong version");
  }
  row.push_s = Mean(push_s);
  row.pull_s = Mean(pull_s);
  if (params[1] == initial_param) {
    return absl::InternalError("the pulled parameters never changed");
  }

  job->client.reset();
  job->server->Shutdown(absl::Seconds(1));
  return row;
}

void PrintPushPullTables(const std::vector<PushPullRow>& rows, std::optional<double> tcp_best) {
  Table main_table({"push+pull", "elements", "steps", "step ms mean", "median", "min", "MB/step",
                    "payload GB/s", "vs raw TCP"});
  for (const PushPullRow& r : rows) {
    const double mean = Mean(r.step_s);
    const double gbps = r.bytes_per_step / mean / 1e9;
    main_table.AddRow({absl::StrCat(r.mib, " MiB"), absl::StrCat(r.elements), absl::StrCat(r.steps),
                       Fixed(mean * 1e3, 2), Fixed(Median(r.step_s) * 1e3, 2),
                       Fixed(Min(r.step_s) * 1e3, 2), Fixed(r.bytes_per_step / 1e6, 1),
                       Fixed(gbps, 3),
                       tcp_best ? absl::StrFormat("%.3fx", gbps / *tcp_best) : "n/a (no TCP)"});
  }
  main_table.Print();
  absl::PrintF(
      "\n  breakdown: Push and Pull timed separately (means over a second, shorter pass),\n"
      "  and server compute measured standalone (medians; same split as CpuBackend::Apply)\n");
  Table split({"push+pull", "steps", "push ms", "push GB/s", "pull ms", "pull GB/s",
               "sgd update ms", "stage+scan ms", "update % of step"});
  for (const PushPullRow& r : rows) {
    const double half = r.bytes_per_step / 2.0;
    split.AddRow({absl::StrCat(r.mib, " MiB"), absl::StrCat(r.split_steps),
                  Fixed(r.push_s * 1e3, 2), Fixed(half / r.push_s / 1e9, 3),
                  Fixed(r.pull_s * 1e3, 2), Fixed(half / r.pull_s / 1e9, 3),
                  Fixed(r.update_s * 1e3, 2), Fixed(r.scan_s * 1e3, 2),
                  Fixed(100.0 * r.update_s / Mean(r.step_s), 1)});
  }
  split.Print();
}

}  // namespace shardopt::bench
