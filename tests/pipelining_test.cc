// Pipelined steps seen from outside, through real shard processes with
// --step_timeline: with overlap_pull the trainer's pull reads the first
// ranges of a step before its last range has even arrived (push, update and
// pull overlap); without it, every range is pulled after every range
// arrived. The parameters are the same bits either way, and the same as a
// cluster that runs whole steps (--pipeline_range_elements=0). Ordering of
// recorded events only, no timing thresholds.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/trainer_client.h"
#include "gtest/gtest.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "tests/support/process.h"
#include "tests/support/raw_calls.h"

namespace shardopt::testing {
namespace {

constexpr int64_t kElements = 3 << 20;  // 12 MiB: 24 ranges of 64Ki on each of 2 shards.
constexpr int kSteps = 6;

struct TrainingRun {
  std::vector<float> params;
  std::vector<v1::StepTimeline> timelines;  // Per shard, after the last step.
};

TrainingRun Train(bool overlap_pull, const std::vector<std::string>& flags) {
  TrainingRun run;
  absl::StatusOr<std::vector<std::unique_ptr<ServerProcess>>> servers = StartCluster(2, flags);
  EXPECT_TRUE(servers.ok()) << servers.status();
  if (!servers.ok()) return run;
  TrainerClientOptions options;
  options.overlap_pull = overlap_pull;
  options.chunk_bytes = 1 << 20;
  std::unique_ptr<TrainerClient> client =
      TrainerClient::Connect(Addresses(*servers), options).value();
  ModelSpec spec;
  spec.model_id = "pipe";
  spec.tensors = {TensorSpec{"w", {kElements}, DType::kFloat32}};
  spec.optimizer = OptimizerConfig::Adam(0.01);
  spec.num_trainers = 1;
  run.params.assign(kElements, 0.5f);
  EXPECT_TRUE(client->Register(spec, run.params).ok());
  std::vector<float> grad(kElements);
  for (int64_t step = 1; step <= kSteps; ++step) {
    for (int64_t i = 0; i < kElements; ++i) {
      grad[i] = static_cast<float>((i * 7 + step * 13) % 101 - 50) / 64.0f;
    }
    absl::StatusOr<StepResult> r = client->Step(step, grad, absl::MakeSpan(run.params));
    EXPECT_TRUE(r.ok()) << r.status();
  }
  for (const auto& server : *servers) {
    v1::InspectResponse inspect;
    EXPECT_TRUE(RawInspect(*NewStub(server->address()), "pipe", &inspect).ok());
    run.timelines.push_back(inspect.step_timeline());
  }
  return run;
}

TEST(PipeliningTest, PullsOverlapThePushOnlyWithOverlapPullAndTheBitsDoNotChange) {
  const std::vector<std::string> flags = {"--step_timeline", "--pipeline_range_elements=65536"};
  const TrainingRun overlapped = Train(true, flags);
  const TrainingRun sequential = Train(false, flags);
  const TrainingRun whole = Train(true, {"--pipeline_range_elements=0"});
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(overlapped.params, whole.params);
  EXPECT_EQ(sequential.params, whole.params);

  bool overlap_seen = false;
  for (size_t shard = 0; shard < 2; ++shard) {
    for (const TrainingRun* run : {&overlapped, &sequential}) {
      const v1::StepTimeline& t = run->timelines[shard];
      EXPECT_EQ(t.step(), kSteps) << "shard " << shard;
      ASSERT_EQ(t.ranges_size(), 24) << "shard " << shard;
      double last_arrival = -1;
      for (const v1::RangeTimeline& r : t.ranges()) {
        // Each range: arrived, then updated, then pulled.
        EXPECT_GE(r.arrived_ms(), 0);
        EXPECT_GE(r.updated_ms(), r.arrived_ms());
        EXPECT_GE(r.pulled_ms(), r.updated_ms());
        last_arrival = std::max(last_arrival, r.arrived_ms());
      }
      EXPECT_GE(t.last_push_committed_ms(), last_arrival);
      const double first_pull = t.ranges(0).pulled_ms();
      if (run == &sequential) {
        // The pull opens once the push returned: after every arrival.
        EXPECT_GT(first_pull, last_arrival) << "shard " << shard;
      } else if (first_pull < last_arrival) {
        overlap_seen = true;
      }
    }
  }
  // (On each of 2 shards the first of 24 ranges is updated while 23 still
  // stream in; the trainer's open pull reads it at once.)
  EXPECT_TRUE(overlap_seen);
}

}  // namespace
}  // namespace shardopt::testing
