// The checkpoint catalog: listing committed checkpoints, falling back past a
// damaged newest one (set aside, never loaded), the recovery floor, and what
// a rollback sets aside.
#include "common/checkpoint_catalog.h"

#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/checkpoint_testing.h"
#include "gtest/gtest.h"

namespace shardopt {
namespace {

using checkpoint_testing::Config;
using checkpoint_testing::FlipByte;
using checkpoint_testing::TempDir;
using checkpoint_testing::WritePart;

// Committed checkpoints of 2 parts at `steps` in `root` (and a torn one at
// `torn`, if not 0).
void WriteSteps(const std::string& root, const std::vector<int64_t>& steps, int64_t torn = 0) {
  const v1::ModelConfig config = Config(2);
  for (int64_t step : steps) {
    const std::string dir = JoinPath(root, CheckpointStepDirName(step));
    for (uint32_t i = 0; i < (step == torn ? 1u : 2u); ++i) {
      ASSERT_TRUE(WritePart(dir, config, i, step).ok());
    }
  }
}

std::vector<std::string> Names(const std::string& dir) {
  return FileEnv::Default()->ListDirectory(dir).value_or(std::vector<std::string>());
}

bool HasNameStartingWith(const std::string& dir, const std::string& prefix) {
  for (const std::string& n : Names(dir)) {
    if (absl::StartsWith(n, prefix)) return true;
  }
  return false;
}

TEST(CheckpointCatalogTest, ListsCommittedNewestFirstAndGivesTheFloor) {
  const std::string root = TempDir("catalog_list");
  EXPECT_TRUE(ListCommittedCheckpoints(root).value().empty());  // No root yet.
  WriteSteps(root, {4, 8, 12, 16}, /*torn=*/16);
  const std::vector<CommittedCheckpoint> c = ListCommittedCheckpoints(root).value();
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].step, 12);
  EXPECT_EQ(c[2].step, 4);
  EXPECT_EQ(c[0].directory, JoinPath(root, CheckpointStepDirName(12)));
  EXPECT_EQ(RecoveryFloor(c), 8);  // The fallback of the newest.
  EXPECT_EQ(RecoveryFloor({c[2]}), 4);
  EXPECT_EQ(RecoveryFloor({}), 0);
}

TEST(CheckpointCatalogTest, ADamagedNewestIsSetAsideAndTheOneBeforeIsUsed) {
  const std::string root = TempDir("catalog_damaged");
  WriteSteps(root, {4, 8});
  // A flipped byte in one data block of one part of step 8.
  const std::string newest = JoinPath(root, CheckpointStepDirName(8));
  FlipByte(JoinPath(newest, CheckpointDataFileName(1, 2)), kCheckpointHeaderBytes + 100);
  // Opening (sizes, headers) does not see it; full verification does.
  ASSERT_TRUE(CheckpointReader::Open(newest).ok());
  const absl::Status bad = OpenVerifiedCheckpoint(newest).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(bad.message(), "fails its checksum")) << bad;
  std::vector<std::string> reported;
  absl::StatusOr<std::unique_ptr<CheckpointReader>> chosen = OpenNewestVerifiedCheckpoint(
      root, [&](const std::string& dir, const absl::Status& why) {
        reported.push_back(absl::StrCat(dir, ": ", why.message()));
      });
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_EQ((*chosen)->step(), 4);
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_TRUE(absl::StrContains(reported[0], CheckpointDataFileName(1, 2))) << reported[0];
  // Set aside: gone from the step namespace, kept for a look.
  EXPECT_FALSE(FileExists(FileEnv::Default(), newest));
  EXPECT_TRUE(HasNameStartingWith(root, ".damaged.step-00000008."));
  EXPECT_EQ(ListCommittedCheckpoints(root).value().size(), 1u);
  // Setting aside what is gone already is fine (another shard did it).
  EXPECT_TRUE(SetAsideCheckpoint(newest, "damaged").ok());
}

TEST(CheckpointCatalogTest, WhenNoneVerifiesTheErrorNamesEachOne) {
  const std::string root = TempDir("catalog_none");
  WriteSteps(root, {4, 8});
  for (int64_t step : {4, 8}) {
    FlipByte(JoinPath(JoinPath(root, CheckpointStepDirName(step)), CheckpointDataFileName(0, 2)),
             kCheckpointHeaderBytes + 4);
  }
  const absl::Status none = OpenNewestVerifiedCheckpoint(root, nullptr).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(none.message(), CheckpointStepDirName(8))) << none;
  EXPECT_TRUE(absl::StrContains(none.message(), CheckpointStepDirName(4))) << none;
  EXPECT_EQ(OpenNewestVerifiedCheckpoint(TempDir("catalog_empty"), nullptr).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(CheckpointCatalogTest, ARollbackSetsAsideEveryLaterStepTornOnesToo) {
  const std::string root = TempDir("catalog_rollback");
  WriteSteps(root, {4, 8, 12, 16}, /*torn=*/16);
  ASSERT_TRUE(SetAsideCheckpointsAfter(root, 8, "abandoned").ok());
  const std::vector<CommittedCheckpoint> c = ListCommittedCheckpoints(root).value();
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].step, 8);
  EXPECT_TRUE(HasNameStartingWith(root, ".abandoned.step-00000012."));
  EXPECT_TRUE(HasNameStartingWith(root, ".abandoned.step-00000016."));
  EXPECT_TRUE(SetAsideCheckpointsAfter(TempDir("catalog_absent"), 0, "abandoned").ok());
}

// A restart still naming the checkpoint the job went back to: refused once
// the new timeline has committed a later step, not while its only later
// step is a save that never finished (nothing of the new timeline is lost).
TEST(CheckpointCatalogTest, GoingBackAgainIsRefusedOnlyOverACommittedLaterStep) {
  const std::string root = TempDir("catalog_going_back");
  WriteSteps(root, {4, 8});
  EXPECT_EQ(CheckGoingBack(root, 4).value(), 8);
  ASSERT_TRUE(SetAsideCheckpointsAfter(root, 4, "abandoned").ok());
  ASSERT_TRUE(RecordGoingBack(root, 4).ok());
  EXPECT_EQ(CheckGoingBack(root, 4).value(), -1);

  WriteSteps(root, {6}, /*torn=*/6);  // The new timeline stopped saving step 6.
  EXPECT_EQ(CheckGoingBack(root, 4).value(), 6);
  ASSERT_TRUE(SetAsideCheckpointsAfter(root, 4, "abandoned").ok());

  WriteSteps(root, {6});  // It saved step 6 this time.
  const absl::Status refused = CheckGoingBack(root, 4).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "has saved step 6")) << refused;
  EXPECT_EQ(CheckGoingBack(root, 6).value(), -1);  // Going back to its own step 6.
}

}  // namespace
}  // namespace shardopt
