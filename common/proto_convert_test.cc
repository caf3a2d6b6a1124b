// The conversions of the step protocol's values, field for field and bit
// for bit (a decision's doubles must reach every shard exactly).
#include "common/proto_convert.h"

#include <cmath>

#include "gtest/gtest.h"

namespace shardopt {
namespace {

TEST(ProtoConvertTest, StepStatsAndDecisionsRoundTripExactly) {
  const StepStats stats{12, 0.1 + 0.2, true, 0.0009765625};
  const StepStats back = *StepStatsFromProto(StepStatsToProto(stats));
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
  EXPECT_TRUE(StepDecisionFromProto(StepDecisionToProto({true, 1.0, 0, {}})).skip);
}

TEST(ProtoConvertTest, TrustPartialsAndTensorNormsRoundTripExactly) {
  StepStats stats;
  stats.step = 3;
  TrustPartial partial;
  partial.tensor_index = 2;
  partial.whole_tensor = true;
  // A sum no single double holds: it travels as several parts.
  partial.weight_squares.Add(1.0);
  partial.weight_squares.Add(std::ldexp(1.0, -80));
  partial.update_squares.Add(0.1);
  stats.trust_partials.push_back(partial);
  const v1::StepStats proto = StepStatsToProto(stats);
  ASSERT_EQ(proto.trust_partials_size(), 1);
  EXPECT_EQ(proto.trust_partials(0).weight_square_parts_size(), 2);
  const absl::StatusOr<StepStats> back = StepStatsFromProto(proto);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->trust_partials.size(), 1u);
  EXPECT_EQ(back->trust_partials[0].tensor_index, 2u);
  EXPECT_TRUE(back->trust_partials[0].whole_tensor);
  EXPECT_EQ(back->trust_partials[0].weight_squares, partial.weight_squares);
  EXPECT_EQ(back->trust_partials[0].update_squares, partial.update_squares);

  v1::StepStats bad = proto;
  bad.mutable_trust_partials(0)->add_update_square_parts(-1.0);
  EXPECT_EQ(StepStatsFromProto(bad).status().code(), absl::StatusCode::kInvalidArgument);

  StepDecision decision{false, 0.5, 2.0, {{1.0 / 3.0, 2.0 / 3.0}, {0.0, 7.0}}};
  EXPECT_EQ(StepDecisionFromProto(StepDecisionToProto(decision)), decision);
  EXPECT_EQ(StepDecisionFromProto(StepDecisionToProto(decision)).tensor_norms[0].weight_squares,
            1.0 / 3.0);
}

}  // namespace
}  // namespace shardopt
