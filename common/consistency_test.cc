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
  EXPECT_TRUE(CheckConsistency(Consistency::kSync, 0, 0, false).ok());
  EXPECT_TRUE(CheckConsistency(Consistency::kAsync, 0, 0, false).ok());
  EXPECT_TRUE(CheckConsistency(Consistency::kBounded, 1, 0, false).ok());
  EXPECT_TRUE(CheckConsistency(Consistency::kBounded, 4, 0, false).ok());
  absl::Status s = CheckConsistency(Consistency::kBounded, 0, 0, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("at least 1"), absl::string_view::npos) << s;
  EXPECT_EQ(CheckConsistency(Consistency::kBounded, -2, 0, false).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckConsistency(Consistency::kAsync, 3, 0, false).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckConsistency(Consistency::kSync, 1, 0, false).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ConsistencyTest, GradientControlIsSynchronousOnly) {
  EXPECT_TRUE(CheckConsistency(Consistency::kSync, 0, 1.0, true).ok());
  absl::Status clip = CheckConsistency(Consistency::kAsync, 0, 1.0, false);
  EXPECT_EQ(clip.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(clip.message().find("in the trainer"), absl::string_view::npos) << clip;
  EXPECT_EQ(CheckConsistency(Consistency::kBounded, 2, 0, true).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardopt
