// Two trainers that would wait for each other across shards after a shard
// came back from an older checkpoint: trainer 1's step k is in on every
// shard and its pull of shard B already done (B applied k), while its pull
// of shard A waits for trainer 0's push of k; then B restarts from a
// checkpoint without k, and trainer 0, recovering B, waits for trainer 1 to
// push again there. The pull's wait reports look at every shard, find that
// B lost trainer 1's push, and trainer 1 recovers B itself instead of
// waiting on A for ever; the step then completes on both trainers, once.
#include <signal.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/time/clock.h"
#include "client/trainer_client.h"
#include "common/proto_convert.h"
#include "gtest/gtest.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "tests/support/process.h"
#include "tests/support/raw_calls.h"
#include "tests/support/shard_queries.h"
#include "tests/support/synthetic.h"

namespace shardopt::testing {
namespace {

TEST(CrossShardRecoveryTest, APullWaitingOnOneShardNoticesAnotherLostItsPush) {
  const std::string ckpt = MakeTempDir("cross_ckpt");
  // Only the registration's checkpoint (step 0): a restart loses every step.
  const std::vector<std::string> flags = CrashRecoveryFlags(ckpt, 1000);
  auto servers = StartCluster(2, flags);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::vector<std::string> addresses = Addresses(*servers);
  TrainerClientOptions options;
  options.rpc_timeout = absl::Seconds(20);
  options.retry_budget = absl::Seconds(60);
  options.replay_steps = 8;
  options.wait_report_interval = absl::Milliseconds(300);
  options.shared_memory = false;
  TrainerClientOptions options1 = options;
  options1.trainer_rank = 1;
  auto rank0 = TrainerClient::Connect(addresses, options).value();
  auto rank1 = TrainerClient::Connect(addresses, options1).value();
  const ModelSpec spec = SyntheticModelSpec("cross", OptimizerConfig::Sgd(0.1), 2);
  const ModelLayout layout = rank0->LayoutFor(spec).value();
  std::vector<float> params0 = SyntheticInitialParams(layout, 3), params1 = params0;
  ASSERT_TRUE(rank0->Register(spec, params0).ok());
  ASSERT_TRUE(rank1->Attach(spec).ok());
  const std::vector<float> grad = ConstantGradient(layout, 0.25f);
  std::thread first([&] { EXPECT_TRUE(rank1->Step(1, grad, absl::MakeSpan(params1)).ok()); });
  ASSERT_TRUE(rank0->Step(1, grad, absl::MakeSpan(params0)).ok());
  first.join();

  // Trainer 1's step 2 everywhere; it then waits for trainer 0.
  absl::StatusOr<StepResult> step2_of_rank1 = absl::UnknownError("not run");
  std::thread second([&] { step2_of_rank1 = rank1->Step(2, grad, absl::MakeSpan(params1)); });
  // (A failed assertion below still waits for it: it ends with its budget.)
  absl::Cleanup join_second = [&] {
    if (second.joinable()) second.join();
  };
  const auto pushed_by_rank1 = [&](const std::string& address, int64_t step) {
    const v1::InspectResponse info = InspectOf(address, "cross");
    return info.trainers_size() == 2 && info.trainers(1).last_pushed_step() >= step;
  };
  absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (!(pushed_by_rank1(addresses[0], 2) && pushed_by_rank1(addresses[1], 2))) {
    ASSERT_LT(absl::Now(), give_up) << "trainer 1 did not push step 2";
    absl::SleepFor(absl::Milliseconds(20));
  }
  // Trainer 0's step 2 on shard 1 alone (by hand): shard 1 applies it, and
  // trainer 1's pull of shard 1 is done; its pull of shard 0 waits.
  const FlatRange range1 = layout.ShardRange(1);
  v1::PushHeader header;
  header.set_model_id("cross");
  header.set_trainer_rank(0);
  header.set_step(2);
  header.set_shard_index(1);
  header.set_num_elements(range1.size());
  v1::PushGradientsResponse response;
  ASSERT_TRUE(RawPush(*NewStub(addresses[1]), &header,
                      {{0, FloatBytes(grad.data() + range1.begin, range1.size())}}, &response)
                  .ok());
  ASSERT_EQ(response.outcome(), v1::PushGradientsResponse::OUTCOME_APPLIED);
  absl::SleepFor(absl::Milliseconds(500));  // (Trainer 1's pull of shard 1 ends.)

  // Shard 1 comes back from step 0: it lost both trainers' steps 1 and 2.
  (*servers)[1]->process().Signal(SIGKILL);
  ASSERT_TRUE((*servers)[1]->process().Wait(absl::Seconds(10)).has_value());
  auto restarted = StartServerAt(addresses[1], 1, 2, flags);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  (*servers)[1] = std::move(*restarted);
  ASSERT_EQ(InspectOf(addresses[1], "cross").version(), 0);

  // Trainer 1, waiting on shard 0, finds out and re-pushes what shard 1
  // lost (step 1 first) without trainer 0 having done anything.
  give_up = absl::Now() + absl::Seconds(15);
  while (!pushed_by_rank1(addresses[1], 1)) {
    ASSERT_LT(absl::Now(), give_up)
        << "trainer 1 kept waiting on shard 0 and never re-pushed to shard 1";
    absl::SleepFor(absl::Milliseconds(50));
  }
  // Trainer 0 recovers shard 1 too; both steps complete, each applied once.
  ASSERT_TRUE(rank0->Step(2, grad, absl::MakeSpan(params0)).ok());
  std::move(join_second).Invoke();
  ASSERT_TRUE(step2_of_rank1.ok()) << step2_of_rank1.status();
  EXPECT_EQ(InspectOf(addresses[0], "cross").version(), 2);
  EXPECT_EQ(InspectOf(addresses[1], "cross").version(), 2);
  EXPECT_EQ(params0, params1);
  // p - 0.1 * 0.25 twice, on tensor elements (padding stays 0).
  std::vector<float> expected = SyntheticInitialParams(layout, 3);
  for (size_t i = 0; i < expected.size(); ++i) {
    if (grad[i] != 0) expected[i] = (expected[i] - 0.1f * 0.25f) - 0.1f * 0.25f;
  }
  EXPECT_EQ(params0, expected);
}

// With gradient control, Push() then Pull() when a shard restarted in
// between without the push: the pull's decision finds the push lost
// (OUT_OF_RANGE), the pull recovers that shard (re-pushing from the
// history) and takes the decision again; the step completes once.
TEST(CrossShardRecoveryTest, PushThenPullRecoversAShardThatRestartedInBetween) {
  const std::string ckpt = MakeTempDir("push_pull_ckpt");
  const std::vector<std::string> flags = CrashRecoveryFlags(ckpt, 1000);
  auto servers = StartCluster(2, flags);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::vector<std::string> addresses = Addresses(*servers);
  TrainerClientOptions options;
  options.rpc_timeout = absl::Seconds(20);
  options.retry_budget = absl::Seconds(30);
  options.replay_steps = 8;
  auto trainer = TrainerClient::Connect(addresses, options).value();
  ModelSpec spec = SyntheticModelSpec("push_pull", OptimizerConfig::Sgd(0.1), 1);
  spec.max_grad_norm = 1e6;  // A decision every step (that never clips).
  const ModelLayout layout = trainer->LayoutFor(spec).value();
  std::vector<float> params = SyntheticInitialParams(layout, 3);
  ASSERT_TRUE(trainer->Register(spec, params).ok());
  const std::vector<float> grad = ConstantGradient(layout, 0.25f);
  ASSERT_TRUE(trainer->Push(1, grad).ok());

  (*servers)[1]->process().Signal(SIGKILL);
  ASSERT_TRUE((*servers)[1]->process().Wait(absl::Seconds(10)).has_value());
  auto restarted = StartServerAt(addresses[1], 1, 2, flags);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  (*servers)[1] = std::move(*restarted);

  const absl::StatusOr<int64_t> pulled = trainer->Pull(1, absl::MakeSpan(params));
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(*pulled, 1);
  EXPECT_EQ(InspectOf(addresses[0], "push_pull").version(), 1);
  EXPECT_EQ(InspectOf(addresses[1], "push_pull").version(), 1);
  std::vector<float> expected = SyntheticInitialParams(layout, 3);
  for (size_t i = 0; i < expected.size(); ++i) {
    if (grad[i] != 0) expected[i] -= 0.1f * 0.25f;
  }
  EXPECT_EQ(params, expected);
}

}  // namespace
}  // namespace shardopt::testing
