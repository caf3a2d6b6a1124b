// ModelShard in the asynchronous and bounded-staleness modes, in process:
// exactness of plain SGD with dyadic numbers whatever the interleaving, Adam
// equal to a sequential optimizer fed the pushes in the shard's order,
// exactly-once admission and bad input leaving state untouched, the
// staleness bound (and its error naming the laggard), consistent cuts with a
// restore that continues exactly, pinned pulls, and the synchronous-only
// calls refused; and a cut's progress that does not depend on the order of
// the pushes.
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/model_shard.h"
#include "server/model_shard_testing.h"
#include "server/optim/optimizer.h"

namespace shardopt {
namespace {

using testing::kShard;
using testing::PushInChunks;
using testing::TestLayout;
using testing::ZeroPadding;

constexpr double kLr = 1.0 / 16;

// Multiples of 2^-10 below 1: every sum of them below 2^10 is exact in fp32.
std::vector<float> DyadicStart(const ModelLayout& layout) {
  std::vector<float> v(layout.ShardSize(0));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 97) / 128.0f;
  ZeroPadding(layout, kShard, &v);
  return v;
}

// Multiples of 2^-6 in [-1/8, 1/8]; zeros on the padding.
std::vector<float> DyadicGradient(const ModelLayout& layout, uint32_t rank, int64_t step) {
  std::vector<float> g(layout.ShardSize(0));
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = static_cast<float>(static_cast<int64_t>((rank * 7 + step * 3 + i) % 17) - 8) / 64.0f;
  }
  ZeroPadding(layout, kShard, &g);
  return g;
}

std::unique_ptr<ModelShard> MakeAsyncShard(ThreadPool* pool, uint32_t trainers,
                                           Consistency consistency, int64_t staleness,
                                           OptimizerConfig optimizer,
                                           std::vector<float> init = {}) {
  ModelShardOptions options{"m", TestLayout(), kShard, optimizer, trainers, true};
  options.consistency = consistency;
  options.staleness = staleness;
  if (init.empty()) init = DyadicStart(options.layout);
  return ModelShard::Create(std::move(options), std::move(init), pool).value();
}

std::vector<float> ReadNewest(ModelShard& shard) {
  ReadPin pin;
  const int64_t version = shard.PullTarget(0, absl::InfiniteFuture(), nullptr, {}, &pin).value();
  std::vector<float> out(shard.size());
  EXPECT_TRUE(shard.ReadParameters(version, 0, out.size(), out.data()).ok());
  return out;
}

// p0 - lr * (every push of steps 1..steps of every trainer), in double.
std::vector<float> ExpectedSgd(const ModelLayout& layout, uint32_t trainers, int64_t steps) {
  const std::vector<float> p0 = DyadicStart(layout);
  std::vector<double> sum(p0.size(), 0.0);
  for (uint32_t r = 0; r < trainers; ++r) {
    for (int64_t k = 1; k <= steps; ++k) {
      const std::vector<float> g = DyadicGradient(layout, r, k);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += g[i];
    }
  }
  std::vector<float> out(p0.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(p0[i] - kLr * sum[i]);
  return out;
}

void RunTrainers(ModelShard& shard, uint32_t trainers, int64_t first, int64_t last,
                 std::vector<std::string>* errors) {
  errors->assign(trainers, "");
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < trainers; ++r) {
    threads.emplace_back([&, r] {
      for (int64_t k = first; k <= last; ++k) {
        absl::StatusOr<PushResult> pushed =
            PushInChunks(shard, r, k, DyadicGradient(shard.layout(), r, k), 500 + 77 * r);
        if (!pushed.ok()) {
          (*errors)[r] = pushed.status().ToString();
          return;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

TEST(ModelShardAsyncTest, SgdIsExactWhateverTheInterleaving) {
  ThreadPool pool(2);
  constexpr uint32_t kTrainers = 3;
  constexpr int64_t kSteps = 40;
  std::unique_ptr<ModelShard> shard =
      MakeAsyncShard(&pool, kTrainers, Consistency::kAsync, 0, OptimizerConfig::Sgd(kLr));
  std::vector<std::string> errors;
  RunTrainers(*shard, kTrainers, 1, kSteps, &errors);
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(shard->version(), kTrainers * kSteps);
  const std::vector<float> got = ReadNewest(*shard);
  const std::vector<float> want = ExpectedSgd(shard->layout(), kTrainers, kSteps);
  ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  ShardSnapshot snap = shard->Snapshot("", 0, 0, false).value();
  EXPECT_EQ(snap.trainer_steps, (std::vector<int64_t>(kTrainers, kSteps)));
  ASSERT_EQ(snap.applied_order.size(), kTrainers * kSteps);
  std::vector<int64_t> last(kTrainers, 0);
  for (const auto& [rank, step] : snap.applied_order) {
    EXPECT_EQ(step, last[rank] + 1) << "trainer " << rank << "'s steps out of order";
    last[rank] = step;
  }
}

// The lr schedule counts the pushing trainer's own steps: trainer r's step k
// runs with the schedule's lr of step k whatever the shard's count of
// pushes is then, so every shard gives it the same lr (a linear warmup of
// dyadic values here: exact).
TEST(ModelShardAsyncTest, TheLrScheduleCountsEachTrainersOwnSteps) {
  ThreadPool pool(2);
  constexpr uint32_t kTrainers = 3;
  constexpr int64_t kSteps = 8;
  ModelShardOptions options{"m", TestLayout(), kShard, OptimizerConfig::Sgd(kLr), kTrainers, true};
  options.consistency = Consistency::kAsync;
  options.lr_schedule.kind = LrSchedule::Kind::kWarmup;
  options.lr_schedule.warmup_steps = 4;  // lr 0, 1/64, 1/32, 3/64, then 1/16.
  const LrSchedule schedule = options.lr_schedule;
  std::unique_ptr<ModelShard> shard =
      ModelShard::Create(options, DyadicStart(options.layout), &pool).value();
  std::vector<std::string> errors;
  RunTrainers(*shard, kTrainers, 1, kSteps, &errors);
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  const std::vector<float> p0 = DyadicStart(options.layout);
  std::vector<double> want(p0.begin(), p0.end());
  for (uint32_t r = 0; r < kTrainers; ++r) {
    for (int64_t k = 1; k <= kSteps; ++k) {
      const double lr = schedule.LearningRate(kLr, k);
      const std::vector<float> g = DyadicGradient(options.layout, r, k);
      for (size_t i = 0; i < want.size(); ++i) want[i] -= lr * g[i];
    }
  }
  const std::vector<float> got = ReadNewest(*shard);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], static_cast<float>(want[i])) << "element " << i;
  }
}

TEST(ModelShardAsyncTest, AdamEqualsASequentialOptimizerInTheShardsOrder) {
  ThreadPool pool(2);
  constexpr uint32_t kTrainers = 3;
  constexpr int64_t kSteps = 12;
  const OptimizerConfig adam = OptimizerConfig::Adam(0.01);
  std::unique_ptr<ModelShard> shard =
      MakeAsyncShard(&pool, kTrainers, Consistency::kAsync, 0, adam);
  std::vector<std::string> errors(kTrainers);
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < kTrainers; ++r) {
    threads.emplace_back([&, r] {
      for (int64_t k = 1; k <= kSteps; ++k) {
        absl::StatusOr<PushResult> pushed = testing::PushAll(*shard, r, k);
        if (!pushed.ok()) errors[r] = pushed.status().ToString();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  const ShardSnapshot snap = shard->Snapshot("", 0, 0, false).value();
  EXPECT_EQ(snap.optimizer_steps, kTrainers * kSteps);
  ASSERT_EQ(snap.applied_order.size(), kTrainers * kSteps);
  std::vector<float> params = DyadicStart(shard->layout());
  std::unique_ptr<Optimizer> reference = Optimizer::Create(adam, params.size()).value();
  int64_t optimizer_step = 0;
  for (const auto& [rank, step] : snap.applied_order) {
    const std::vector<float> g = testing::RandomGradient(rank, step, params.size());
    reference->Update(++optimizer_step, params.data(), g.data(), 0, params.size());
  }
  const std::vector<float> got = ReadNewest(*shard);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::memcmp(&got[i], &params[i], sizeof(float)), 0)
        << "element " << i << ": " << got[i] << " vs " << params[i];
  }
}

TEST(ModelShardAsyncTest, AdmissionIsExactlyOnceAndBadPushesChangeNothing) {
  ThreadPool pool(1);
  std::unique_ptr<ModelShard> shard =
      MakeAsyncShard(&pool, 2, Consistency::kAsync, 0, OptimizerConfig::Sgd(kLr));
  const ModelLayout& layout = shard->layout();
  absl::StatusOr<PushResult> first = PushInChunks(*shard, 0, 1, DyadicGradient(layout, 0, 1), 999);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->outcome, PushOutcome::kApplied);
  EXPECT_EQ(first->version, 1);
  EXPECT_EQ(first->trainer_steps, (std::vector<int64_t>{1, 0}));
  const std::vector<float> after_one = ReadNewest(*shard);
  // A retry of an applied push: acknowledged, not applied again.
  absl::StatusOr<PushResult> again = PushInChunks(*shard, 0, 1, DyadicGradient(layout, 0, 1), 999);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->outcome, PushOutcome::kAlreadyApplied);
  EXPECT_EQ(shard->version(), 1);
  // A gap names the steps to push first.
  absl::Status gap = PushInChunks(*shard, 0, 3, DyadicGradient(layout, 0, 3), 999).status();
  EXPECT_EQ(gap.code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(absl::StrContains(gap.message(), "push steps 2..2 first")) << gap;
  // One push of a (trainer, step) at a time.
  absl::StatusOr<ModelShard::PushStart> open =
      shard->BeginPush(1, 1, shard->size(), DType::kFloat32, 1.0, {}, false);
  ASSERT_TRUE(open.ok() && open->writer);
  EXPECT_EQ(shard->BeginPush(1, 1, shard->size(), DType::kFloat32, 1.0, {}, false).status().code(),
            absl::StatusCode::kAborted);
  // A NaN refuses the push; the slot is free again once its writer is gone.
  std::vector<float> bad = DyadicGradient(layout, 1, 1);
  bad[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(open->writer->Write(0, bad.data(), bad.size() * sizeof(float)).code(),
            absl::StatusCode::kInvalidArgument);
  open->writer.reset();
  EXPECT_EQ(shard->version(), 1);
  const std::vector<float> unchanged = ReadNewest(*shard);
  EXPECT_EQ(std::memcmp(unchanged.data(), after_one.data(), unchanged.size() * sizeof(float)), 0);
  // A push that ends early is not applied either.
  absl::StatusOr<ModelShard::PushStart> short_push =
      shard->BeginPush(1, 1, shard->size(), DType::kFloat32, 1.0, {}, false);
  ASSERT_TRUE(short_push.ok() && short_push->writer);
  const std::vector<float> g = DyadicGradient(layout, 1, 1);
  ASSERT_TRUE(short_push->writer->Write(0, g.data(), 100 * sizeof(float)).ok());
  EXPECT_EQ(short_push->writer->Commit().status().code(), absl::StatusCode::kInvalidArgument);
  short_push->writer.reset();
  EXPECT_EQ(shard->version(), 1);
  ASSERT_TRUE(PushInChunks(*shard, 1, 1, g, 999).ok());
  EXPECT_EQ(shard->version(), 2);
}

TEST(ModelShardAsyncTest, BoundedStalenessHoldsTheFastTrainerAndNamesTheLaggard) {
  ThreadPool pool(2);
  constexpr int64_t kStaleness = 2;
  std::unique_ptr<ModelShard> shard =
      MakeAsyncShard(&pool, 2, Consistency::kBounded, kStaleness, OptimizerConfig::Sgd(kLr));
  const ModelLayout& layout = shard->layout();
  for (int64_t k = 1; k <= kStaleness; ++k) {
    ASSERT_TRUE(PushInChunks(*shard, 0, k, DyadicGradient(layout, 0, k), 999).ok());
  }
  // Step 3 needs trainer 1's step 1: the call gives up and names it.
  absl::StatusOr<ModelShard::PushStart> start =
      shard->BeginPush(0, 3, shard->size(), DType::kFloat32, 1.0, {}, false);
  ASSERT_TRUE(start.ok() && start->writer);
  const std::vector<float> g3 = DyadicGradient(layout, 0, 3);
  ASSERT_TRUE(start->writer->Write(0, g3.data(), g3.size() * sizeof(float)).ok());
  absl::Status held = start->writer->Commit(absl::Now() + absl::Milliseconds(200)).status();
  EXPECT_EQ(held.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(held.message(), "trainer(s) 1 (applied step 0)")) << held;
  start->writer.reset();
  EXPECT_EQ(shard->version(), kStaleness);
  ShardSnapshot snap = shard->Snapshot("", 0, 0, false).value();
  EXPECT_EQ(snap.trainer_steps, (std::vector<int64_t>{kStaleness, 0}));

  // Trainer 1 slow on purpose: no push is applied more than s steps ahead.
  constexpr int64_t kSteps = 25;
  std::atomic<int64_t> worst{0};
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      for (int64_t k = r == 0 ? 3 : 1; k <= kSteps; ++k) {
        if (r == 1) absl::SleepFor(absl::Milliseconds(3));
        absl::StatusOr<PushResult> pushed =
            PushInChunks(*shard, r, k, DyadicGradient(layout, r, k), 999);
        if (!pushed.ok()) {
          errors[r] = pushed.status().ToString();
          return;
        }
        int64_t seen = worst.load();
        while (pushed->staleness > seen && !worst.compare_exchange_weak(seen, pushed->staleness)) {
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  EXPECT_LE(worst.load(), kStaleness);
  EXPECT_GE(worst.load(), 1);  // The slow trainer did make the fast one run ahead.
  snap = shard->Snapshot("", 0, 0, false).value();
  EXPECT_LE(snap.max_staleness, kStaleness);
  EXPECT_EQ(snap.trainer_steps, (std::vector<int64_t>{kSteps, kSteps}));
  const std::vector<float> want = ExpectedSgd(layout, 2, kSteps);
  const std::vector<float> got = ReadNewest(*shard);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
}

// A push that a reading pull held up past its deadline says whose push it
// was and what held it up; it is withdrawn, and goes through when retried.
TEST(ModelShardAsyncTest, APushHeldUpPastItsDeadlineSaysWhoseAndWhy) {
  ThreadPool pool(2);
  std::unique_ptr<ModelShard> shard =
      MakeAsyncShard(&pool, 1, Consistency::kAsync, 0, OptimizerConfig::Sgd(kLr));
  const std::vector<float> g = DyadicGradient(shard->layout(), 0, 1);
  {
    ReadPin pin;
    ASSERT_TRUE(shard->PullTarget(0, absl::InfiniteFuture(), nullptr, {}, &pin).ok());
    absl::StatusOr<ModelShard::PushStart> start =
        shard->BeginPush(0, 1, shard->size(), DType::kFloat32, 1.0, {}, false);
    ASSERT_TRUE(start.ok() && start->writer);
    ASSERT_TRUE(start->writer->Write(0, g.data(), g.size() * sizeof(float)).ok());
    const absl::Status held = start->writer->Commit(absl::Now() + absl::Milliseconds(100)).status();
    EXPECT_EQ(held.code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_TRUE(absl::StrContains(held.message(), "trainer 0's step 1: 1 pull(s) were reading"))
        << held;
  }
  EXPECT_EQ(shard->version(), 0);
  ASSERT_TRUE(PushInChunks(*shard, 0, 1, g, 999).ok());
  EXPECT_EQ(shard->version(), 1);
}

TEST(ModelShardAsyncTest, ACheckpointIsAConsistentCutAndARestoreContinuesExactly) {
  ThreadPool pool(2);
  constexpr uint32_t kTrainers = 2;
  constexpr int64_t kCut = 3, kSteps = 6;
  std::unique_ptr<ModelShard> shard =
      MakeAsyncShard(&pool, kTrainers, Consistency::kAsync, 0, OptimizerConfig::Sgd(kLr));
  ModelShard::StepHold hold = shard->HoldStep(kCut);
  ShardProgress saved;
  std::vector<float> saved_params;
  std::thread checkpointer([&] {
    const absl::Status s = shard->CheckpointAt(
        kCut, absl::InfiniteFuture(), nullptr,
        [&](const ShardProgress& progress, const ShardStateReadFn& read) {
          saved = progress;
          saved_params.resize(shard->size());
          return read(-1, 0, saved_params.size(), saved_params.data());
        },
        std::move(hold));
    EXPECT_TRUE(s.ok()) << s;
  });
  std::vector<std::string> errors;
  RunTrainers(*shard, kTrainers, 1, kSteps, &errors);
  checkpointer.join();
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(saved.trainer_steps, (std::vector<int64_t>(kTrainers, kCut)));
  EXPECT_EQ(saved.version, kTrainers * kCut);
  const std::vector<float> at_cut = ExpectedSgd(shard->layout(), kTrainers, kCut);
  ASSERT_EQ(std::memcmp(saved_params.data(), at_cut.data(), at_cut.size() * sizeof(float)), 0);
  // Past the cut now: refused, naming where the shard is.
  absl::Status late = shard->CheckpointAt(
      kCut - 1, absl::InfiniteFuture(), nullptr,
      [](const ShardProgress&, const ShardStateReadFn&) { return absl::OkStatus(); });
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(late.message(), "applied trainers' steps [6, 6]")) << late;

  // A shard restored from the cut takes the rest of the pushes and ends
  // where the first one did; pushes it already holds are acknowledged.
  std::unique_ptr<ModelShard> restored = MakeAsyncShard(&pool, kTrainers, Consistency::kAsync, 0,
                                                        OptimizerConfig::Sgd(kLr), saved_params);
  ASSERT_TRUE(
      restored->Restore(saved, [](int, uint64_t, uint64_t, float*) { return absl::OkStatus(); })
          .ok());
  EXPECT_EQ(restored->version(), kTrainers * kCut);
  EXPECT_EQ(restored->checkpoint_step(), kCut);
  EXPECT_EQ(
      PushInChunks(*restored, 0, kCut, DyadicGradient(restored->layout(), 0, kCut), 999)->outcome,
      PushOutcome::kAlreadyApplied);
  RunTrainers(*restored, kTrainers, kCut + 1, kSteps, &errors);
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  const std::vector<float> a = ReadNewest(*shard), b = ReadNewest(*restored);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  // A record whose version is not the sum of its steps is refused.
  std::unique_ptr<ModelShard> fresh =
      MakeAsyncShard(&pool, kTrainers, Consistency::kAsync, 0, OptimizerConfig::Sgd(kLr));
  ShardProgress wrong = saved;
  wrong.version += 1;
  wrong.optimizer_steps += 1;
  EXPECT_EQ(fresh->Restore(wrong, [](int, uint64_t, uint64_t, float*) { return absl::OkStatus(); })
                .code(),
            absl::StatusCode::kInvalidArgument);
  // So is one whose updates and skips do not add up to its version (it
  // would count version - skipped updates, and Adam's bias correction with
  // them).
  ShardProgress miscounted = saved;
  miscounted.optimizer_steps -= 1;
  const absl::Status refused =
      fresh->Restore(miscounted, [](int, uint64_t, uint64_t, float*) { return absl::OkStatus(); });
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "add up")) << refused;
  EXPECT_EQ(fresh->version(), 0);
}

TEST(ModelShardAsyncTest, PinnedPullsReadWholeVersions) {
  ThreadPool pool(2);
  constexpr uint32_t kTrainers = 2;
  std::unique_ptr<ModelShard> shard =
      MakeAsyncShard(&pool, kTrainers, Consistency::kAsync, 0, OptimizerConfig::Sgd(kLr));
  const ModelLayout& layout = shard->layout();
  std::atomic<bool> done{false};
  std::vector<std::string> errors;
  std::thread trainers([&] {
    RunTrainers(*shard, kTrainers, 1, 30, &errors);
    done = true;
  });
  const std::vector<float> p0 = DyadicStart(layout);
  int reads = 0, checked = 0;
  std::vector<float> out(shard->size());
  std::string failure;
  while (failure.empty() && (!done.load() || reads == 0)) {
    ReadPin pin;
    absl::StatusOr<int64_t> version =
        shard->PullTarget(0, absl::InfiniteFuture(), nullptr, {}, &pin);
    if (!version.ok()) {
      failure = version.status().ToString();
      break;
    }
    // In pieces, as the service streams it: none is aborted.
    for (uint64_t offset = 0; offset < out.size() && failure.empty(); offset += 1000) {
      const uint64_t n = std::min<uint64_t>(1000, out.size() - offset);
      absl::Status s = shard->WaitForRanges(*version, offset, n, absl::InfiniteFuture(), nullptr);
      if (s.ok()) s = shard->ReadParameters(*version, offset, n, out.data() + offset);
      if (!s.ok()) failure = absl::StrCat("version ", *version, ": ", s.ToString());
    }
    // Every fifth read: the values are p0 - lr * (the pushes applied, which
    // the pin keeps as they are), exactly.
    if (failure.empty() && reads++ % 5 == 0) {
      const ShardSnapshot snap = shard->Snapshot("", 0, 0, false).value();
      if (static_cast<int64_t>(snap.applied_order.size()) != *version) {
        failure = absl::StrCat(snap.applied_order.size(), " pushes applied at version ", *version);
        break;
      }
      std::vector<double> sum(out.size(), 0.0);
      for (const auto& [rank, step] : snap.applied_order) {
        const std::vector<float> g = DyadicGradient(layout, rank, step);
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += g[i];
      }
      for (size_t i = 0; i < out.size(); ++i) {
        if (out[i] != static_cast<float>(p0[i] - kLr * sum[i])) {
          failure = absl::StrCat("version ", *version, " element ", i, ": ", out[i]);
          break;
        }
      }
      ++checked;
    }
  }
  trainers.join();
  EXPECT_EQ(failure, "");
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  EXPECT_GT(checked, 0);
}

// A trainer's skipped step (its own overflow under loss scaling): applied as
// a no-op in its place, the optimizer's step count without it; a scaled push
// is unscaled here (the trainer pushes its gradient still scaled, as in
// synchronous mode), a non-finite one refused (each trainer skips its own).
TEST(ModelShardAsyncTest, ASkippedStepChangesNothingButTheRecord) {
  ThreadPool pool(1);
  const OptimizerConfig adam = OptimizerConfig::Adam(0.01);
  ModelShardOptions options{"m", TestLayout(), kShard, adam, 2, true};
  options.consistency = Consistency::kAsync;
  options.loss_scaling = true;  // The trainers'; the shard takes no decision.
  std::unique_ptr<ModelShard> shard =
      ModelShard::Create(options, DyadicStart(options.layout), &pool).value();
  const size_t n = shard->size();
  ASSERT_TRUE(testing::PushAll(*shard, 0, 1).ok());
  const std::vector<float> before = ReadNewest(*shard);
  absl::StatusOr<ModelShard::PushStart> skip =
      shard->BeginPush(1, 1, n, DType::kFloat32, 1.0, {}, false, /*skip=*/true);
  ASSERT_TRUE(skip.ok() && skip->writer) << skip.status();
  const std::vector<float> g = testing::RandomGradient(1, 1, n);
  EXPECT_EQ(skip->writer->Write(0, g.data(), 4 * sizeof(float)).code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<PushResult> skipped = skip->writer->Commit();
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_EQ(skipped->trainer_steps, (std::vector<int64_t>{1, 1}));
  const std::vector<float> after = ReadNewest(*shard);
  EXPECT_EQ(std::memcmp(before.data(), after.data(), n * sizeof(float)), 0);
  ShardSnapshot snap = shard->Snapshot("", 0, 0, false).value();
  EXPECT_EQ(snap.version, 2);
  EXPECT_EQ(snap.optimizer_steps, 1);
  EXPECT_EQ(snap.skipped_steps, 1);
  // The next update is the optimizer's step 2, as if the skip never was.
  ASSERT_TRUE(testing::PushAll(*shard, 1, 2).ok());
  std::vector<float> params = DyadicStart(options.layout);
  std::unique_ptr<Optimizer> reference = Optimizer::Create(adam, n).value();
  reference->Update(1, params.data(), testing::RandomGradient(0, 1, n).data(), 0, n);
  reference->Update(2, params.data(), testing::RandomGradient(1, 2, n).data(), 0, n);
  const std::vector<float> got = ReadNewest(*shard);
  EXPECT_EQ(std::memcmp(got.data(), params.data(), n * sizeof(float)), 0);
  // Trainer 0's step 2, its gradient times 4 with scale 4: applied as the
  // gradient itself (the optimizer's step 3).
  const std::vector<float> g2 = testing::RandomGradient(0, 2, n);
  std::vector<float> scaled = g2;
  for (float& v : scaled) v *= 4.0f;
  absl::StatusOr<ModelShard::PushStart> scaled_push =
      shard->BeginPush(0, 2, n, DType::kFloat32, 4.0, {}, false, false);
  ASSERT_TRUE(scaled_push.ok() && scaled_push->writer) << scaled_push.status();
  ASSERT_TRUE(scaled_push->writer->Write(0, scaled.data(), n * sizeof(float)).ok());
  ASSERT_TRUE(scaled_push->writer->Commit().ok());
  reference->Update(3, params.data(), g2.data(), 0, n);
  const std::vector<float> unscaled = ReadNewest(*shard);
  EXPECT_EQ(std::memcmp(unscaled.data(), params.data(), n * sizeof(float)), 0);
  // Inf is the trainer's to handle (it skips the step).
  std::vector<float> inf = testing::RandomGradient(0, 3, n);
  inf[7] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(PushInChunks(*shard, 0, 3, inf, 999).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard->version(), 4);
  // A model without loss scaling takes no scale.
  ModelShardOptions unscaled_options = options;
  unscaled_options.loss_scaling = false;
  std::unique_ptr<ModelShard> plain =
      ModelShard::Create(unscaled_options, DyadicStart(options.layout), &pool).value();
  EXPECT_EQ(plain->BeginPush(0, 1, n, DType::kFloat32, 4.0).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Nor a skip (only a loss scaler's overflow skips a step).
  EXPECT_EQ(
      plain->BeginPush(0, 1, n, DType::kFloat32, 1.0, {}, false, /*skip=*/true).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plain->version(), 0);
  // A synchronous shard refuses a trainer's skip.
  std::unique_ptr<ModelShard> sync = testing::MakeShard(&pool, 2);
  EXPECT_EQ(
      sync->BeginPush(0, 1, sync->size(), DType::kFloat32, 1.0, {}, false, true).status().code(),
      absl::StatusCode::kInvalidArgument);
}

// Two shards that applied the same pushes in different orders save the same
// progress at a uniform cut, skipped steps and a changing lr included, so
// that their checkpoint parts agree (common/checkpoint_files.h,
// SameProgress): shard A gets trainer 0's step 2 last of the steps it
// applies, shard B trainer 1's step 1, and trainer 1 skips its step 2.
TEST(ModelShardAsyncTest, TheCutsProgressDoesNotDependOnTheOrderOfPushes) {
  ThreadPool pool(1);
  ModelShardOptions options{"m", TestLayout(), kShard, OptimizerConfig::Sgd(kLr), 2, true};
  options.consistency = Consistency::kAsync;
  options.loss_scaling = true;
  options.lr_schedule.kind = LrSchedule::Kind::kWarmup;
  options.lr_schedule.warmup_steps = 4;  // lr(1) != lr(2).
  std::unique_ptr<ModelShard> a =
      ModelShard::Create(options, DyadicStart(options.layout), &pool).value();
  std::unique_ptr<ModelShard> b =
      ModelShard::Create(options, DyadicStart(options.layout), &pool).value();
  const auto push = [&](ModelShard& shard, uint32_t rank, int64_t step) {
    ASSERT_TRUE(
        PushInChunks(shard, rank, step, DyadicGradient(options.layout, rank, step), 999).ok());
  };
  const auto skip = [&](ModelShard& shard, uint32_t rank, int64_t step) {
    absl::StatusOr<ModelShard::PushStart> start =
        shard.BeginPush(rank, step, shard.size(), DType::kFloat32, 1.0, {}, false, true);
    ASSERT_TRUE(start.ok() && start->writer) << start.status();
    ASSERT_TRUE(start->writer->Commit().ok());
  };
  push(*a, 0, 1);
  push(*a, 1, 1);
  push(*a, 0, 2);
  skip(*a, 1, 2);
  push(*b, 0, 1);
  push(*b, 0, 2);
  push(*b, 1, 1);
  skip(*b, 1, 2);
  const auto progress_at_cut = [](ModelShard& shard) {
    ShardProgress saved;
    const absl::Status s =
        shard.CheckpointAt(2, absl::Now() + absl::Seconds(10), nullptr,
                           [&](const ShardProgress& progress, const ShardStateReadFn&) {
                             saved = progress;
                             return absl::OkStatus();
                           });
    EXPECT_TRUE(s.ok()) << s;
    return saved;
  };
  const ShardProgress pa = progress_at_cut(*a), pb = progress_at_cut(*b);
  EXPECT_EQ(pa.version, 4);
  EXPECT_EQ(pa.skipped_steps, 1);
  EXPECT_EQ(pa.trainer_steps, pb.trainer_steps);
  EXPECT_EQ(pa.optimizer_steps, pb.optimizer_steps);
  EXPECT_EQ(pa.last_lr, options.lr_schedule.LearningRate(kLr, 2));
  EXPECT_EQ(pa.last_lr, pb.last_lr) << "the saved lr depends on the order of the pushes";
  EXPECT_EQ(pa.version_lr, pb.version_lr);
}

TEST(ModelShardAsyncTest, SynchronousOnlyCallsAreRefused) {
  ThreadPool pool(1);
  std::unique_ptr<ModelShard> shard =
      MakeAsyncShard(&pool, 2, Consistency::kAsync, 0, OptimizerConfig::Sgd(kLr));
  EXPECT_EQ(shard->Decide(1, StepDecision{}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard->WaitForStepStats(1, absl::InfiniteFuture(), nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard->SetHyperparameters(5, Hyperparameters{OptimizerConfig::Sgd(0.5), {}}).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard->DiscardPendingPushes().code(), absl::StatusCode::kFailedPrecondition);
  std::vector<StepState::CarriedChange> changes{
      {3, Hyperparameters{OptimizerConfig::Sgd(0.5), {}}}};
  absl::Status carried =
      shard->BeginPush(0, 1, shard->size(), DType::kFloat32, 1.0, changes, false).status();
  EXPECT_EQ(carried.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(carried.message(), "only in synchronous mode")) << carried;
  // A staleness outside bounded mode does not go with it.
  ModelShardOptions options{"m", TestLayout(), kShard, OptimizerConfig::Sgd(kLr), 2, true};
  options.consistency = Consistency::kAsync;
  options.staleness = 2;
  EXPECT_EQ(ModelShard::Create(options, DyadicStart(options.layout), &pool).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard->version(), 0);
}

}  // namespace
}  // namespace shardopt
