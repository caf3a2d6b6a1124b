// The conversions of the step protocol's values, field for field and bit
// for bit (a decision's doubles must reach every shard exactly).
#include "common/proto_convert.h"

#include "gtest/gtest.h"

namespace shardopt {
namespace {

TEST(ProtoConvertTest, StepStatsAndDecisionsRoundTripExactly) {
  const StepStats stats{12, 0.1 + 0.2, true, 0.0009765625};
  const StepStats back = StepStatsFromProto(StepStatsToProto(stats));
  EXPECT_EQ(back.step, 12);
  EXPECT_EQ(back.sum_of_squares, 0.1 + 0.2);
  EXPECT_TRUE(back.found_inf);
  EXPECT_EQ(back.loss_scale, 0.0009765625);
  const StepDecision decision{false, 1.0 / 3.0, 2.5};
  const v1::StepDecision proto = StepDecisionToProto(decision);
  EXPECT_FALSE(proto.skip());
  EXPECT_EQ(proto.clip_coef(), 1.0 / 3.0);
  EXPECT_EQ(proto.grad_norm(), 2.5);
  const StepDecision decoded = StepDecisionFromProto(proto);
  EXPECT_EQ(decoded.clip_coef, 1.0 / 3.0);  // Exact, not only equal at fp32.
  EXPECT_EQ(decoded.grad_norm, 2.5);
  EXPECT_TRUE(StepDecisionFromProto(StepDecisionToProto({true, 1.0, 0})).skip);
}

}  // namespace
}  // namespace shardopt
