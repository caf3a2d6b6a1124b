// What sections (b) and (d) of shardopt_bench time against: an in-process
// ShardServer on 127.0.0.1:0 (1 shard), a TrainerClient (rank 0 of 1), and a
// model of one fp32 tensor of `elements` with plain SGD (BenchSgd), registered
// with FillParams' values; the gradients are FillGradients'. StepShape picks
// other optimizers and turns pipelining off.
#ifndef SHARDOPT_TOOLS_BENCH_BENCH_JOB_H_
#define SHARDOPT_TOOLS_BENCH_BENCH_JOB_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/trainer_client.h"
#include "common/dtype.h"
#include "server/shard_server.h"
#include "tools/bench/workload.h"

namespace shardopt::bench {

struct BenchJob {
  // (Declared first: the client goes before the server it talks to.)
  std::unique_ptr<ShardServer> server;
  std::unique_ptr<TrainerClient> client;
  std::vector<float> params, grads;
};

// How a job's steps run (section (e) compares them); the defaults are the
// daemon's and the client's.
struct StepShape {
  uint64_t pipeline_range_elements = ShardServerOptions().pipeline_range_elements;
  bool overlap_pull = TrainerClientOptions().overlap_pull;
  OptimizerConfig optimizer = BenchSgd();
  bool step_timeline = false;  // The server's --step_timeline.
  // Payloads through shared memory (TrainerClientOptions::shared_memory).
  // Off for the sections that measure the gRPC path; section (f) compares.
  bool shared_memory = false;
  // Payloads over the payload socket (TrainerClientOptions::socket_payloads):
  // likewise off but in section (f).
  bool socket_payloads = false;
};

absl::StatusOr<BenchJob> StartBenchJob(const std::string& model_id, uint64_t elements, int threads,
                                       ChunkSizes chunks, DType push_dtype = DType::kFloat32,
                                       DType pull_dtype = DType::kFloat32,
                                       const StepShape& shape = StepShape());

// Seconds per Step of `client` from `grads` into `params`, steps numbered
// on from `*steps` (which counts them): one untimed warm-up step, then
// steps for about `seconds` (3 at least); the first failure, if any (a step
// that did not pull its own version is one).
absl::StatusOr<std::vector<double>> TimeSteps(TrainerClient& client, absl::Span<const float> grads,
                                              absl::Span<float> params, double seconds,
                                              int64_t* steps);

// That `params` (every element, or a sample of a large buffer) is what
// `steps` steps of BenchSgd from FillParams with FillGradients give, to
// fp32 rounding: a data plane that skipped the update or the write-back
// cannot look fast. INTERNAL naming the first element that is not.
absl::Status CheckBenchSgdSteps(absl::Span<const float> params, int64_t steps);

}  // namespace shardopt::bench

#endif  // SHARDOPT_TOOLS_BENCH_BENCH_JOB_H_
