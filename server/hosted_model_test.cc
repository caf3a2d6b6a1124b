// HostedModel's view of its periodic checkpoints: what a rollback abandons
// leaves the list (and so the recovery floor sent with every push) at once.
#include "server/hosted_model.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/checkpoint_testing.h"
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

}  // namespace
}  // namespace shardopt
