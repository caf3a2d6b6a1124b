// ModelShard without gRPC: what controls a step - hyperparameter changes,
// gradient clipping and loss scaling decisions, bad creation arguments, and
// checkpoint holds of a step boundary (with a restore from what was saved).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "server/model_shard.h"
#include "server/model_shard_testing.h"
#include "server/optim/optimizer.h"

namespace shardopt {
namespace {

using testing::kShard;
using testing::kShards;
using testing::MakeShard;
using testing::PushAll;
using testing::RandomGradient;
using testing::ReadAll;
using testing::TestLayout;
using testing::ZeroPadding;

TEST(ModelShardTest, HyperparameterChangeTakesEffectAtItsStepAndRepeatsAreHarmless) {
  ThreadPool pool(1);
  std::unique_ptr<ModelShard> shard = MakeShard(&pool, 1, OptimizerConfig::Sgd(0.1));
  const Hyperparameters next{OptimizerConfig::Sgd(0.5), LrSchedule()};
  Hyperparameters other = next;
  other.optimizer.lr = 0.7;
  ASSERT_TRUE(shard->SetHyperparameters(2, next).ok());
  EXPECT_TRUE(shard->SetHyperparameters(2, next).ok());  // Repeat.
  EXPECT_EQ(shard->SetHyperparameters(2, other).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard->SetHyperparameters(3, {OptimizerConfig::Adam(0.1), LrSchedule()}).code(),
            absl::StatusCode::kFailedPrecondition);  // Another optimizer kind.

  std::vector<float> expected = ReadAll(*shard, 0);
  for (int64_t step = 1; step <= 2; ++step) {
    ASSERT_TRUE(PushAll(*shard, 0, step).ok());
    const std::vector<float> g = RandomGradient(0, step, shard->size());
    const float lr = step == 1 ? 0.1f : 0.5f;
    for (size_t i = 0; i < expected.size(); ++i) expected[i] = expected[i] + (-lr) * g[i];
  }
  EXPECT_EQ(ReadAll(*shard, 2), expected);
  ShardSnapshot snap = shard->Snapshot("", 0, 0, false).value();
  EXPECT_DOUBLE_EQ(snap.last_lr, 0.5);
  EXPECT_TRUE(snap.scheduled_changes.empty());

  // After the change took effect: an identical repeat (a retry after a lost
  // reply) is still OK, anything else is refused.
  EXPECT_TRUE(shard->SetHyperparameters(2, next).ok());
  EXPECT_EQ(shard->SetHyperparameters(2, other).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard->SetHyperparameters(1, next).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard->CancelHyperparameters(2).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(shard->SetHyperparameters(5, other).ok());
  ASSERT_TRUE(shard->CancelHyperparameters(5).ok());
  EXPECT_TRUE(shard->CancelHyperparameters(6).ok());  // Nothing there: still OK.
  EXPECT_TRUE(shard->Snapshot("", 0, 0, false).value().scheduled_changes.empty());
}

// A change for a step one shard has applied and another has not: the first
// refuses, the second accepts, and cancelling on the second makes them agree
// again (why TrainerClient only schedules steps its trainer has not pushed).
TEST(ModelShardTest, PartlyAcceptedChangeCanBeCancelled) {
  ThreadPool pool(1);
  std::unique_ptr<ModelShard> a = MakeShard(&pool, 2, OptimizerConfig::Sgd(0.1));
  std::unique_ptr<ModelShard> b = MakeShard(&pool, 2, OptimizerConfig::Sgd(0.1));
  ASSERT_TRUE(PushAll(*a, 0, 1).ok());
  ASSERT_TRUE(PushAll(*a, 1, 1).ok());  // Step 1 applied on a...
  ASSERT_TRUE(PushAll(*b, 0, 1).ok());  // ...still waiting for rank 1 on b.
  const Hyperparameters next{OptimizerConfig::Sgd(0.5), LrSchedule()};
  EXPECT_EQ(a->SetHyperparameters(1, next).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(b->SetHyperparameters(1, next).ok());
  ASSERT_TRUE(b->CancelHyperparameters(1).ok());
  ASSERT_TRUE(PushAll(*b, 1, 1).ok());
  EXPECT_DOUBLE_EQ(a->Snapshot("", 0, 0, false).value().last_lr, 0.1);
  EXPECT_DOUBLE_EQ(b->Snapshot("", 0, 0, false).value().last_lr, 0.1);
}

// Gradient control: the last push reduces and reports; nothing changes until
// the decision; a skip leaves everything (also the optimizer's step count)
// as it was; clipping and unscaling multiply the reduced gradient.
TEST(ModelShardTest, StepsWithGradientControlWaitForTheirDecision) {
  ThreadPool pool(2);
  ModelShardOptions options{"m", TestLayout(), kShard, OptimizerConfig::Adam(0.01), 2, true};
  options.max_grad_norm = 1.0;
  options.loss_scaling = true;
  std::vector<float> init(options.layout.ShardSize(0), 0.5f);
  testing::ZeroPadding(options.layout, kShard, &init);
  std::unique_ptr<ModelShard> shard = ModelShard::Create(options, init, &pool).value();
  const size_t n = shard->size();
  auto push = [&](uint32_t rank, int64_t step, std::vector<float> g, double scale) {
    auto start = shard->BeginPush(rank, step, n, DType::kFloat32, scale);
    if (!start.ok()) return start.status();
    if (absl::Status s = start->writer->Write(0, g.data(), n * sizeof(float)); !s.ok()) return s;
    return start->writer->Commit().status();
  };
  const double scale = 1024.0;
  std::vector<float> g0 = RandomGradient(0, 1, n), g1 = RandomGradient(1, 1, n);
  for (float& v : g0) v *= static_cast<float>(scale);
  for (float& v : g1) v *= static_cast<float>(scale);
  // Step 1: rank 1's gradient overflowed: accepted, and the step must be skipped.
  std::vector<float> bad = g1;
  bad[17] = std::numeric_limits<float>::infinity();
  ASSERT_TRUE(push(0, 1, g0, scale).ok());
  EXPECT_EQ(push(1, 1, bad, 2048.0).code(), absl::StatusCode::kFailedPrecondition);  // Scale.
  EXPECT_EQ(shard->BeginPush(1, 1, n, DType::kFloat32, 2048.0).status().code(),
            absl::StatusCode::kFailedPrecondition);  // Refused before streaming.
  ASSERT_TRUE(push(1, 1, bad, scale).ok());
  StepStats stats = shard->WaitForStepStats(1, absl::Now() + absl::Seconds(5), nullptr).value();
  EXPECT_TRUE(stats.found_inf);
  EXPECT_EQ(shard->version(), 0);
  EXPECT_EQ(shard->Decide(1, {false, 1.0, 0}).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(shard->Decide(1, {true, 1.0, 0}).ok());
  EXPECT_TRUE(shard->Decide(1, {true, 1.0, 0}).ok());  // Repeat.
  // A skip is a skip, whatever else the request says.
  EXPECT_TRUE(shard->Decide(1, {true, 0.5, 0}).ok());
  EXPECT_EQ(shard->Decide(1, {false, 1.0, 0}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard->version(), 1);
  EXPECT_EQ(ReadAll(*shard, 1), init);  // Skipped: nothing moved.

  // Step 2: finite; the norm comes out of the stats; clip by half.
  g0 = RandomGradient(0, 2, n);
  g1 = RandomGradient(1, 2, n);
  std::vector<float> s0 = g0, s1 = g1;
  for (float& v : s0) v *= static_cast<float>(scale);
  for (float& v : s1) v *= static_cast<float>(scale);
  EXPECT_EQ(push(0, 2, s0, 1000.0).code(), absl::StatusCode::kInvalidArgument);  // Not 2^k.
  ASSERT_TRUE(push(0, 2, s0, scale).ok());
  EXPECT_EQ(shard->Decide(2, {false, 1.0, 0}).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(push(1, 2, s1, scale).ok());
  // While step 2 waits for its decision, a change for it is refused (some
  // shards may have decided it already).
  EXPECT_EQ(shard->SetHyperparameters(2, {OptimizerConfig::Adam(0.5), LrSchedule()}).code(),
            absl::StatusCode::kFailedPrecondition);
  stats = shard->WaitForStepStats(2, absl::Now() + absl::Seconds(5), nullptr).value();
  EXPECT_FALSE(stats.found_inf);
  double expected_sum = 0;
  std::vector<float> reduced(n);
  for (size_t i = 0; i < n; ++i) {
    reduced[i] = (s0[i] + s1[i]) / 2.0f;
    const double u = static_cast<double>(reduced[i] * static_cast<float>(1.0 / scale));
    expected_sum += u * u;
  }
  EXPECT_NEAR(stats.sum_of_squares, expected_sum, 1e-9 * expected_sum);
  EXPECT_EQ(shard->version(), 1);
  const double norm = std::sqrt(stats.sum_of_squares);
  const double coef = std::min(1.0, 1.0 / (norm + 1e-6));
  ASSERT_LT(coef, 1.0);
  // A coefficient that does not follow from the norm is refused.
  EXPECT_EQ(shard->Decide(2, {false, coef / 2, norm}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(shard->Decide(2, {false, coef, norm}).ok());
  // Adam's FIRST update (the skipped step did not count), on g * coef / scale.
  std::vector<float> expected = init, g(n);
  for (size_t i = 0; i < n; ++i) {
    g[i] = reduced[i] * (static_cast<float>(coef) * static_cast<float>(1.0 / scale));
  }
  auto adam = Optimizer::Create(OptimizerConfig::Adam(0.01), n).value();
  adam->Update(1, expected.data(), g.data(), 0, n);
  EXPECT_EQ(ReadAll(*shard, 2), expected);
  const ShardSnapshot snap = shard->Snapshot("", 0, 0, false).value();
  EXPECT_EQ(snap.optimizer_steps, 1);
  EXPECT_EQ(snap.skipped_steps, 1);
  EXPECT_EQ(snap.last_step.step, 2);
  EXPECT_DOUBLE_EQ(snap.last_step.decision.clip_coef, coef);
  // The stats of the last decided step are still there for late askers.
  EXPECT_TRUE(shard->WaitForStepStats(2, absl::Now() + absl::Seconds(1), nullptr).ok());
}

TEST(ModelShardTest, DecisionsAreRefusedWithoutGradientControl) {
  ThreadPool pool(1);
  std::unique_ptr<ModelShard> shard = MakeShard(&pool, 1);
  EXPECT_EQ(shard->Decide(1, {true, 1.0, 0}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard->WaitForStepStats(1, absl::Now(), nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard->BeginPush(0, 1, shard->size(), DType::kFloat32, 2.0).status().code(),
            absl::StatusCode::kInvalidArgument);  // No loss scaling registered.
}

TEST(ModelShardTest, CreateRejectsBadInput) {
  ThreadPool pool(1);
  const ModelLayout layout = TestLayout();
  std::vector<float> init(layout.ShardSize(0), 0.0f);
  EXPECT_EQ(ModelShard::Create({"m", layout, kShard, OptimizerConfig::Adam(), 0, true}, init, &pool)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ModelShard::Create({"m", layout, kShards, OptimizerConfig::Adam(), 1, true}, init, &pool)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  std::vector<float> short_init(layout.ShardSize(0) - 1);
  EXPECT_EQ(
      ModelShard::Create({"m", layout, kShard, OptimizerConfig::Adam(), 1, true}, short_init, &pool)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
}

// A checkpoint of step 2 asked for at version 0 sees exactly version 2:
// step 3 waits until the write is done, then applies.
TEST(ModelShardTest, CheckpointHoldsTheStepBoundary) {
  ThreadPool pool(1);
  std::unique_ptr<ModelShard> shard = MakeShard(&pool, 1);
  std::vector<float> saved_params(shard->size());
  std::vector<std::vector<float>> saved_slots(2, std::vector<float>(shard->size()));
  ShardProgress saved;
  absl::Notification writing, release;
  std::thread checkpoint([&] {
    const absl::Status s = shard->CheckpointAt(
        2, absl::Now() + absl::Seconds(30), nullptr,
        [&](const ShardProgress& progress, const ShardStateReadFn& read) {
          saved = progress;
          EXPECT_TRUE(read(-1, 0, shard->size(), saved_params.data()).ok());
          for (int slot = 0; slot < 2; ++slot) {
            EXPECT_TRUE(read(slot, 0, shard->size(), saved_slots[slot].data()).ok());
          }
          writing.Notify();
          release.WaitForNotification();
          return absl::OkStatus();
        });
    EXPECT_TRUE(s.ok()) << s;
  });
  ASSERT_TRUE(PushAll(*shard, 0, 1).ok());
  ASSERT_TRUE(PushAll(*shard, 0, 2).ok());
  writing.WaitForNotification();
  EXPECT_EQ(saved.version, 2);
  EXPECT_EQ(saved.optimizer_steps, 2);
  // Step 3 is pushed but not applied while the checkpoint is being written.
  std::thread step3([&] { EXPECT_TRUE(PushAll(*shard, 0, 3).ok()); });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(shard->version(), 2);
  release.Notify();
  step3.join();
  checkpoint.join();
  EXPECT_EQ(shard->version(), 3);
  // A step already passed cannot be checkpointed any more.
  EXPECT_EQ(shard
                ->CheckpointAt(
                    2, absl::Now() + absl::Seconds(1), nullptr,
                    [](const ShardProgress&, const ShardStateReadFn&) { return absl::OkStatus(); })
                .code(),
            absl::StatusCode::kFailedPrecondition);

  // A shard restored from what was saved continues exactly like the original.
  ModelShardOptions options{"m", TestLayout(), kShard, OptimizerConfig::AdamW(0.01), 1, true};
  std::unique_ptr<ModelShard> restored = ModelShard::Create(options, saved_params, &pool).value();
  const absl::Status s =
      restored->Restore(saved, [&](int slot, uint64_t offset, uint64_t count, float* out) {
        std::copy_n(saved_slots[slot].data() + offset, count, out);
        return absl::OkStatus();
      });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(restored->version(), 2);
  ASSERT_TRUE(PushAll(*restored, 0, 3).ok());
  std::vector<float> a(shard->size()), b(shard->size());
  ASSERT_TRUE(shard->ReadParameters(3, 0, a.size(), a.data()).ok());
  ASSERT_TRUE(restored->ReadParameters(3, 0, b.size(), b.data()).ok());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  // Pushes at or below the restored version are acknowledged, not applied.
  absl::StatusOr<PushResult> old = PushAll(*restored, 0, 3);
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(old->outcome, PushOutcome::kAlreadyApplied);
  // Restoring a shard that has taken pushes is refused.
  EXPECT_EQ(restored->Restore(saved, nullptr).code(), absl::StatusCode::kFailedPrecondition);
}

// Adafactor's packed slots through a checkpoint: the saved slots read as
// full-size (the factors at the start of each tensor's part, zeros
// elsewhere), a shard restored from them continues bit for bit, and saved
// state with a value where no factor is stored is refused as DATA_LOSS.
TEST(ModelShardTest, AdafactorCheckpointRestoresItsFactorsAndRefusesStrayValues) {
  ThreadPool pool(2);
  const ModelLayout layout = ModelLayout::Create({{"w", {37, 19}}, {"b", {5}}, {"m", {3, 4, 7}}},
                                                 16, 1, Partition::kWholeTensors)
                                 .value();
  const ModelShardOptions options{"m", layout, 0, OptimizerConfig::Adafactor(0.05), 1, true};
  std::vector<float> initial(layout.ShardSize(0));
  for (size_t i = 0; i < initial.size(); ++i) initial[i] = 0.01f * static_cast<float>(i % 29);
  ZeroPadding(layout, 0, &initial);
  auto gradient = [&](int64_t step) {
    std::vector<float> g = RandomGradient(0, step, initial.size());
    ZeroPadding(layout, 0, &g);
    return g;
  };
  std::unique_ptr<ModelShard> shard = ModelShard::Create(options, initial, &pool).value();
  // 37 + 19 row and column factors, 5 variances, 12 + 21 factors.
  EXPECT_EQ(shard->Snapshot("", 0, 0, false).value().optimizer_state_bytes,
            (37 + 19 + 5 + 12 + 21) * sizeof(float));
  for (int64_t step = 1; step <= 2; ++step) {
    ASSERT_TRUE(testing::PushInChunks(*shard, 0, step, gradient(step), 100).ok());
  }
  ShardProgress saved;
  std::vector<std::vector<float>> saved_slots(2, std::vector<float>(shard->size(), -1.0f));
  ASSERT_TRUE(
      shard
          ->CheckpointAt(2, absl::Now() + absl::Seconds(30), nullptr,
                         [&](const ShardProgress& progress, const ShardStateReadFn& read) {
                           saved = progress;
                           for (int slot = 0; slot < 2; ++slot) {
                             // In blocks, as the checkpoint writer reads.
                             for (uint64_t at = 0; at < shard->size(); at += 50) {
                               const uint64_t n = std::min<uint64_t>(50, shard->size() - at);
                               if (absl::Status s = read(slot, at, n, &saved_slots[slot][at]);
                                   !s.ok()) {
                                 return s;
                               }
                             }
                           }
                           return absl::OkStatus();
                         })
          .ok());
  const TensorPlacement& w = layout.tensors()[0];
  EXPECT_NE(saved_slots[1][w.offset + 18], 0.0f);  // w's last column factor.
  EXPECT_EQ(saved_slots[1][w.offset + 19], 0.0f);  // Nothing stored after it.
  EXPECT_NE(saved_slots[0][w.offset + 36], 0.0f);  // w's last row factor.
  EXPECT_EQ(saved_slots[0][w.offset + 37], 0.0f);
  const std::vector<float> saved_params = ReadAll(*shard, 2);

  auto reader = [](const std::vector<std::vector<float>>& slots) {
    return [&slots](int slot, uint64_t offset, uint64_t count, float* out) {
      std::copy_n(slots[slot].data() + offset, count, out);
      return absl::OkStatus();
    };
  };
  std::unique_ptr<ModelShard> restored = ModelShard::Create(options, saved_params, &pool).value();
  ASSERT_TRUE(restored->Restore(saved, reader(saved_slots)).ok());
  ASSERT_TRUE(testing::PushInChunks(*shard, 0, 3, gradient(3), 100).ok());
  ASSERT_TRUE(testing::PushInChunks(*restored, 0, 3, gradient(3), 100).ok());
  EXPECT_EQ(ReadAll(*restored, 3), ReadAll(*shard, 3));

  std::vector<std::vector<float>> stray = saved_slots;
  stray[1][w.offset + 19] = 0.5f;
  std::unique_ptr<ModelShard> refused = ModelShard::Create(options, saved_params, &pool).value();
  const absl::Status s = refused->Restore(saved, reader(stray));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("'col_var'"), std::string::npos) << s;
  EXPECT_NE(s.message().find(absl::StrCat("element ", w.offset + 19)), std::string::npos) << s;
  EXPECT_EQ(refused->version(), 0);
}

// A rollback to the current version drops the pushes of the next step; a
// trainer waiting on one of them hears at once that its push is gone.
TEST(ModelShardTest, AWaitOnADroppedPushEndsAtOnce) {
  ThreadPool pool(1);
  std::unique_ptr<ModelShard> shard = MakeShard(&pool, 2);
  ASSERT_TRUE(PushAll(*shard, 0, 1).ok());
  absl::Notification waiting;
  absl::StatusOr<int64_t> pulled;
  std::thread pull([&] {
    waiting.Notify();
    pulled = shard->WaitForVersion(1, absl::Now() + absl::Seconds(30), nullptr,
                                   ModelShard::PushedBy{0, 1});
  });
  waiting.WaitForNotification();
  absl::SleepFor(absl::Milliseconds(50));
  const absl::Time start = absl::Now();
  ASSERT_TRUE(shard->DiscardPendingPushes().ok());
  pull.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(pulled.status().code(), absl::StatusCode::kOutOfRange) << pulled.status();
  EXPECT_EQ(shard->WaitForStepStats(1, absl::Now() + absl::Seconds(1), nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);  // (No gradient control here.)
  // The step is collected afresh.
  ASSERT_TRUE(PushAll(*shard, 0, 1).ok());
  ASSERT_TRUE(PushAll(*shard, 1, 1).ok());
  EXPECT_EQ(shard->version(), 1);
  // A rollback that looked at version 0 drops nothing of step 2: the shard
  // moved on since.
  ASSERT_TRUE(PushAll(*shard, 0, 2).ok());
  EXPECT_EQ(shard->DiscardPendingPushes(/*at_version=*/0).code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(PushAll(*shard, 1, 2).ok());
  EXPECT_EQ(shard->version(), 2);
}

}  // namespace
}  // namespace shardopt
