#include "common/consistency.h"

#include "gtest/gtest.h"

namespace shardopt {
namespace {

TEST(ConsistencyTest, NamesGoBothWays) {
  for (Consistency c : {Consistency::kSync, Consistency::kAsync, Consistency::kBounded}) {
    absl::StatusOr<Consistency> back = ConsistencyFromName(ConsistencyName(c));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, c);
  }
  EXPECT_EQ(ConsistencyFromName("Async").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ConsistencyFromName("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ConsistencyTest, StalenessGoesOnlyWithBounded) {
  EXPECT_TRUE(CheckConsistency(Consistency::kSync, 0).ok());
  EXPECT_TRUE(CheckConsistency(Consistency::kAsync, 0).ok());
  EXPECT_TRUE(CheckConsistency(Consistency::kBounded, 1).ok());
  EXPECT_TRUE(CheckConsistency(Consistency::kBounded, 4).ok());
  absl::Status s = CheckConsistency(Consistency::kBounded, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("at least 1"), absl::string_view::npos) << s;
  EXPECT_EQ(CheckConsistency(Consistency::kBounded, -2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckConsistency(Consistency::kAsync, 3).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckConsistency(Consistency::kSync, 1).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ConsistencyTest, ShardsDecideOnlySynchronousStepsWithGradientControl) {
  EXPECT_TRUE(ShardsDecideSteps(Consistency::kSync, 1.0, false));
  EXPECT_TRUE(ShardsDecideSteps(Consistency::kSync, 0, true));
  EXPECT_FALSE(ShardsDecideSteps(Consistency::kSync, 0, false));
  // The trainer's own in the asynchronous modes.
  EXPECT_FALSE(ShardsDecideSteps(Consistency::kAsync, 1.0, true));
  EXPECT_FALSE(ShardsDecideSteps(Consistency::kBounded, 0.5, false));
}

}  // namespace
}  // namespace shardopt
