// StepState on its own: every transition of the step protocol, and every
// one it refuses, without threads, backends or gRPC.
#include "server/step_state.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace shardopt {
namespace {

using Admission = StepState::Admission;
using Phase = StepState::Phase;

const absl::Time kT0 = absl::FromUnixSeconds(1000);

StepStateOptions Options(uint32_t trainers, bool needs_decision,
                         std::optional<LossScalerOptions> scaler = std::nullopt) {
  StepStateOptions o;
  o.model_id = "m";
  o.shard_index = 1;
  o.num_trainers = trainers;
  o.needs_decision = needs_decision;
  o.initial = Hyperparameters{OptimizerConfig::Sgd(0.1), LrSchedule()};
  o.run_id = "run";
  o.loss_scaler = scaler;
  return o;
}

// Begins and commits `rank`'s push of `step`; returns the ranks pending.
uint32_t PushWhole(StepState& s, uint32_t rank, int64_t step, bool found_inf = false,
                   double scale = 1.0) {
  absl::StatusOr<Admission> a = s.BeginPush(rank, step, scale);
  EXPECT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, Admission::kStart);
  absl::StatusOr<uint32_t> pending = s.CommitPush(rank, step, found_inf, scale, kT0);
  EXPECT_TRUE(pending.ok()) << pending.status();
  return pending.value_or(99);
}

TEST(StepStateTest, PushSlotsAdmitOnceAndRefuseWhatIsNotTheNextStep) {
  StepState s(Options(2, false));
  EXPECT_EQ(s.phase(), Phase::kCollecting);
  ASSERT_EQ(s.BeginPush(0, 1, 1.0).value(), Admission::kStart);
  // The same rank again while its push streams: retry later.
  EXPECT_EQ(s.BeginPush(0, 1, 1.0).status().code(), absl::StatusCode::kAborted);
  s.AbortPush(0, 1);  // The stream broke off: the slot is free.
  ASSERT_EQ(s.BeginPush(0, 1, 1.0).value(), Admission::kStart);
  EXPECT_EQ(s.CommitPush(0, 1, false, 1.0, kT0).value(), 1u);
  EXPECT_EQ(s.BeginPush(0, 1, 1.0).value(), Admission::kDuplicate);
  const absl::Status ahead = s.BeginPush(0, 3, 1.0).status();
  EXPECT_EQ(ahead.code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(absl::StrContains(ahead.message(), "at version 0 and waits for step 1")) << ahead;
  EXPECT_EQ(s.TrainersPushed(), std::vector<uint32_t>{0});
  EXPECT_EQ(s.trainers()[0].last_pushed_step, 1);
  EXPECT_EQ(s.trainers()[0].last_push_time, kT0);
  EXPECT_EQ(s.trainers()[1].last_pushed_step, 0);
  EXPECT_FALSE(s.trainers()[1].last_push_time.has_value());
  EXPECT_FALSE(s.CanClaim(false));
  // An abort of a push that is not in progress changes nothing.
  s.AbortPush(0, 1);
  EXPECT_EQ(s.BeginPush(0, 1, 1.0).value(), Admission::kDuplicate);
}

TEST(StepStateTest, AStepWithoutDecisionRunsOnceEveryPushIsIn) {
  StepState s(Options(2, false));
  EXPECT_EQ(PushWhole(s, 1, 1), 1u);  // Arrival order does not matter.
  EXPECT_EQ(PushWhole(s, 0, 1), 0u);
  ASSERT_TRUE(s.CanClaim(false));
  const StepState::StartedStep started = s.StartStep();
  EXPECT_EQ(started.step, 1);
  EXPECT_FALSE(started.reduce_first);
  EXPECT_DOUBLE_EQ(started.config.lr, 0.1);
  EXPECT_EQ(s.phase(), Phase::kUpdating);
  EXPECT_TRUE(s.running());
  EXPECT_TRUE(s.updating());
  // During the update every slot is complete: pushes are duplicates.
  EXPECT_EQ(s.BeginPush(0, 1, 1.0).value(), Admission::kDuplicate);
  s.FinishStep({started.config.lr, std::nullopt, 1.0});
  EXPECT_EQ(s.phase(), Phase::kCollecting);
  EXPECT_EQ(s.version(), 1);
  EXPECT_EQ(s.optimizer_steps(), 1);
  EXPECT_DOUBLE_EQ(s.last_lr(), 0.1);
  EXPECT_DOUBLE_EQ(s.version_lr(), 0.1);
  EXPECT_TRUE(s.TrainersPushed().empty());
  EXPECT_EQ(s.BeginPush(0, 1, 1.0).value(), Admission::kAlreadyApplied);
  EXPECT_EQ(s.BeginPush(0, 2, 1.0).value(), Admission::kStart);
}

TEST(StepStateTest, ACheckpointHoldKeepsTheNextStepBack) {
  StepState s(Options(1, false));
  s.AddHold(0);
  s.AddHold(0);  // Counted.
  EXPECT_EQ(PushWhole(s, 0, 1), 0u);
  EXPECT_FALSE(s.CanClaim(false));
  EXPECT_TRUE(absl::StrContains(s.DescribeWait(1), "waiting for the checkpoint of step 0"))
      << s.DescribeWait(1);
  s.ReleaseHold(0);
  EXPECT_FALSE(s.CanClaim(false));
  s.AddHold(5);  // Holds of other versions do not matter now.
  s.ReleaseHold(0);
  EXPECT_TRUE(s.CanClaim(false));
  EXPECT_TRUE(s.HeldAt(5));
  s.ReleaseHold(7);  // Releasing what is not held is harmless.
}

TEST(StepStateTest, DecisionsFollowTheReductionAndAreTakenOnce) {
  StepState s(Options(2, true));
  PushWhole(s, 0, 1);
  // Not every gradient is in: nothing to decide, no stats yet.
  EXPECT_EQ(s.BeginDecision(1, {true, 1, 0}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(s.StatsOf(1).has_value());
  PushWhole(s, 1, 1, /*found_inf=*/true);
  const StepState::StartedStep started = s.StartStep();
  EXPECT_TRUE(started.reduce_first);
  EXPECT_EQ(s.phase(), Phase::kReducing);
  EXPECT_FALSE(s.DecisionMayProceed(false));
  EXPECT_FALSE(s.StatsOf(1).has_value());
  s.FinishReduce(42.0);
  EXPECT_EQ(s.phase(), Phase::kAwaitingDecision);
  EXPECT_TRUE(s.DecisionMayProceed(false));
  const StepStats stats = s.StatsOf(1)->value();
  EXPECT_EQ(stats.step, 1);
  EXPECT_DOUBLE_EQ(stats.sum_of_squares, 42.0);
  EXPECT_TRUE(stats.found_inf);
  EXPECT_TRUE(absl::StrContains(s.DescribeWait(1), "waiting for a trainer to send the decision"))
      << s.DescribeWait(1);
  // A gradient had inf/NaN: only a skip is accepted; other steps are refused.
  EXPECT_EQ(s.BeginDecision(1, {false, 1, 3}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.BeginDecision(2, {true, 1, 0}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A change for the step awaiting its decision is refused (other shards
  // may have decided it).
  EXPECT_EQ(s.ScheduleChange(1, {OptimizerConfig::Sgd(0.5), LrSchedule()}).code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<std::optional<StepState::Update>> update = s.BeginDecision(1, {true, 1, 0});
  ASSERT_TRUE(update.ok() && update->has_value()) << update.status();
  EXPECT_TRUE((*update)->skip);
  EXPECT_EQ((*update)->optimizer_step, 1);
  EXPECT_EQ(s.phase(), Phase::kUpdating);
  s.FinishStep({(*update)->config.lr, StepDecision{true, 1, 0}, (*update)->loss_scale});
  EXPECT_EQ(s.version(), 1);
  EXPECT_EQ(s.skipped_steps(), 1);
  EXPECT_EQ(s.optimizer_steps(), 0);
  EXPECT_EQ(s.last_step().step, 1);
  // Repeats: the same decision is nothing to do, another is refused.
  absl::StatusOr<std::optional<StepState::Update>> repeat = s.BeginDecision(1, {true, 0.5, 9});
  ASSERT_TRUE(repeat.ok());
  EXPECT_FALSE(repeat->has_value());
  EXPECT_EQ(s.BeginDecision(1, {false, 1, 0}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // The stats of the last decided step stay for late askers; older ones do not.
  EXPECT_DOUBLE_EQ(s.StatsOf(1)->value().sum_of_squares, 42.0);

  // Step 2 applied with clipping: the optimizer's count excludes the skip.
  PushWhole(s, 0, 2, false, 1.0);
  PushWhole(s, 1, 2, false, 1.0);
  s.StartStep();
  s.FinishReduce(4.0);
  update = s.BeginDecision(2, {false, 0.25, 2.0});
  ASSERT_TRUE(update.ok() && update->has_value());
  EXPECT_EQ((*update)->optimizer_step, 1);
  EXPECT_EQ((*update)->multiplier, 0.25f);
  s.FinishStep({(*update)->config.lr, StepDecision{false, 0.25, 2.0}, 1.0});
  EXPECT_EQ(s.optimizer_steps(), 1);
  EXPECT_EQ(s.StatsOf(1)->status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.StatsOf(9)->status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(StepStateTest, LossScalesMustMatchTheReplicaAndEachOther) {
  LossScalerOptions scaler;
  scaler.initial_scale = 1024;
  scaler.hysteresis = 1;
  StepState s(Options(2, true, scaler));
  EXPECT_EQ(s.BeginPush(0, 1, 2048).status().code(), absl::StatusCode::kFailedPrecondition);
  PushWhole(s, 0, 1, false, 1024);
  // Rank 1 begins with the replica's scale, then commits with another one
  // (a client that changed its mind mid-stream): refused, slot freed.
  ASSERT_EQ(s.BeginPush(1, 1, 1024).value(), Admission::kStart);
  EXPECT_EQ(s.CommitPush(1, 1, false, 512, kT0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.Pending(), 1u);
  PushWhole(s, 1, 1, true, 1024);
  s.StartStep();
  s.FinishReduce(1.0);
  auto update = s.BeginDecision(1, {true, 1, 0});
  ASSERT_TRUE(update.ok());
  s.FinishStep({(*update)->config.lr, StepDecision{true, 1, 0}, 1024});
  // The replica backed off with the skip (hysteresis 1).
  EXPECT_EQ(s.loss_scaler_state()->scale, 512);
  EXPECT_EQ(s.BeginPush(0, 2, 1024).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.BeginPush(0, 2, 512).value(), Admission::kStart);
}

TEST(StepStateTest, AFailureStopsEverything) {
  StepState s(Options(1, false));
  PushWhole(s, 0, 1);
  s.StartStep();
  const absl::Status failed = s.Fail(1, absl::InternalError("device lost"));
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(failed.message(), "shard 1 of model 'm' failed at step 1"));
  EXPECT_TRUE(absl::StrContains(failed.message(), "device lost"));
  EXPECT_TRUE(s.failed());
  EXPECT_EQ(s.BeginPush(0, 1, 1.0).status(), failed);
  EXPECT_EQ(s.BeginDecision(1, {true, 1, 0}).status(), failed);
  EXPECT_EQ(s.ScheduleChange(3, {OptimizerConfig::Sgd(0.5), LrSchedule()}), failed);
  EXPECT_EQ(s.StatsOf(1)->status(), failed);
  EXPECT_TRUE(s.DecisionMayProceed(false));  // (To return the failure.)
  EXPECT_EQ(s.version(), 0);
}

TEST(StepStateTest, HyperparameterChangesTakeEffectWhenTheirStepStarts) {
  StepState s(Options(1, false));
  const Hyperparameters next{OptimizerConfig::Sgd(0.5), LrSchedule()};
  Hyperparameters other = next;
  other.optimizer.lr = 0.7;
  ASSERT_TRUE(s.ScheduleChange(2, next).ok());
  EXPECT_TRUE(s.ScheduleChange(2, next).ok());
  EXPECT_EQ(s.ScheduleChange(2, other).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.schedule().ScheduledSteps(), std::vector<int64_t>{2});
  for (int64_t step = 1; step <= 2; ++step) {
    PushWhole(s, 0, step);
    const StepState::StartedStep started = s.StartStep();
    EXPECT_DOUBLE_EQ(started.config.lr, step == 1 ? 0.1 : 0.5);
    s.FinishStep({started.config.lr, std::nullopt, 1});
  }
  EXPECT_TRUE(s.ScheduleChange(2, next).ok());  // A repeat after it took effect.
  EXPECT_EQ(s.ScheduleChange(2, other).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.ScheduleChange(1, next).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.CancelChange(2).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(s.ScheduleChange(4, other).ok());
  ASSERT_TRUE(s.CancelChange(4).ok());
  EXPECT_TRUE(s.CancelChange(5).ok());
  EXPECT_TRUE(s.schedule().ScheduledSteps().empty());
}

TEST(StepStateTest, HoldsOfPushesAndWaitsAreDescribed) {
  StepState s(Options(3, false));
  PushWhole(s, 0, 1);
  ASSERT_EQ(s.BeginPush(2, 1, 1.0).value(), Admission::kStart);
  EXPECT_TRUE(s.CheckHoldsPush(0, 1).ok());
  const absl::Status lost = s.CheckHoldsPush(1, 1);
  EXPECT_EQ(lost.code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(absl::StrContains(lost.message(), "does not hold trainer 1's push of step 1"));
  EXPECT_EQ(s.CheckHoldsPush(2, 1).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(s.CheckHoldsPush(0, 2).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(s.DescribeWait(1),
            "shard 1 is at version 0, waiting for trainer 1 (last pushed step 0), trainer 2 "
            "(last pushed step 0, its push of step 1 is in progress) to push step 1");
  EXPECT_EQ(s.DescribeWait(3),
            "shard 1 is at version 0 (version 3 needs steps 1..3), waiting for trainer 1 (last "
            "pushed step 0), trainer 2 (last pushed step 0, its push of step 1 is in progress) "
            "to push step 1");
  EXPECT_EQ(s.DescribeWait(0), "at version 0");
}

TEST(StepStateTest, RestoreOnlyBeforeTheFirstPushAndOnlyConsistentCounts) {
  ShardProgress saved;
  saved.version = 7;
  saved.optimizer_steps = 5;
  saved.skipped_steps = 2;
  saved.current = Hyperparameters{OptimizerConfig::Sgd(0.3), LrSchedule()};
  saved.scheduled[9] = Hyperparameters{OptimizerConfig::Sgd(0.2), LrSchedule()};
  saved.run_id = "saved-run";
  {
    StepState s(Options(2, false));
    ShardProgress bad = saved;
    bad.skipped_steps = 3;  // 5 + 3 > 7.
    EXPECT_EQ(s.CheckRestore(bad).code(), absl::StatusCode::kInvalidArgument);
    ASSERT_TRUE(s.CheckRestore(saved).ok());
    s.Restore(saved);
    EXPECT_EQ(s.version(), 7);
    EXPECT_EQ(s.run_id(), "saved-run");
    EXPECT_EQ(s.trainers()[1].last_pushed_step, 7);
    const ShardProgress again = s.Progress();
    EXPECT_EQ(again.version, 7);
    EXPECT_EQ(again.optimizer_steps, 5);
    EXPECT_EQ(again.skipped_steps, 2);
    EXPECT_EQ(again.scheduled.count(9), 1u);
    EXPECT_EQ(s.BeginPush(0, 7, 1.0).value(), Admission::kAlreadyApplied);
    EXPECT_EQ(s.BeginPush(0, 8, 1.0).value(), Admission::kStart);
    ASSERT_TRUE(s.CommitPush(0, 8, false, 1.0, kT0).ok());
    EXPECT_EQ(PushWhole(s, 1, 8), 0u);
    // Step 8 is the optimizer's 6th (two were skipped), with or without
    // decisions: Adam's bias correction counts updates.
    const std::optional<StepState::RangeWork> work = s.ClaimRange(false);
    ASSERT_TRUE(work.has_value());
    EXPECT_EQ(work->step, 8);
    EXPECT_EQ(work->optimizer_step, 6);
  }
  {
    StepState s(Options(2, false));
    ASSERT_EQ(s.BeginPush(0, 1, 1.0).value(), Admission::kStart);
    EXPECT_EQ(s.CheckRestore(saved).code(), absl::StatusCode::kFailedPrecondition);
  }
}

TEST(StepStateTest, CarriedChangesOnlyFillWhatIsMissing) {
  StepState s(Options(1, false));
  const Hyperparameters x{OptimizerConfig::Sgd(0.5), LrSchedule()};
  const Hyperparameters y{OptimizerConfig::Sgd(0.7), LrSchedule()};
  // Missing (a restarted shard lost it): adopted.
  s.AdoptChanges(std::nullopt, {{3, x}});
  EXPECT_EQ(s.schedule().ScheduledSteps(), std::vector<int64_t>{3});
  // Never replaced by a carried one.
  s.AdoptChanges(std::nullopt, {{3, y}});
  EXPECT_EQ(s.schedule().scheduled().at(3), x);
  // A cancel seen here is not undone by a trainer that still carries it.
  ASSERT_TRUE(s.CancelChange(3).ok());
  s.AdoptChanges(std::nullopt, {{3, x}});
  EXPECT_TRUE(s.schedule().ScheduledSteps().empty());
  // Scheduling it again explicitly lifts that.
  ASSERT_TRUE(s.ScheduleChange(3, y).ok());
  s.AdoptChanges(std::nullopt, {{4, x}});
  EXPECT_EQ(s.schedule().ScheduledSteps(), (std::vector<int64_t>{3, 4}));
  // Steps applied or started are left alone.
  PushWhole(s, 0, 1);
  s.StartStep();
  s.AdoptChanges(std::nullopt, {{1, x}});
  EXPECT_EQ(s.schedule().ScheduledSteps(), (std::vector<int64_t>{3, 4}));
}

// A push refused after its admission (NaN, bad padding, a broken stream)
// takes back the changes only it scheduled, before its step started; what
// another push of the step carried, what SetHyperparameters asked for, and
// what a push answered at once carried stay.
TEST(StepStateTest, ARefusedPushTakesBackWhatOnlyItScheduled) {
  StepState s(Options(2, false));
  const Hyperparameters x{OptimizerConfig::Sgd(0.5), LrSchedule()};
  const Hyperparameters y{OptimizerConfig::Sgd(0.7), LrSchedule()};
  ASSERT_EQ(s.BeginPush(0, 1, 1.0).value(), Admission::kStart);
  s.AdoptChanges(0, {{3, x}, {5, y}});
  ASSERT_EQ(s.BeginPush(1, 1, 1.0).value(), Admission::kStart);
  s.AdoptChanges(1, {{5, y}});
  ASSERT_EQ(s.schedule().ScheduledSteps(), (std::vector<int64_t>{3, 5}));
  s.AbortPush(0, 1);
  EXPECT_EQ(s.schedule().ScheduledSteps(), std::vector<int64_t>{5});
  s.AbortPush(1, 1);
  EXPECT_TRUE(s.schedule().ScheduledSteps().empty());

  // Asked for by SetHyperparameters meanwhile: it stays.
  ASSERT_EQ(s.BeginPush(0, 1, 1.0).value(), Admission::kStart);
  s.AdoptChanges(0, {{4, x}});
  ASSERT_TRUE(s.ScheduleChange(4, x).ok());
  s.AbortPush(0, 1);
  EXPECT_EQ(s.schedule().ScheduledSteps(), std::vector<int64_t>{4});

  // Carried by a push that completed: it stays when a later carrier fails.
  ASSERT_EQ(s.BeginPush(1, 1, 1.0).value(), Admission::kStart);
  s.AdoptChanges(1, {{6, y}});
  ASSERT_TRUE(s.CommitPush(1, 1, false, 1.0, kT0).ok());
  ASSERT_EQ(s.BeginPush(0, 1, 1.0).value(), Admission::kStart);
  s.AdoptChanges(0, {{6, y}, {7, x}});
  s.AbortPush(0, 1);
  EXPECT_EQ(s.schedule().ScheduledSteps(), (std::vector<int64_t>{4, 6}));

  // Carried by a push answered at once (a duplicate): it stays.
  ASSERT_EQ(s.BeginPush(1, 1, 1.0).value(), Admission::kDuplicate);
  s.AdoptChanges(std::nullopt, {{8, x}});
  ASSERT_EQ(s.BeginPush(0, 1, 1.0).value(), Admission::kStart);
  s.AdoptChanges(0, {{8, x}});
  s.AbortPush(0, 1);
  EXPECT_EQ(s.schedule().ScheduledSteps(), (std::vector<int64_t>{4, 6, 8}));

  // Once the step completes, what its pushes carried is the schedule's.
  ASSERT_EQ(s.BeginPush(0, 1, 1.0).value(), Admission::kStart);
  s.AdoptChanges(0, {{9, y}});
  ASSERT_EQ(s.CommitPush(0, 1, false, 1.0, kT0).value(), 0u);
  s.StartStep();
  s.FinishStep(StepState::Ending{});
  ASSERT_EQ(s.version(), 1);
  ASSERT_EQ(s.BeginPush(0, 2, 1.0).value(), Admission::kStart);
  s.AbortPush(0, 2);
  EXPECT_EQ(s.schedule().ScheduledSteps(), (std::vector<int64_t>{4, 6, 8, 9}));
}

TEST(StepStateTest, ARollbackToThisVersionDropsThePushesOfTheNextStep) {
  StepState s(Options(2, false));
  PushWhole(s, 0, 1);
  ASSERT_EQ(s.BeginPush(1, 1, 1.0).value(), Admission::kStart);
  // One still streaming: look again.
  EXPECT_EQ(s.DiscardPending().code(), absl::StatusCode::kAborted);
  s.AbortPush(1, 1);
  ASSERT_TRUE(s.DiscardPending().ok());
  EXPECT_TRUE(s.TrainersPushed().empty());
  EXPECT_EQ(s.BeginPush(0, 1, 1.0).value(), Admission::kStart);  // Not a duplicate now.
  ASSERT_TRUE(s.CommitPush(0, 1, false, 1.0, kT0).ok());
  PushWhole(s, 1, 1);
  // Every push in: the committer of the last one is about to start it (a
  // hold may keep it waiting), so it is not dropped from under it.
  EXPECT_EQ(s.DiscardPending().code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(s.CanClaim(false));
  EXPECT_EQ(s.TrainersPushed().size(), 2u);
  s.StartStep();
  EXPECT_EQ(s.DiscardPending().code(), absl::StatusCode::kAborted);  // Started.
}

}  // namespace
}  // namespace shardopt
