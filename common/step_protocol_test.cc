// The shared step rules: decisions from statistics, their check, loss
// scales, step positions.
#include "common/step_protocol.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace shardopt {
namespace {

TEST(StepProtocolTest, ClipCoefficientIsTorchsAndCappedAtOne) {
  EXPECT_EQ(ClipCoefficient(0, 123.0), 1.0);     // No clipping.
  EXPECT_EQ(ClipCoefficient(10.0, 5.0), 1.0);    // Below the max.
  EXPECT_EQ(ClipCoefficient(1.0, 4.0), 1.0 / (4.0 + 1e-6));
}

TEST(StepProtocolTest, DecisionSumsInShardOrderAndSkipsOnOverflow) {
  const std::vector<StepStats> stats = {{3, 9.0, false, 1}, {3, 16.0, false, 1}};
  StepDecision d = DecideStep(stats, 1.0);
  EXPECT_FALSE(d.skip);
  EXPECT_EQ(d.grad_norm, 5.0);
  EXPECT_EQ(d.clip_coef, 1.0 / (5.0 + 1e-6));
  EXPECT_TRUE(CheckDecision(d, 1.0).ok());
  // Unclipped: coefficient 1 whatever the norm.
  EXPECT_EQ(DecideStep(stats, 0).clip_coef, 1.0);

  const std::vector<StepStats> inf = {{3, 9.0, false, 1}, {3, 1.0, true, 1}};
  EXPECT_TRUE(DecideStep(inf, 1.0).skip);
  const std::vector<StepStats> huge = {{3, std::numeric_limits<double>::max(), false, 1},
                                       {3, std::numeric_limits<double>::max(), false, 1}};
  EXPECT_TRUE(DecideStep(huge, 1.0).skip);  // The sum overflows.
}

TEST(StepProtocolTest, OnlyDecisionsThatFollowFromTheirNormPass) {
  EXPECT_TRUE(CheckDecision({true, 0.123, -5}, 1.0).ok());  // A skip is a skip.
  const double norm = 8.0;
  const double coef = ClipCoefficient(1.0, norm);
  EXPECT_TRUE(CheckDecision({false, coef, norm}, 1.0).ok());
  EXPECT_EQ(CheckDecision({false, coef / 2, norm}, 1.0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckDecision({false, 1.0, -1}, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckDecision({false, 1.0, std::nan("")}, 0).code(),
            absl::StatusCode::kInvalidArgument);
  // A coefficient that underflows fp32 would zero the update: refused.
  EXPECT_EQ(CheckDecision({false, ClipCoefficient(1e-300, 1e10), 1e10}, 1e-300).code(),
            absl::StatusCode::kInvalidArgument);
  // Equality is at fp32, and skips are equal whatever else they say.
  EXPECT_EQ((StepDecision{false, 0.5, 1}), (StepDecision{false, 0.5 + 1e-12, 2}));
  EXPECT_EQ((StepDecision{true, 0.5, 1}), (StepDecision{true, 1.0, 0}));
  EXPECT_NE((StepDecision{true, 1.0, 0}), (StepDecision{false, 1.0, 0}));
}

TEST(StepProtocolTest, LossScalesArePowersOfTwoInRange) {
  for (double ok : {1.0, 0.5, 1024.0, std::ldexp(1.0, 100), std::ldexp(1.0, -101)}) {
    EXPECT_TRUE(CheckLossScale(ok).ok()) << ok;
  }
  for (double bad : {0.0, -2.0, 3.0, 1000.0, std::ldexp(1.0, 101), std::ldexp(1.0, -102),
                     std::numeric_limits<double>::infinity(), std::nan("")}) {
    EXPECT_EQ(CheckLossScale(bad).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(GradientMultiplier({false, 0.5, 3}, 4.0), 0.125f);
}

TEST(StepProtocolTest, OnlyClippingOrLossScalingMakesStepsWaitForADecision) {
  EXPECT_FALSE(StepsNeedDecisions(0, false));
  EXPECT_TRUE(StepsNeedDecisions(1.0, false));
  EXPECT_TRUE(StepsNeedDecisions(0, true));
  EXPECT_TRUE(StepsNeedDecisions(0.5, true));
}

TEST(StepProtocolTest, PositionOfAStepAgainstAVersion) {
  EXPECT_EQ(PositionOfStep(5, 3), StepPosition::kApplied);
  EXPECT_EQ(PositionOfStep(5, 5), StepPosition::kApplied);
  EXPECT_EQ(PositionOfStep(5, 6), StepPosition::kNext);
  EXPECT_EQ(PositionOfStep(5, 7), StepPosition::kAhead);
}

}  // namespace
}  // namespace shardopt
