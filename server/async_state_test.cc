// AsyncState on its own: admission (the exactly-once table), application in
// commit order one at a time, bounded staleness with the laggards named,
// consistent cuts, restore, failure; and a seeded random schedule of
// pushes, breaks, retries and applications in which every trainer's every
// step is applied exactly once, in its order, never more than s ahead.
#include "server/async_state.h"

#include <map>
#include <random>
#include <set>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace shardopt {
namespace {

// Begins and commits trainer `rank`'s push of `step`.
void Push(AsyncState& state, uint32_t rank, int64_t step) {
  absl::StatusOr<AsyncAdmission> admitted = state.BeginPush(rank, step);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  ASSERT_EQ(*admitted, AsyncAdmission::kAccepted);
  ASSERT_TRUE(state.CommitPush(rank, step).ok());
}

// Applies every eligible push; returns them in order as (rank, step).
std::vector<std::pair<uint32_t, int64_t>> ApplyAll(AsyncState& state) {
  std::vector<std::pair<uint32_t, int64_t>> applied;
  while (std::optional<AsyncState::Claim> claim = state.ClaimApply()) {
    EXPECT_FALSE(state.ClaimApply().has_value()) << "one application at a time";
    state.FinishApply(*claim);
    applied.emplace_back(claim->rank, claim->step);
  }
  return applied;
}

TEST(AsyncStateTest, AdmissionIsExactlyOncePerTrainerAndStep) {
  AsyncState state({/*num_trainers=*/2, /*staleness=*/0});
  EXPECT_EQ(state.BeginPush(2, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state.BeginPush(0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  absl::Status gap = state.BeginPush(0, 3).status();
  EXPECT_EQ(gap.code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(absl::StrContains(gap.message(), "push steps 1..2 first")) << gap;

  ASSERT_EQ(*state.BeginPush(0, 1), AsyncAdmission::kAccepted);
  EXPECT_EQ(state.BeginPush(0, 1).status().code(), absl::StatusCode::kAborted);
  // A push that breaks off leaves the slot empty: the resend is admitted.
  state.AbortPush(0, 1);
  EXPECT_EQ(state.slot(0), AsyncState::Slot::kEmpty);
  ASSERT_EQ(*state.BeginPush(0, 1), AsyncAdmission::kAccepted);
  ASSERT_TRUE(state.CommitPush(0, 1).ok());
  EXPECT_EQ(state.BeginPush(0, 1).status().code(), absl::StatusCode::kAborted);  // Queued.
  EXPECT_EQ(state.BeginPush(0, 2).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(state.pushed(0), 1);
  EXPECT_EQ(ApplyAll(state), (std::vector<std::pair<uint32_t, int64_t>>{{0, 1}}));
  EXPECT_EQ(state.version(), 1);
  // A retry after a lost answer: acknowledged, not applied again.
  EXPECT_EQ(*state.BeginPush(0, 1), AsyncAdmission::kAlreadyApplied);
  EXPECT_EQ(state.slot(0), AsyncState::Slot::kEmpty);
  EXPECT_FALSE(state.CommitPush(0, 1).ok());
  EXPECT_EQ(state.version(), 1);
  // The other trainer is not held by this one's progress.
  EXPECT_EQ(state.applied(), (std::vector<int64_t>{1, 0}));
}

TEST(AsyncStateTest, AppliesInCommitOrderOneAtATime) {
  AsyncState state({3, 0});
  ASSERT_EQ(*state.BeginPush(2, 1), AsyncAdmission::kAccepted);
  ASSERT_NO_FATAL_FAILURE(Push(state, 1, 1));
  ASSERT_TRUE(state.CommitPush(2, 1).ok());  // Began first, committed second.
  ASSERT_NO_FATAL_FAILURE(Push(state, 0, 1));
  std::optional<AsyncState::Claim> first = state.ClaimApply();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->rank, 1u);
  EXPECT_EQ(first->version, 1);
  EXPECT_FALSE(state.ClaimApply().has_value());
  state.FinishApply(*first);
  // Trainer 1 can push its step 2 while the others' step 1 wait.
  ASSERT_NO_FATAL_FAILURE(Push(state, 1, 2));
  EXPECT_EQ(ApplyAll(state), (std::vector<std::pair<uint32_t, int64_t>>{{2, 1}, {0, 1}, {1, 2}}));
  EXPECT_EQ(state.version(), 4);
  EXPECT_EQ(state.applied(), (std::vector<int64_t>{1, 2, 1}));
  const std::vector<std::pair<uint32_t, int64_t>> order(state.recent_order().begin(),
                                                        state.recent_order().end());
  EXPECT_EQ(order, (std::vector<std::pair<uint32_t, int64_t>>{{1, 1}, {2, 1}, {0, 1}, {1, 2}}));
}

TEST(AsyncStateTest, BoundedStalenessHoldsTheFastTrainerAndNamesTheSlowOne) {
  AsyncState state({3, /*staleness=*/2});
  // Trainer 0 runs ahead: steps 1 and 2 are within 2 of the others' 0.
  for (int64_t step = 1; step <= 2; ++step) {
    ASSERT_NO_FATAL_FAILURE(Push(state, 0, step));
    ASSERT_EQ(ApplyAll(state).size(), 1u);
  }
  ASSERT_NO_FATAL_FAILURE(Push(state, 0, 3));
  EXPECT_TRUE(ApplyAll(state).empty()) << "step 3 waits for step 1 of trainers 1 and 2";
  EXPECT_EQ(state.Laggards(0, 3), (std::vector<std::pair<uint32_t, int64_t>>{{1, 0}, {2, 0}}));
  const std::string why = state.DescribeWait(0, 3);
  EXPECT_TRUE(absl::StrContains(why, "trainer(s) 1 (applied step 0), 2 (applied step 0)")) << why;
  EXPECT_TRUE(absl::StrContains(why, "to push step 1")) << why;
  ASSERT_NO_FATAL_FAILURE(Push(state, 1, 1));
  // Trainer 1's step applies; 0's step 3 still waits for trainer 2.
  EXPECT_EQ(ApplyAll(state), (std::vector<std::pair<uint32_t, int64_t>>{{1, 1}}));
  EXPECT_EQ(state.Laggards(0, 3), (std::vector<std::pair<uint32_t, int64_t>>{{2, 0}}));
  ASSERT_NO_FATAL_FAILURE(Push(state, 2, 1));
  // A queued push does not count until it is applied (it could still be
  // withdrawn): 2's step 1 goes first, then 0's step 3, 2 steps ahead.
  std::optional<AsyncState::Claim> claim = state.ClaimApply();
  ASSERT_TRUE(claim.has_value());
  EXPECT_EQ(claim->rank, 2u);
  EXPECT_EQ(claim->step, 1);
  state.FinishApply(*claim);
  claim = state.ClaimApply();
  ASSERT_TRUE(claim.has_value());
  EXPECT_EQ(claim->rank, 0u);
  EXPECT_EQ(claim->step, 3);
  EXPECT_EQ(claim->staleness, 2);
  state.FinishApply(*claim);
  EXPECT_EQ(ApplyAll(state), (std::vector<std::pair<uint32_t, int64_t>>{}));
  EXPECT_EQ(state.DescribeWait(0, 3), "");
  // Its step 4 would wait for both others' step 2.
  EXPECT_EQ(state.Laggards(0, 4), (std::vector<std::pair<uint32_t, int64_t>>{{1, 1}, {2, 1}}));
}

TEST(AsyncStateTest, HoldsOfUniformCutsTheLowestCounts) {
  AsyncState state({2, 0});
  state.AddHold(2);
  state.AddHold(4);  // The next periodic checkpoint's, taken before 2 is saved.
  using Applied = std::vector<std::pair<uint32_t, int64_t>>;
  for (int64_t step = 1; step <= 2; ++step) {
    ASSERT_NO_FATAL_FAILURE(Push(state, 0, step));
    EXPECT_EQ(ApplyAll(state), (Applied{{0, step}}));
  }
  // Trainer 0's step 3 waits at the cut of step 2.
  ASSERT_NO_FATAL_FAILURE(Push(state, 0, 3));
  EXPECT_EQ(ApplyAll(state), Applied{});
  EXPECT_TRUE(absl::StrContains(state.DescribeWait(0, 3),
                                "checkpoint of step 2 holds every trainer there until it is "
                                "saved: it waits for trainer(s) 1 (applied step 0) to push up "
                                "to step 2"))
      << state.DescribeWait(0, 3);
  EXPECT_FALSE(state.UniformCutReached(2));
  EXPECT_TRUE(state.UniformCutReachable(2));
  for (int64_t step = 1; step <= 2; ++step) {
    ASSERT_NO_FATAL_FAILURE(Push(state, 1, step));
    EXPECT_EQ(ApplyAll(state), (Applied{{1, step}}));
  }
  EXPECT_TRUE(state.UniformCutReached(2));
  EXPECT_EQ(state.slowest_applied(), 2);
  state.ReleaseHold(2);
  EXPECT_EQ(ApplyAll(state), (Applied{{0, 3}}));
  EXPECT_FALSE(state.UniformCutReachable(2));
  EXPECT_TRUE(state.UniformCutReachable(4));
  state.ReleaseHold(4);
  state.ReleaseHold(7);  // (Not held: nothing happens.)
}

TEST(AsyncStateTest, AWithdrawnPushLeavesNoTrace) {
  AsyncState state({2, 1});
  using Applied = std::vector<std::pair<uint32_t, int64_t>>;
  ASSERT_NO_FATAL_FAILURE(Push(state, 0, 1));
  ASSERT_NO_FATAL_FAILURE(Push(state, 1, 1));
  EXPECT_EQ(ApplyAll(state).size(), 2u);
  ASSERT_NO_FATAL_FAILURE(Push(state, 0, 2));
  EXPECT_EQ(ApplyAll(state), (Applied{{0, 2}}));
  // 0's step 3 waits for trainer 1's step 2: its call gives up.
  ASSERT_NO_FATAL_FAILURE(Push(state, 0, 3));
  EXPECT_FALSE(state.ClaimApply().has_value());
  EXPECT_TRUE(state.WithdrawQueued(0, 3));
  EXPECT_FALSE(state.WithdrawQueued(0, 3));
  EXPECT_EQ(state.slot(0), AsyncState::Slot::kEmpty);
  EXPECT_EQ(state.pushed(0), 2);
  // Pushed again later, it goes as any other.
  ASSERT_NO_FATAL_FAILURE(Push(state, 1, 2));
  EXPECT_EQ(ApplyAll(state), (Applied{{1, 2}}));
  ASSERT_NO_FATAL_FAILURE(Push(state, 0, 3));
  EXPECT_EQ(ApplyAll(state), (Applied{{0, 3}}));
  EXPECT_EQ(state.applied(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(state.max_staleness(), 1);
}

TEST(AsyncStateTest, RestoreAndFailure) {
  AsyncState state({2, 0});
  EXPECT_EQ(state.CheckRestore({{1}, 1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state.CheckRestore({{1, 2}, 4}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_EQ(*state.BeginPush(0, 1), AsyncAdmission::kAccepted);
  EXPECT_EQ(state.CheckRestore({{1, 2}, 3}).code(), absl::StatusCode::kFailedPrecondition);
  state.AbortPush(0, 1);
  ASSERT_TRUE(state.CheckRestore({{4, 2}, 6}).ok());
  state.Restore({{4, 2}, 6});
  EXPECT_EQ(state.version(), 6);
  EXPECT_EQ(*state.BeginPush(0, 4), AsyncAdmission::kAlreadyApplied);
  EXPECT_EQ(state.BeginPush(1, 4).status().code(), absl::StatusCode::kOutOfRange);
  ASSERT_NO_FATAL_FAILURE(Push(state, 1, 3));
  std::optional<AsyncState::Claim> claim = state.ClaimApply();
  ASSERT_TRUE(claim.has_value());
  EXPECT_EQ(claim->version, 7);
  state.FailApply(*claim, absl::InternalError("device lost"));
  EXPECT_TRUE(state.failed());
  EXPECT_EQ(state.BeginPush(0, 5).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(state.ClaimApply().has_value());
  EXPECT_EQ(state.version(), 6);
}

// Trainers that push their steps in a random interleaving, break off and
// resend, retry pushes already applied, give up on queued pushes
// (withdrawn); checkpoint holds come and go; applications come at random
// moments. Every (trainer, step) is applied exactly once, each trainer's in
// order, none more than s ahead of any other trainer's applied step (checked
// against applied(), not the claim's own figure), none past a hold.
TEST(AsyncStateTest, RandomSchedulesApplyEveryPushExactlyOnce) {
  for (int64_t staleness : {0, 1, 3}) {
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      constexpr uint32_t kTrainers = 3;
      constexpr int64_t kSteps = 30;
      std::mt19937_64 rng(seed);
      AsyncState state({kTrainers, staleness});
      std::vector<int64_t> next(kTrainers, 1);  // Each trainer's step to push.
      std::map<std::pair<uint32_t, int64_t>, int> times_applied;
      std::optional<int64_t> hold;
      for (int round = 0; round < 100000 && state.version() < kTrainers * kSteps; ++round) {
        const uint32_t r = static_cast<uint32_t>(rng() % kTrainers);
        switch (rng() % 6) {
          case 0:
          case 1: {  // Trainer r pushes its next step (maybe breaking off).
            if (next[r] > kSteps) break;
            absl::StatusOr<AsyncAdmission> a = state.BeginPush(r, next[r]);
            if (!a.ok()) {
              ASSERT_EQ(a.status().code(), absl::StatusCode::kAborted) << a.status();
              break;
            }
            if (*a == AsyncAdmission::kAlreadyApplied) {
              ++next[r];
              break;
            }
            if (rng() % 5 == 0) {
              state.AbortPush(r, next[r]);
            } else {
              ASSERT_TRUE(state.CommitPush(r, next[r]).ok());
            }
            break;
          }
          case 2: {  // A retry of an older step: acknowledged only.
            if (state.applied()[r] >= 1) {
              const int64_t old = 1 + static_cast<int64_t>(rng() % state.applied()[r]);
              ASSERT_EQ(*state.BeginPush(r, old), AsyncAdmission::kAlreadyApplied);
            }
            break;
          }
          case 3: {
            if (std::optional<AsyncState::Claim> c = state.ClaimApply()) {
              ASSERT_EQ(c->step, state.applied()[c->rank] + 1) << "in each trainer's order";
              if (staleness > 0) {
                ASSERT_LE(c->staleness, staleness);
                for (uint32_t t = 0; t < kTrainers; ++t) {
                  if (t != c->rank) {
                    ASSERT_GE(state.applied()[t], c->step - staleness);
                  }
                }
              }
              if (hold) {
                ASSERT_LE(c->step, *hold) << "past the held cut";
              }
              ++times_applied[{c->rank, c->step}];
              state.FinishApply(*c);
            }
            break;
          }
          case 4: {  // Trainer r's call gives up on its queued push.
            if (state.slot(r) == AsyncState::Slot::kQueued) {
              ASSERT_TRUE(state.WithdrawQueued(r, state.applied()[r] + 1));
            }
            break;
          }
          case 5: {  // A checkpoint's hold is taken (when reachable) or released.
            if (hold) {
              state.ReleaseHold(*hold);
              hold.reset();
            } else if (rng() % 8 == 0) {
              const int64_t at = state.applied()[r] + static_cast<int64_t>(rng() % 4);
              if (state.UniformCutReachable(at)) {
                state.AddHold(at);
                hold = at;
              }
            }
            break;
          }
        }
      }
      ASSERT_EQ(state.version(), kTrainers * kSteps) << "seed " << seed << " s " << staleness;
      for (uint32_t r = 0; r < kTrainers; ++r) {
        for (int64_t k = 1; k <= kSteps; ++k) {
          ASSERT_EQ((times_applied[{r, k}]), 1) << "trainer " << r << " step " << k;
        }
      }
    }
  }
}

}  // namespace
}  // namespace shardopt
