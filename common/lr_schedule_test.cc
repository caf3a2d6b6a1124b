#include "common/lr_schedule.h"

#include <cmath>

#include "gtest/gtest.h"

namespace shardopt {
namespace {

TEST(LrScheduleTest, Constant) {
  LrSchedule s;
  EXPECT_DOUBLE_EQ(s.LearningRate(0.1, 1), 0.1);
  EXPECT_DOUBLE_EQ(s.LearningRate(0.1, 1000000), 0.1);
}

TEST(LrScheduleTest, LinearAndLogWarmup) {
  LrSchedule s;
  s.kind = LrSchedule::Kind::kWarmup;
  s.warmup_steps = 4;
  s.warmup_start_lr = 0.0;
  EXPECT_DOUBLE_EQ(s.LearningRate(1.0, 1), 0.0);   // i = 0
  EXPECT_DOUBLE_EQ(s.LearningRate(1.0, 2), 0.25);  // i = 1
  EXPECT_DOUBLE_EQ(s.LearningRate(1.0, 4), 0.75);
  EXPECT_DOUBLE_EQ(s.LearningRate(1.0, 5), 1.0);  // warmup over
  EXPECT_DOUBLE_EQ(s.LearningRate(1.0, 99), 1.0);
  s.warmup_type = LrSchedule::WarmupType::kLog;
  s.warmup_start_lr = 0.5;
  EXPECT_DOUBLE_EQ(s.LearningRate(1.0, 1), 0.5);
  EXPECT_DOUBLE_EQ(s.LearningRate(1.0, 2), 0.5 + 0.5 * std::log(2.0) / std::log(4.0));
  EXPECT_DOUBLE_EQ(s.LearningRate(1.0, 5), 1.0);
}

TEST(LrScheduleTest, WarmupThenLinearDecay) {
  LrSchedule s;
  s.kind = LrSchedule::Kind::kWarmupLinearDecay;
  s.warmup_steps = 10;
  s.total_steps = 110;
  EXPECT_DOUBLE_EQ(s.LearningRate(2.0, 6), 1.0);    // i = 5: half way up
  EXPECT_DOUBLE_EQ(s.LearningRate(2.0, 11), 2.0);   // i = 10: peak
  EXPECT_DOUBLE_EQ(s.LearningRate(2.0, 61), 1.0);   // i = 60: half way down
  EXPECT_DOUBLE_EQ(s.LearningRate(2.0, 111), 0.0);  // i = 110: the end
  EXPECT_DOUBLE_EQ(s.LearningRate(2.0, 500), 0.0);  // stays there
}

TEST(LrScheduleTest, WarmupThenCosine) {
  LrSchedule s;
  s.kind = LrSchedule::Kind::kWarmupCosine;
  s.warmup_steps = 0;
  s.total_steps = 100;
  s.min_lr = 0.1;
  EXPECT_DOUBLE_EQ(s.LearningRate(1.1, 1), 1.1);
  EXPECT_NEAR(s.LearningRate(1.1, 51), 0.6, 1e-15);  // cos(pi/2) = 0
  EXPECT_DOUBLE_EQ(s.LearningRate(1.1, 101), 0.1);
  EXPECT_DOUBLE_EQ(s.LearningRate(1.1, 1000), 0.1);
}

TEST(LrScheduleTest, Validation) {
  LrSchedule s;
  EXPECT_TRUE(s.Validate().ok());
  s.kind = LrSchedule::Kind::kWarmupCosine;
  s.warmup_steps = 10;
  s.total_steps = 10;
  EXPECT_EQ(s.Validate().code(), absl::StatusCode::kInvalidArgument);
  s.total_steps = 11;
  EXPECT_TRUE(s.Validate().ok());
  s.warmup_start_lr = -1;
  EXPECT_EQ(s.Validate().code(), absl::StatusCode::kInvalidArgument);
  s = LrSchedule();
  s.kind = LrSchedule::Kind::kWarmup;
  s.warmup_type = LrSchedule::WarmupType::kLog;
  s.warmup_steps = 1;
  EXPECT_EQ(s.Validate().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardopt
