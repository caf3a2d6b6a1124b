// HostedModel's view of its periodic checkpoints: what a rollback abandons
// leaves the list (and so the recovery floor sent with every push) at once.
// And the steps this server applied to a model, which /metrics counts.
#include "server/hosted_model.h"

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/checkpoint_testing.h"
#include "common/proto_convert.h"
#include "gtest/gtest.h"
#include "server/model_shard_testing.h"

namespace shardopt {
namespace {

using checkpoint_testing::Config;
using checkpoint_testing::TempDir;
using checkpoint_testing::WritePart;

TEST(HostedModelTest, AbandonedCheckpointsLeaveTheListAndTheRecoveryFloorAtOnce) {
  const std::string root = TempDir("hosted_abandon");
  for (int64_t step : {4, 8, 12}) {
    for (uint32_t i = 0; i < 2; ++i) {
      ASSERT_TRUE(WritePart(JoinPath(root, CheckpointStepDirName(step)), Config(2), i, step).ok());
    }
  }
  ThreadPool pool(1);
  StateBudget budget(uint64_t{1} << 30, 0);
  PeriodicCheckpointOptions checkpoints;
  checkpoints.model_root = root;  // every = 0: no saving thread.
  HostedModel model(v1::ModelConfig(), testing::MakeShard(&pool, 1),
                    budget.Reserve("m", 1).value(), checkpoints);
  EXPECT_EQ(model.committed_checkpoints(), (std::vector<int64_t>{12, 8, 4}));
  EXPECT_EQ(model.recovery_floor(), 8);
  ASSERT_TRUE(model.AbandonCheckpointsAfter(4).ok());
  EXPECT_EQ(model.committed_checkpoints(), (std::vector<int64_t>{4}));
  EXPECT_EQ(model.recovery_floor(), 4);
  // Set aside, not removed.
  int abandoned = 0;
  const std::vector<std::string> names = FileEnv::Default()->ListDirectory(root).value();
  for (const std::string& name : names) {
    abandoned += absl::StartsWith(name, ".abandoned.step-");
  }
  EXPECT_EQ(abandoned, 2);
}

// A model made from a shard that had applied steps already (restored) counts
// from zero; one that replaces another (a rollback to an older state) goes
// on from what the other applied: the count never goes down.
TEST(HostedModelTest, AppliedStepsCountWhatThisServerAppliedAcrossReplacements) {
  ThreadPool pool(1);
  StateBudget budget(uint64_t{1} << 30, 0);
  const auto snapshot = [](HostedModel& m) {
    return m.shard().Snapshot("", 0, 0, /*with_tensor_stats=*/false).value();
  };
  std::unique_ptr<ModelShard> restored = testing::MakeShard(&pool, 1);
  for (int64_t step = 1; step <= 2; ++step) ASSERT_TRUE(testing::PushAll(*restored, 0, step).ok());
  HostedModel first(v1::ModelConfig(), std::move(restored), budget.Reserve("a", 1).value(),
                    PeriodicCheckpointOptions());
  EXPECT_EQ(first.AppliedHere(snapshot(first)).applied, 0);
  for (int64_t step = 3; step <= 5; ++step) {
    ASSERT_TRUE(testing::PushAll(first.shard(), 0, step).ok());
  }
  EXPECT_EQ(snapshot(first).optimizer_steps, 5);
  EXPECT_EQ(first.AppliedHere(snapshot(first)).applied, 3);
  // Replaced by a model at an older state (optimizer steps 0).
  HostedModel second(v1::ModelConfig(), testing::MakeShard(&pool, 1),
                     budget.Reserve("b", 1).value(), PeriodicCheckpointOptions());
  second.TakeOverAppliedSteps(first);
  EXPECT_EQ(second.AppliedHere(snapshot(second)).applied, 3);
  ASSERT_TRUE(testing::PushAll(second.shard(), 0, 1).ok());
  EXPECT_EQ(second.AppliedHere(snapshot(second)).applied, 4);
  EXPECT_EQ(second.AppliedHere(snapshot(second)).skipped, 0);
}

// The configuration of testing::MakeShard's shard (its checkpoints' manifest).
v1::ModelConfig ShardConfig() {
  v1::ModelConfig config;
  config.set_model_id("m");
  *config.mutable_layout() = LayoutToProto(testing::TestLayout());
  *config.mutable_optimizer() = OptimizerConfigToProto(OptimizerConfig::AdamW(0.01));
  config.set_num_trainers(1);
  config.set_shard_count(testing::kShards);
  return config;
}

// The first checkpoint's step is held from the model's making, not from
// when the saving thread first runs: the pushes that come at once (a
// restored shard's trainers catching up) cannot pass it first, which made
// the shard skip that checkpoint (asynchronous: its cut then never
// committed, the other shards' parts waiting alone).
TEST(HostedModelTest, TheFirstCheckpointIsHeldFromTheModelsMaking) {
  for (int round = 0; round < 3; ++round) {
    const std::string root = TempDir(absl::StrCat("hosted_first_hold", round));
    ThreadPool pool(1);
    StateBudget budget(uint64_t{1} << 30, 0);
    PeriodicCheckpointOptions checkpoints;
    checkpoints.model_root = root;
    checkpoints.every = 2;
    HostedModel model(ShardConfig(), testing::MakeShard(&pool, 1), budget.Reserve("m", 1).value(),
                      checkpoints);
    // Pushes from before the saving thread starts (a trainer that finds the
    // model at once) wait at the first checkpoint's step.
    std::thread pushing([&] {
      for (int64_t step = 1; step <= 2; ++step) {
        EXPECT_TRUE(testing::PushAll(model.shard(), 0, step).ok());
      }
    });
    absl::SleepFor(absl::Milliseconds(20));
    model.StartCheckpoints();
    pushing.join();
    testing::ReadAll(model.shard(), 2);
    // (Step 1 waited for checkpoint 0's part, written under its hold.)
    const std::string step0 = JoinPath(root, CheckpointStepDirName(0));
    const absl::StatusOr<std::vector<std::string>> names = FileEnv::Default()->ListDirectory(step0);
    const std::string record = CheckpointPartRecordName(testing::kShard, testing::kShards);
    EXPECT_TRUE(names.ok() && std::find(names->begin(), names->end(), record) != names->end())
        << "round " << round << ": no checkpoint of step 0 in " << step0;
    model.Stop();
  }
}

}  // namespace
}  // namespace shardopt
