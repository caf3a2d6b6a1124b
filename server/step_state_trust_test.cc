// StepState with trust norms (LAMB on the flat partition): a decision in two
// halves - the clip half starts the shard's measuring, the norms then start
// the update - and everything refused on the way leaves the state as it was.
#include "absl/strings/match.h"
#include "common/step_protocol_testing.h"
#include "gtest/gtest.h"
#include "server/step_state.h"

namespace shardopt {
namespace {

using Kind = StepState::RangeWork::Kind;
using Phase = StepState::Phase;

const absl::Time kT0 = absl::FromUnixSeconds(1000);
constexpr size_t kTensors = 2;

StepStateOptions TrustOptions() {
  StepStateOptions o;
  o.model_id = "m";
  o.shard_index = 1;
  o.num_trainers = 2;
  o.needs_decision = true;
  o.needs_trust_norms = true;
  o.trust_tensor_count = kTensors;
  o.initial = Hyperparameters{OptimizerConfig::Lamb(0.01), LrSchedule()};
  o.size = 1000;
  o.range_elements = 256;  // (Ignored: trust steps run as one range.)
  return o;
}

using testing::Partial;

// Both pushes of `step` in and reduced: the step awaits its decision.
void ReduceStep(StepState& s, int64_t step, double sum_of_squares) {
  for (uint32_t r = 0; r < 2; ++r) {
    ASSERT_TRUE(s.BeginPush(r, step, 1.0).ok());
    ASSERT_TRUE(s.CommitPush(r, step, false, 1.0, kT0).ok());
  }
  std::optional<StepState::RangeWork> reduce = s.ClaimRange(false);
  ASSERT_TRUE(reduce.has_value());
  ASSERT_EQ(reduce->kind, Kind::kReduce);
  s.FinishRange(*reduce, {sum_of_squares});
  ASSERT_EQ(s.CompleteStepIfDone(), StepState::Completion::kReduced);
  ASSERT_EQ(s.phase(), Phase::kAwaitingDecision);
}

// This shard holds tensor 0 in part and tensor 1 whole.
const std::vector<TrustPartial>& OwnPartials() {
  static const std::vector<TrustPartial> own = {Partial(0, false, 1.0, 2.0),
                                                Partial(1, true, 4.0, 5.0)};
  return own;
}

TEST(StepStateTrustTest, TheClipHalfMeasuresAndTheNormsUpdate) {
  StepState s(TrustOptions());
  EXPECT_EQ(s.range_count(), 1u);
  ASSERT_NO_FATAL_FAILURE(ReduceStep(s, 1, 16.0));
  const StepDecision clip{false, 0.5, 4.0, {}};
  absl::StatusOr<std::optional<StepState::Update>> begun = s.BeginDecision(1, clip);
  ASSERT_TRUE(begun.ok()) << begun.status();
  ASSERT_TRUE(begun->has_value());
  EXPECT_TRUE((*begun)->measure);
  EXPECT_FLOAT_EQ((*begun)->multiplier, 0.5f);
  EXPECT_EQ(s.phase(), Phase::kMeasuring);
  EXPECT_TRUE(s.running());
  EXPECT_FALSE(s.updating());  // (Parameters stay as they are: a checkpoint may read them.)
  // The first half's statistics stay available; the partials are not known yet.
  ASSERT_TRUE(s.StatsOf(1).has_value());
  EXPECT_DOUBLE_EQ(s.StatsOf(1)->value().sum_of_squares, 16.0);
  EXPECT_FALSE(s.TrustStatsOf(1).has_value());
  // Another trainer's repeat of the clip half compares at once.
  EXPECT_TRUE(s.DecisionMayProceed(false));
  EXPECT_FALSE(s.BeginDecision(1, clip)->has_value());
  EXPECT_EQ(s.BeginDecision(1, StepDecision{false, 0.25, 4.0, {}}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Norms before the partials are measured: refused.
  const StepDecision full{false, 0.5, 4.0, {{3.0, 2.5}, {4.0, 5.0}}};
  EXPECT_EQ(s.BeginNorms(1, full).status().code(), absl::StatusCode::kFailedPrecondition);

  std::optional<StepState::RangeWork> measure = s.ClaimRange(false);
  ASSERT_TRUE(measure.has_value());
  EXPECT_EQ(measure->kind, Kind::kMeasure);
  EXPECT_EQ(measure->begin, 0u);
  EXPECT_EQ(measure->end, 1000u);
  EXPECT_FLOAT_EQ(measure->multiplier, 0.5f);
  EXPECT_EQ(measure->optimizer_step, 1);
  EXPECT_FALSE(s.CanClaim(false));
  s.FinishRange(*measure, {}, OwnPartials());
  EXPECT_EQ(s.CompleteStepIfDone(), StepState::Completion::kMeasured);
  EXPECT_EQ(s.phase(), Phase::kAwaitingNorms);
  EXPECT_FALSE(s.running());
  EXPECT_FALSE(s.CanClaim(false));
  EXPECT_TRUE(absl::StrContains(s.DescribeWait(1), "tensor norms of step 1")) << s.DescribeWait(1);
  ASSERT_TRUE(s.TrustStatsOf(1).has_value());
  EXPECT_EQ(s.TrustStatsOf(1)->value().trust_partials.size(), 2u);

  // Refused norms leave the step awaiting them: too few, below this shard's
  // part, not its whole tensor's, or with another clip half.
  const StepDecision refused[] = {
      {false, 0.5, 4.0, {{3.0, 2.5}}},
      {false, 0.5, 4.0, {{0.5, 2.5}, {4.0, 5.0}}},
      {false, 0.5, 4.0, {{3.0, 2.5}, {4.0, 5.5}}},
  };
  for (const StepDecision& bad : refused) {
    EXPECT_EQ(s.BeginNorms(1, bad).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.phase(), Phase::kAwaitingNorms);
  }
  EXPECT_EQ(s.BeginNorms(1, StepDecision{false, 0.25, 4.0, full.tensor_norms}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.phase(), Phase::kAwaitingNorms);

  begun = s.BeginNorms(1, full);
  ASSERT_TRUE(begun.ok()) << begun.status();
  ASSERT_TRUE(begun->has_value());
  EXPECT_FALSE((*begun)->measure);
  EXPECT_EQ((*begun)->tensor_norms, full.tensor_norms);
  EXPECT_EQ(s.phase(), Phase::kUpdating);
  // Repeats while it is applied: the same full decision or its clip half.
  EXPECT_FALSE(s.BeginNorms(1, full)->has_value());
  EXPECT_FALSE(s.BeginDecision(1, clip)->has_value());
  EXPECT_EQ(
      s.BeginNorms(1, StepDecision{false, 0.5, 4.0, {{3.5, 2.5}, {4.0, 5.0}}}).status().code(),
      absl::StatusCode::kFailedPrecondition);
  std::optional<StepState::RangeWork> update = s.ClaimRange(false);
  ASSERT_TRUE(update.has_value());
  EXPECT_EQ(update->kind, Kind::kUpdate);
  EXPECT_EQ(update->tensor_norms, full.tensor_norms);
  s.FinishRange(*update);
  EXPECT_EQ(s.CompleteStepIfDone(), StepState::Completion::kApplied);
  EXPECT_EQ(s.version(), 1);
  EXPECT_EQ(s.last_step().decision, full);
  // Kept for late trainers: the partials, and repeats compared in full.
  ASSERT_TRUE(s.TrustStatsOf(1).has_value());
  EXPECT_EQ(s.TrustStatsOf(1)->value().trust_partials.size(), 2u);
  EXPECT_EQ(s.Progress().last_stats.trust_partials.size(), 2u);
  EXPECT_FALSE(s.BeginDecision(1, clip)->has_value());
  EXPECT_FALSE(s.BeginNorms(1, full)->has_value());
  EXPECT_EQ(
      s.BeginNorms(1, StepDecision{false, 0.5, 4.0, {{3.0, 2.5}, {4.5, 5.0}}}).status().code(),
      absl::StatusCode::kFailedPrecondition);
}

// A change for the step takes effect with the norms, not with the clip half:
// a checkpoint of the version taken between the halves saves its schedule.
TEST(StepStateTrustTest, ChangesTakeEffectWithTheNorms) {
  StepState s(TrustOptions());
  const Hyperparameters next{OptimizerConfig::Lamb(0.5), LrSchedule()};
  ASSERT_TRUE(s.ScheduleChange(1, next).ok());
  ASSERT_NO_FATAL_FAILURE(ReduceStep(s, 1, 16.0));
  absl::StatusOr<std::optional<StepState::Update>> begun =
      s.BeginDecision(1, StepDecision{false, 1.0, 4.0, {}});
  ASSERT_TRUE(begun.ok()) << begun.status();
  EXPECT_DOUBLE_EQ((*begun)->config.lr, 0.5);  // (What the measuring uses.)
  EXPECT_EQ(s.Progress().scheduled.count(1), 1u);
  EXPECT_TRUE(s.Progress().took_effect.empty());
  EXPECT_EQ(s.ScheduleChange(1, {OptimizerConfig::Lamb(0.25), LrSchedule()}).code(),
            absl::StatusCode::kFailedPrecondition);  // (The step has started.)
  std::optional<StepState::RangeWork> measure = s.ClaimRange(false);
  ASSERT_TRUE(measure.has_value());
  EXPECT_DOUBLE_EQ(measure->config.lr, 0.5);
  s.FinishRange(*measure, {}, OwnPartials());
  ASSERT_EQ(s.CompleteStepIfDone(), StepState::Completion::kMeasured);
  begun = s.BeginNorms(1, StepDecision{false, 1.0, 4.0, {{3.0, 2.5}, {4.0, 5.0}}});
  ASSERT_TRUE(begun.ok()) << begun.status();
  EXPECT_DOUBLE_EQ((*begun)->config.lr, 0.5);
  EXPECT_TRUE(s.Progress().scheduled.empty());
  EXPECT_EQ(s.Progress().took_effect.count(1), 1u);
}

TEST(StepStateTrustTest, ASkipNeedsNoNorms) {
  StepState s(TrustOptions());
  ASSERT_NO_FATAL_FAILURE(ReduceStep(s, 1, 16.0));
  const StepDecision skip{true, 1.0, 0, {}};
  absl::StatusOr<std::optional<StepState::Update>> begun = s.BeginDecision(1, skip);
  ASSERT_TRUE(begun.ok()) << begun.status();
  EXPECT_FALSE((*begun)->measure);
  EXPECT_EQ(s.phase(), Phase::kUpdating);
  EXPECT_EQ(s.TrustStatsOf(1)->status().code(), absl::StatusCode::kFailedPrecondition);
  std::optional<StepState::RangeWork> update = s.ClaimRange(false);
  ASSERT_TRUE(update.has_value());
  EXPECT_TRUE(update->skip);
  s.FinishRange(*update);
  EXPECT_EQ(s.CompleteStepIfDone(), StepState::Completion::kApplied);
  EXPECT_EQ(s.skipped_steps(), 1);
  EXPECT_EQ(s.TrustStatsOf(1)->status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(StepStateTrustTest, AHoldKeepsTheNormsBackButNotTheMeasuring) {
  StepState s(TrustOptions());
  ASSERT_NO_FATAL_FAILURE(ReduceStep(s, 1, 16.0));
  ASSERT_TRUE(s.BeginDecision(1, StepDecision{false, 1.0, 4.0, {}}).ok());
  s.AddHold(0);  // A checkpoint of version 0 starts while the step is measured.
  std::optional<StepState::RangeWork> measure = s.ClaimRange(false);
  ASSERT_TRUE(measure.has_value());  // (Measuring reads only.)
  s.FinishRange(*measure, {}, OwnPartials());
  ASSERT_EQ(s.CompleteStepIfDone(), StepState::Completion::kMeasured);
  EXPECT_FALSE(s.DecisionMayProceed(false));  // The update waits for the checkpoint.
  s.ReleaseHold(0);
  EXPECT_TRUE(s.DecisionMayProceed(false));
}

}  // namespace
}  // namespace shardopt
