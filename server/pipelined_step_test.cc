// Pipelined steps on one ModelShard: ranges are updated as soon as every
// trainer's gradient of them has arrived, and pulls can read a range of the
// next version while later ranges still stream in. Checked here: the bits
// equal whole steps (with and without gradient control, pushes interleaved
// across trainers), a pull never gets a torn mix, a push that stalls or is
// refused half way keeps the ranges it fed (not applied twice) and its resend
// completes the step, holds stop range work, an overflow in a consumed
// range still skips the step, and a decision that comes too early waits
// only until its deadline.
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "server/model_shard.h"
#include "server/model_shard_testing.h"

namespace shardopt {
namespace {

using testing::RandomGradient;
using testing::ReadAll;

// 4 ranges of 65536 elements (the norm block) and a short fifth one.
constexpr uint64_t kRange = 65536;

ModelLayout BigLayout() {
  return ModelLayout::Create({{"w", {301, 900}}, {"b", {33}}}, 16, 1).value();
}

struct Job {
  uint32_t trainers = 2;
  OptimizerConfig optimizer = OptimizerConfig::Adam(0.01);
  double max_grad_norm = 0;
  bool loss_scaling = false;
};

std::unique_ptr<ModelShard> MakeBigShard(ThreadPool* pool, const Job& setup,
                                         uint64_t range_elements) {
  ModelShardOptions options{"m", BigLayout(), 0, setup.optimizer, setup.trainers, true};
  options.max_grad_norm = setup.max_grad_norm;
  options.loss_scaling = setup.loss_scaling;
  options.pipeline_range_elements = range_elements;
  std::vector<float> init(options.layout.ShardSize(0));
  for (size_t i = 0; i < init.size(); ++i) init[i] = 0.001f * static_cast<float>(i % 101);
  shardopt::ZeroPadding(options.layout, options.layout.ShardRange(0), init.data());
  return ModelShard::Create(std::move(options), std::move(init), pool).value();
}

std::vector<float> Gradient(uint32_t rank, int64_t step, size_t n) {
  std::vector<float> g = RandomGradient(rank, step, n);
  shardopt::ZeroPadding(BigLayout(), BigLayout().ShardRange(0), g.data());
  return g;
}

absl::Status Write(ModelShard::PushWriter& writer, const std::vector<float>& g, size_t begin,
                   size_t end) {
  return writer.Write(begin, g.data() + begin, (end - begin) * sizeof(float));
}

// Every trainer's push of `step`, chunk by chunk in turn (rank order
// reversed on odd steps), then the decision if the shard needs one.
void RunStep(ModelShard& shard, const Job& setup, int64_t step, size_t chunk) {
  const size_t n = shard.size();
  std::vector<std::vector<float>> grads;
  std::vector<std::unique_ptr<ModelShard::PushWriter>> writers;
  for (uint32_t r = 0; r < setup.trainers; ++r) {
    grads.push_back(Gradient(r, step, n));
    if (setup.loss_scaling) {
      for (float& g : grads.back()) g *= 1024;
    }
    absl::StatusOr<ModelShard::PushStart> start =
        shard.BeginPush(r, step, n, DType::kFloat32, setup.loss_scaling ? 1024.0 : 1.0);
    ASSERT_TRUE(start.ok()) << start.status();
    writers.push_back(std::move(start->writer));
  }
  for (size_t off = 0; off < n; off += chunk) {
    for (uint32_t i = 0; i < setup.trainers; ++i) {
      const uint32_t r = step % 2 ? setup.trainers - 1 - i : i;
      ASSERT_TRUE(Write(*writers[r], grads[r], off, std::min(n, off + chunk)).ok());
    }
  }
  for (auto& w : writers) ASSERT_TRUE(w->Commit().ok());
  if (shard.options().needs_decision()) {
    absl::StatusOr<StepStats> stats =
        shard.WaitForStepStats(step, absl::Now() + absl::Seconds(10), nullptr);
    ASSERT_TRUE(stats.ok()) << stats.status();
    ASSERT_TRUE(shard.Decide(step, DecideStep({*stats}, setup.max_grad_norm), false).ok());
  }
  ASSERT_TRUE(shard.WaitForVersion(step, absl::Now() + absl::Seconds(10), nullptr).ok());
}

// The job's shard with whole steps, after step 1 (what pipelined runs of it
// must equal).
std::unique_ptr<ModelShard> WholeStepShard(ThreadPool* pool, const Job& setup) {
  std::unique_ptr<ModelShard> shard = MakeBigShard(pool, setup, 0);
  RunStep(*shard, setup, 1, 1 << 20);
  return shard;
}

TEST(PipelinedStepTest, BitsEqualWholeStepsWithAndWithoutGradientControl) {
  ThreadPool pool(2);
  std::vector<Job> jobs(4);
  jobs[1].optimizer = OptimizerConfig::AdamW(0.02);
  jobs[1].trainers = 3;
  jobs[2].max_grad_norm = 50;  // Clips: the norm of ~270k N(0,1) is ~520.
  jobs[3].loss_scaling = true;
  jobs[3].max_grad_norm = 1000;
  for (const Job& setup : jobs) {
    std::unique_ptr<ModelShard> whole = MakeBigShard(&pool, setup, 0);
    std::unique_ptr<ModelShard> piped = MakeBigShard(&pool, setup, kRange);
    for (int64_t step = 1; step <= 3; ++step) {
      RunStep(*whole, setup, step, 100000);
      RunStep(*piped, setup, step, 40000 + 7 * step);  // Chunks cut across ranges.
      ASSERT_EQ(ReadAll(*piped, step), ReadAll(*whole, step)) << "step " << step;
    }
    if (setup.max_grad_norm > 0) {
      const ShardSnapshot a = whole->Snapshot("", 0, 0, false).value();
      const ShardSnapshot b = piped->Snapshot("", 0, 0, false).value();
      EXPECT_EQ(a.last_step.decision.grad_norm, b.last_step.decision.grad_norm);
      if (!setup.loss_scaling) {
        EXPECT_LT(a.last_step.decision.clip_coef, 1.0);
      }
    }
  }
}

TEST(PipelinedStepTest, ARangeIsUpdatedAndReadableWhileLaterRangesStillStream) {
  ThreadPool pool(2);
  Job setup;
  setup.trainers = 1;
  std::unique_ptr<ModelShard> reference = WholeStepShard(&pool, setup);
  const std::vector<float> expected = ReadAll(*reference, 1);

  std::unique_ptr<ModelShard> shard = MakeBigShard(&pool, setup, kRange);
  const std::vector<float> initial = ReadAll(*shard, 0);
  const std::vector<float> g = Gradient(0, 1, shard->size());
  absl::StatusOr<ModelShard::PushStart> start = shard->BeginPush(0, 1, shard->size());
  ASSERT_TRUE(start.ok());
  ASSERT_TRUE(Write(*start->writer, g, 0, 2 * kRange + 10).ok());
  // Ranges 0 and 1 are at version 1 already; 2 and beyond are not.
  const absl::Time soon = absl::Now() + absl::Milliseconds(200);
  ASSERT_TRUE(shard->WaitForRanges(1, 0, 2 * kRange, soon, nullptr).ok());
  EXPECT_EQ(shard->PullTarget(0, soon, nullptr).value(), 1);  // Version 0 is gone in part.
  std::vector<float> piece(2 * kRange);
  ASSERT_TRUE(shard->ReadParameters(1, 0, piece.size(), piece.data()).ok());
  EXPECT_TRUE(std::equal(piece.begin(), piece.end(), expected.begin()));
  // No torn mix: version 0 of an updated range, or a piece spanning both.
  EXPECT_EQ(shard->ReadParameters(0, 0, 10, piece.data()).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(shard->ReadParameters(1, 2 * kRange - 5, 10, piece.data()).code(),
            absl::StatusCode::kAborted);
  ASSERT_TRUE(shard->ReadParameters(0, 2 * kRange, 10, piece.data()).ok());
  EXPECT_TRUE(std::equal(piece.begin(), piece.begin() + 10, initial.begin() + 2 * kRange));
  const absl::Status waited = shard->WaitForRanges(1, 3 * kRange, 10, soon, nullptr);
  EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(waited.message(), "trainer 0")) << waited;
  EXPECT_EQ(shard->version(), 0);

  ASSERT_TRUE(Write(*start->writer, g, 2 * kRange + 10, shard->size()).ok());
  absl::StatusOr<PushResult> done = start->writer->Commit();
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->outcome, PushOutcome::kApplied);
  EXPECT_EQ(ReadAll(*shard, 1), expected);
}

TEST(PipelinedStepTest, AStalledPushKeepsTheRangesItFedAndItsResendCompletesTheStep) {
  ThreadPool pool(2);
  Job setup;
  std::unique_ptr<ModelShard> reference = WholeStepShard(&pool, setup);
  std::unique_ptr<ModelShard> shard = MakeBigShard(&pool, setup, kRange);
  const size_t n = shard->size();
  {
    absl::StatusOr<ModelShard::PushStart> start = shard->BeginPush(1, 1, n);
    ASSERT_TRUE(Write(*start->writer, Gradient(1, 1, n), 0, n).ok());
    ASSERT_TRUE(start->writer->Commit().ok());
  }
  std::vector<float> g0 = Gradient(0, 1, n);
  {
    absl::StatusOr<ModelShard::PushStart> start = shard->BeginPush(0, 1, n);
    ASSERT_TRUE(Write(*start->writer, g0, 0, 2 * kRange + 500).ok());
    // The stream breaks off: the writer goes without a commit.
  }
  ASSERT_TRUE(shard->WaitForRanges(1, 0, 2 * kRange, absl::Now(), nullptr).ok());
  // The resend differs in the consumed ranges: they are not applied again.
  std::vector<float> resend = g0;
  for (size_t i = 0; i < 2 * kRange; ++i) resend[i] *= 3;
  absl::StatusOr<PushResult> result = testing::PushInChunks(*shard, 0, 1, resend, 30001);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->outcome, PushOutcome::kApplied);
  EXPECT_EQ(ReadAll(*shard, 1), ReadAll(*reference, 1));
  // And the next step runs as usual.
  RunStep(*reference, setup, 2, 1 << 20);
  RunStep(*shard, setup, 2, 50000);
  EXPECT_EQ(ReadAll(*shard, 2), ReadAll(*reference, 2));
}

TEST(PipelinedStepTest, ATrainerThatLostItsFedPushIsToldAtOnceAndTheStepCannotBeDropped) {
  ThreadPool pool(2);
  Job setup;
  std::unique_ptr<ModelShard> shard = MakeBigShard(&pool, setup, kRange);
  const size_t n = shard->size();
  ASSERT_TRUE(testing::PushInChunks(*shard, 1, 1, Gradient(1, 1, n), 70000).ok());
  {
    absl::StatusOr<ModelShard::PushStart> start = shard->BeginPush(0, 1, n);
    ASSERT_TRUE(Write(*start->writer, Gradient(0, 1, n), 0, kRange + 1).ok());
  }  // Trainer 0 dies: range 0 holds its gradient.
  // Restarted without its push, it asks for version 0: not a wait for itself.
  const absl::Time soon = absl::Now() + absl::Seconds(5);
  const absl::Status resumed =
      shard->PullTarget(0, soon, nullptr, ModelShard::PushedBy{0, 0}).status();
  EXPECT_EQ(resumed.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(resumed.message(), "ran 1 of 5 ranges of step 1")) << resumed;
  EXPECT_TRUE(absl::StrContains(resumed.message(), "trainer(s) 0")) << resumed;
  // Trainer 1, which pushed step 1 whole, waits for version 1 as usual.
  EXPECT_EQ(shard->PullTarget(1, soon, nullptr, ModelShard::PushedBy{1, 1}).value(), 1);
  EXPECT_EQ(shard->PullTarget(0, soon, nullptr, ModelShard::PushedBy{1, 1}).value(), 1);
  // A rollback to version 0 cannot just drop the step (RollBack loads the
  // checkpoint instead).
  EXPECT_EQ(shard->DiscardPendingPushes().code(), absl::StatusCode::kFailedPrecondition);
  // Its journaled push completes the step.
  ASSERT_TRUE(testing::PushInChunks(*shard, 0, 1, Gradient(0, 1, n), 70000).ok());
  EXPECT_EQ(shard->version(), 1);
}

TEST(PipelinedStepTest, ADeferredPushCountsOnlyOnceCompleteAndLeavesNothingWhenItBreaksOff) {
  ThreadPool pool(2);
  Job setup;
  setup.trainers = 1;
  std::unique_ptr<ModelShard> reference = WholeStepShard(&pool, setup);
  std::unique_ptr<ModelShard> shard = MakeBigShard(&pool, setup, kRange);
  const std::vector<float> initial = ReadAll(*shard, 0);
  const size_t n = shard->size();
  const std::vector<float> g = Gradient(0, 1, n);
  const auto begin = [&] {
    return std::move(
        shard->BeginPush(0, 1, n, DType::kFloat32, 1.0, {}, /*defer=*/true).value().writer);
  };
  {
    std::unique_ptr<ModelShard::PushWriter> writer = begin();
    ASSERT_TRUE(Write(*writer, g, 0, 3 * kRange).ok());
    EXPECT_EQ(ReadAll(*shard, 0), initial);  // Nothing ran yet.
  }  // Broken off: nothing of it stays.
  EXPECT_EQ(ReadAll(*shard, 0), initial);
  EXPECT_TRUE(shard->DiscardPendingPushes().ok());
  std::unique_ptr<ModelShard::PushWriter> writer = begin();
  ASSERT_TRUE(Write(*writer, g, 0, n).ok());
  EXPECT_EQ(shard->version(), 0);
  absl::StatusOr<PushResult> done = writer->Commit();
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->outcome, PushOutcome::kApplied);
  EXPECT_EQ(ReadAll(*shard, 1), ReadAll(*reference, 1));
}

TEST(PipelinedStepTest, ANaNAfterAppliedRangesIsRefusedAndTheRestStaysUntouched) {
  ThreadPool pool(2);
  Job setup;
  setup.trainers = 1;
  std::unique_ptr<ModelShard> reference = WholeStepShard(&pool, setup);
  std::unique_ptr<ModelShard> shard = MakeBigShard(&pool, setup, kRange);
  const std::vector<float> initial = ReadAll(*shard, 0);
  const size_t n = shard->size();
  std::vector<float> bad = Gradient(0, 1, n);
  bad[2 * kRange + 7] = std::numeric_limits<float>::quiet_NaN();
  {
    absl::StatusOr<ModelShard::PushStart> start = shard->BeginPush(0, 1, n);
    ASSERT_TRUE(Write(*start->writer, bad, 0, 2 * kRange).ok());
    const absl::Status refused = Write(*start->writer, bad, 2 * kRange, n);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(refused.message(), "is nan")) << refused;
  }
  std::vector<float> rest(n - 2 * kRange);
  ASSERT_TRUE(shard->ReadParameters(0, 2 * kRange, rest.size(), rest.data()).ok());
  EXPECT_TRUE(std::equal(rest.begin(), rest.end(), initial.begin() + 2 * kRange));
  ASSERT_TRUE(testing::PushInChunks(*shard, 0, 1, Gradient(0, 1, n), 65536).ok());
  EXPECT_EQ(ReadAll(*shard, 1), ReadAll(*reference, 1));
}

TEST(PipelinedStepTest, AnOverflowInAConsumedRangeSkipsTheStepAfterTheResend) {
  ThreadPool pool(2);
  Job setup;
  setup.loss_scaling = true;
  std::unique_ptr<ModelShard> shard = MakeBigShard(&pool, setup, kRange);
  const std::vector<float> initial = ReadAll(*shard, 0);
  const size_t n = shard->size();
  ASSERT_TRUE(testing::PushInChunks(*shard, 1, 1, Gradient(1, 1, n), 70000).status().ok());
  std::vector<float> g0 = Gradient(0, 1, n);
  g0[5] = std::numeric_limits<float>::infinity();
  {
    absl::StatusOr<ModelShard::PushStart> start = shard->BeginPush(0, 1, n);
    ASSERT_TRUE(start.ok()) << start.status();
    ASSERT_TRUE(Write(*start->writer, g0, 0, kRange + 3).ok());
  }
  g0[5] = 0;  // The resend is clean, but range 0 was reduced with the inf.
  ASSERT_TRUE(testing::PushInChunks(*shard, 0, 1, g0, 70000).ok());
  absl::StatusOr<StepStats> stats = shard->WaitForStepStats(1, absl::Now(), nullptr);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(stats->found_inf);
  EXPECT_EQ(shard->Decide(1, StepDecision{false, 1, 1}).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(shard->Decide(1, DecideStep({*stats}, 0)).ok());
  EXPECT_EQ(ReadAll(*shard, 1), initial);
}

TEST(PipelinedStepTest, ACheckpointHoldStopsRangeWorkUntilReleased) {
  ThreadPool pool(2);
  Job setup;
  setup.trainers = 1;
  std::unique_ptr<ModelShard> shard = MakeBigShard(&pool, setup, kRange);
  const std::vector<float> initial = ReadAll(*shard, 0);
  ModelShard::StepHold hold = shard->HoldStep(0);
  std::thread pusher([&] {
    EXPECT_TRUE(testing::PushInChunks(*shard, 0, 1, Gradient(0, 1, shard->size()), 80000).ok());
  });
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(ReadAll(*shard, 0), initial);  // Nothing applied while held.
  EXPECT_EQ(shard->version(), 0);
  hold.Release();
  pusher.join();
  EXPECT_EQ(shard->version(), 1);
}

TEST(PipelinedStepTest, PullsDriveTheUpdateAfterADecision) {
  ThreadPool pool(2);
  Job setup;
  setup.trainers = 1;
  setup.max_grad_norm = 10;
  std::unique_ptr<ModelShard> reference = WholeStepShard(&pool, setup);
  std::unique_ptr<ModelShard> shard = MakeBigShard(&pool, setup, kRange);
  ASSERT_TRUE(testing::PushInChunks(*shard, 0, 1, Gradient(0, 1, shard->size()), 9999).ok());
  absl::StatusOr<StepStats> stats = shard->WaitForStepStats(1, absl::Now(), nullptr);
  ASSERT_TRUE(stats.ok());
  const StepDecision decision = DecideStep({*stats}, setup.max_grad_norm);
  ASSERT_TRUE(shard->Decide(1, decision, /*wait=*/false).ok());
  // A repeat (another trainer's) is compared at once, not after the update.
  ASSERT_TRUE(shard->Decide(1, decision, /*wait=*/false).ok());
  const StepDecision other{true, 1, 0};  // A skip.
  EXPECT_EQ(shard->Decide(1, other, false).code(), absl::StatusCode::kFailedPrecondition);
  // Nobody else runs the update: the pull's waits do, range by range.
  ASSERT_TRUE(shard->WaitForRanges(1, 0, kRange, absl::Now() + absl::Seconds(5), nullptr).ok());
  std::vector<float> first(kRange);
  ASSERT_TRUE(shard->ReadParameters(1, 0, kRange, first.data()).ok());
  ASSERT_TRUE(shard->WaitForVersion(1, absl::Now() + absl::Seconds(5), nullptr).ok());
  EXPECT_EQ(ReadAll(*shard, 1), ReadAll(*reference, 1));
}

// A decision that comes while its step is still being reduced (a trainer's
// push half way) waits only until the call's deadline, then says what the
// step waits for; the step goes on as usual afterwards.
TEST(PipelinedStepTest, AnEarlyDecisionWaitsOnlyUntilItsDeadline) {
  ThreadPool pool(2);
  Job setup;
  setup.max_grad_norm = 1.0;
  std::unique_ptr<ModelShard> shard = MakeBigShard(&pool, setup, kRange);
  const size_t n = shard->size();
  ASSERT_TRUE(testing::PushInChunks(*shard, 0, 1, Gradient(0, 1, n), 9999).ok());
  absl::StatusOr<ModelShard::PushStart> start = shard->BeginPush(1, 1, n, DType::kFloat32, 1.0);
  ASSERT_TRUE(start.ok()) << start.status();
  const std::vector<float> g1 = Gradient(1, 1, n);
  ASSERT_TRUE(Write(*start->writer, g1, 0, kRange).ok());  // Range 0 is reduced.
  const absl::Time asked = absl::Now();
  const absl::Status early =
      shard->Decide(1, {false, 1, 0}, /*wait=*/false, absl::Now() + absl::Milliseconds(300));
  EXPECT_LT(absl::Now() - asked, absl::Seconds(5));
  EXPECT_EQ(early.code(), absl::StatusCode::kDeadlineExceeded) << early;
  EXPECT_TRUE(absl::StrContains(early.message(), "trainer 1")) << early;
  ASSERT_TRUE(Write(*start->writer, g1, kRange, n).ok());
  ASSERT_TRUE(start->writer->Commit().ok());
  absl::StatusOr<StepStats> stats = shard->WaitForStepStats(1, absl::Now(), nullptr);
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_TRUE(shard->Decide(1, DecideStep({*stats}, setup.max_grad_norm)).ok());
  EXPECT_EQ(shard->version(), 1);
}

}  // namespace
}  // namespace shardopt
