// The shared step rules: decisions from statistics, their check, loss
// scales, step positions.
#include "common/step_protocol.h"

#include <cmath>
#include <limits>
#include <vector>

#include "common/step_protocol_testing.h"
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

TEST(StepProtocolTest, OnlyLambOnAFlatSplitOfSeveralShardsNeedsTrustNorms) {
  const std::vector<TensorSpec> tensors = {{"w", {100, 3}}, {"b", {7}}};
  const ModelLayout flat = *ModelLayout::Create(tensors, 0, 2);
  const ModelLayout one = *ModelLayout::Create(tensors, 0, 1);
  const ModelLayout whole = *ModelLayout::Create(tensors, 0, 2, Partition::kWholeTensors);
  EXPECT_TRUE(StepsNeedTrustNorms(OptimizerKind::kLamb, flat));
  EXPECT_FALSE(StepsNeedTrustNorms(OptimizerKind::kLamb, one));
  EXPECT_FALSE(StepsNeedTrustNorms(OptimizerKind::kLamb, whole));
  EXPECT_FALSE(StepsNeedTrustNorms(OptimizerKind::kAdam, flat));
}

using testing::Partial;

TEST(StepProtocolTest, TrustPartialsCombineExactlyAndMustBeEachShardsPieces) {
  // Tensor 0 (200 elements) straddles both shards (192 each); tensor 1 is
  // whole on shard 1; tensor 2 has no elements and lies on no shard.
  const ModelLayout layout =
      ModelLayout::Create({{"a", {200}}, {"b", {10}}, {"e", {0}}}, 64, 2).value();
  StepStats a, b;
  a.trust_partials = {Partial(0, false, 1.0, 1e-17)};
  b.trust_partials = {Partial(0, false, 1e-17, 2.0), Partial(1, true, 4.0, 5.0)};
  const std::vector<StepStats> ab = {a, b};
  const absl::StatusOr<std::vector<TensorNorms>> norms = CombineTrustPartials(ab, layout);
  ASSERT_TRUE(norms.ok()) << norms.status();
  ASSERT_EQ(norms->size(), 3u);
  EXPECT_EQ((*norms)[0].weight_squares, 1.0 + 1e-17);  // (Rounded once: 1.0.)
  EXPECT_EQ((*norms)[0].update_squares, 2.0);
  EXPECT_EQ((*norms)[1], (TensorNorms{4.0, 5.0}));
  EXPECT_EQ((*norms)[2], (TensorNorms{0.0, 0.0}));
  // The shards out of order, one missing, a piece twice, a missing piece,
  // a wrong whole-ness, a tensor the model lacks.
  const std::vector<StepStats> ba = {b, a}, one = {a};
  EXPECT_EQ(CombineTrustPartials(ba, layout).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CombineTrustPartials(one, layout).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<std::vector<TrustPartial>> bad_b = {
      {Partial(0, false, 1, 1), Partial(0, false, 1, 1), Partial(1, true, 4, 5)},
      {Partial(1, true, 4, 5)},
      {Partial(0, true, 1, 1), Partial(1, true, 4, 5)},
      {Partial(0, false, 1, 1), Partial(7, true, 4, 5)}};
  for (const std::vector<TrustPartial>& partials : bad_b) {
    StepStats bad = b;
    bad.trust_partials = partials;
    const std::vector<StepStats> stats = {a, bad};
    EXPECT_EQ(CombineTrustPartials(stats, layout).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST(StepProtocolTest, ShardsRefuseTensorNormsTheirOwnPartsContradict) {
  const std::vector<TrustPartial> own = {Partial(0, false, 1.0, 2.0), Partial(1, true, 4.0, 5.0)};
  const std::vector<TensorNorms> good = {{3.0, 2.5}, {4.0, 5.0}};
  EXPECT_TRUE(CheckTensorNorms(good, 2, own).ok());
  // A diverged tensor's norms (+inf, NaN) pass where the shard's part allows them.
  std::vector<TensorNorms> diverged = good;
  diverged[0] = {std::numeric_limits<double>::infinity(), std::nan("")};
  EXPECT_TRUE(CheckTensorNorms(diverged, 2, own).ok());
  const std::vector<TrustPartial> own_nan = {Partial(0, false, 1.0, 2.0),
                                             Partial(1, true, 4.0, std::nan(""))};
  EXPECT_EQ(CheckTensorNorms(good, 2, own_nan).code(), absl::StatusCode::kInvalidArgument);
  std::vector<TensorNorms> both_nan = good;
  both_nan[1].update_squares = std::nan("");
  EXPECT_TRUE(CheckTensorNorms(both_nan, 2, own_nan).ok());
  EXPECT_EQ(both_nan, both_nan);  // (So that repeats of such a decision agree.)
  // Too few, negative, below this shard's own part, or not its whole tensor's.
  const std::vector<TensorNorms> few = {{3.0, 2.5}};
  EXPECT_EQ(CheckTensorNorms(few, 2, own).code(), absl::StatusCode::kInvalidArgument);
  std::vector<TensorNorms> bad = good;
  bad[0].weight_squares = -std::numeric_limits<double>::infinity();
  EXPECT_EQ(CheckTensorNorms(bad, 2, own).code(), absl::StatusCode::kInvalidArgument);
  bad = good;
  bad[0].update_squares = 1.5;
  EXPECT_EQ(CheckTensorNorms(bad, 2, own).code(), absl::StatusCode::kInvalidArgument);
  bad = good;
  bad[1].weight_squares = 4.5;
  EXPECT_EQ(CheckTensorNorms(bad, 2, own).code(), absl::StatusCode::kInvalidArgument);
  // A skip carries none.
  EXPECT_EQ(CheckDecision(StepDecision{true, 1.0, 0, good}, 0).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(StepProtocolTest, DecisionsWithTensorNormsAreEqualOnlyWithTheSameNorms) {
  const StepDecision clip_only{false, 0.5, 1, {}};
  const StepDecision with{false, 0.5, 1, {{1.0, 2.0}}};
  EXPECT_TRUE(clip_only.SameClip(with));
  EXPECT_NE(clip_only, with);
  EXPECT_NE(with, (StepDecision{false, 0.5, 1, {{1.0, 2.5}}}));
  EXPECT_EQ(with, (StepDecision{false, 0.5, 3, {{1.0, 2.0}}}));
}

TEST(StepProtocolTest, PositionOfAStepAgainstAVersion) {
  EXPECT_EQ(PositionOfStep(5, 3), StepPosition::kApplied);
  EXPECT_EQ(PositionOfStep(5, 5), StepPosition::kApplied);
  EXPECT_EQ(PositionOfStep(5, 6), StepPosition::kNext);
  EXPECT_EQ(PositionOfStep(5, 7), StepPosition::kAhead);
}

}  // namespace
}  // namespace shardopt
