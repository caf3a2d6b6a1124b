// shardopt_bench's server, client and model (bench_job.h).
#include "tools/bench/bench_job.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/layout.h"
#include "tools/bench/bench_util.h"

namespace shardopt::bench {

absl::StatusOr<BenchJob> StartBenchJob(const std::string& model_id, uint64_t elements, int threads,
                                       ChunkSizes chunks, DType push_dtype, DType pull_dtype,
                                       const StepShape& shape) {
  BenchJob job;
  ShardServerOptions server_options;
  server_options.shard_index = 0;
  server_options.shard_count = 1;
  server_options.threads = threads;
  server_options.pull_chunk_bytes = chunks.pull;
  server_options.pipeline_range_elements = shape.pipeline_range_elements;
  server_options.step_timeline = shape.step_timeline;
  absl::StatusOr<std::unique_ptr<ShardServer>> server =
      ShardServer::Start("127.0.0.1:0", server_options);
  if (!server.ok()) return server.status();
  job.server = std::move(*server);

  TrainerClientOptions client_options;
  client_options.trainer_rank = 0;
  client_options.chunk_bytes = chunks.push;
  client_options.push_dtype = push_dtype;
  client_options.pull_dtype = pull_dtype;
  client_options.overlap_pull = shape.overlap_pull;
  client_options.shared_memory = shape.shared_memory;
  client_options.socket_payloads = shape.socket_payloads;
  absl::StatusOr<std::unique_ptr<TrainerClient>> client = TrainerClient::Connect(
      {absl::StrCat("127.0.0.1:", job.server->port())}, client_options);
  if (!client.ok()) return client.status();
  job.client = std::move(*client);

  ModelSpec spec;
  spec.model_id = model_id;
  spec.tensors = {TensorSpec{"w", {static_cast<int64_t>(elements)}, DType::kFloat32}};
  spec.optimizer = shape.optimizer;
  spec.num_trainers = 1;
  absl::StatusOr<ModelLayout> layout = ModelLayout::Create(spec.tensors, spec.alignment, 1);
  if (!layout.ok()) return layout.status();
  job.params.resize(layout->total_elements());
  job.grads.resize(layout->total_elements());
  FillParams(job.params);
  FillGradients(job.grads);
  if (absl::Status s = job.client->Register(spec, job.params); !s.ok()) return s;
  return job;
}

absl::StatusOr<std::vector<double>> TimeSteps(TrainerClient& client, absl::Span<const float> grads,
                                              absl::Span<float> params, double seconds,
                                              int64_t* steps) {
  absl::Status failed;
  const auto one = [&] {
    const int64_t step = ++*steps;
    absl::StatusOr<StepResult> r = client.Step(step, grads, params);
    if (!r.ok() && failed.ok()) failed = r.status();
    if (r.ok() && r->version != step && failed.ok()) {
      failed = absl::InternalError(
          absl::StrCat("step ", step, " pulled version ", r->version, " instead of its own"));
    }
  };
  one();
  std::vector<double> times = TimeRepeated(seconds, 3, 1000, one);
  if (!failed.ok()) return failed;
  return times;
}

absl::Status CheckBenchSgdSteps(absl::Span<const float> params, int64_t steps) {
  const double lr = BenchSgd().lr;
  // Each step rounds once in fp32 (at most half an ulp of values below 1);
  // one step's update is lr * |g| >= 1e-7 where g != 0.
  const double tolerance = static_cast<double>(steps) * 0x1p-24 + 1e-7;
  const auto check = [&](size_t i) -> absl::Status {
    const double expected =
        static_cast<double>(ParamAt(i)) - static_cast<double>(steps) * lr * GradientAt(i);
    if (std::abs(params[i] - expected) > tolerance) {
      return absl::InternalError(absl::StrCat("after ", steps, " SGD steps parameter ", i, " is ",
                                              params[i], ", not ", expected));
    }
    return absl::OkStatus();
  };
  // A sample through the buffer, and both sides of every 64 KiB boundary
  // (where chunks and ranges end), the last element included.
  const size_t stride = std::max<size_t>(1, params.size() / 4096);
  for (size_t i = 0; i < params.size(); i += stride) {
    if (absl::Status s = check(i); !s.ok()) return s;
  }
  constexpr size_t kBoundary = (64 << 10) / sizeof(float);
  for (size_t end = kBoundary; end < params.size() + kBoundary; end += kBoundary) {
    const size_t last = std::min(end, params.size()) - 1;
    if (absl::Status s = check(last); !s.ok()) return s;
    if (last + 1 < params.size()) {
      if (absl::Status s = check(last + 1); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace shardopt::bench
