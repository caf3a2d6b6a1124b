// HostedModel's view of its periodic checkpoints: what a rollback abandons
// leaves the list (and so the recovery floor sent with every push) at once;
// the first one's step is held from the model's making; a step asked for by
// SaveStep and by the saving thread is written once, one at a time, and
// nothing after Stop. And the steps this server applied to a model, which
// /metrics counts.
#include "server/hosted_model.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/checkpoint_testing.h"
#include "common/proto_convert.h"
#include "gtest/gtest.h"
#include "server/model_shard_testing.h"

namespace shardopt {
namespace {

using checkpoint_testing::Config;
using checkpoint_testing::TempDir;
using checkpoint_testing::WritePart;

// Periodic checkpoints of a model into `root` every `every` steps (0: no
// saving thread), through `env`.
PeriodicCheckpointOptions CheckpointsInto(const std::string& root, int64_t every,
                                          FileEnv* env = FileEnv::Default()) {
  PeriodicCheckpointOptions checkpoints;
  checkpoints.model_root = root;
  checkpoints.every = every;
  checkpoints.env = env;
  return checkpoints;
}

TEST(HostedModelTest, AbandonedCheckpointsLeaveTheListAndTheRecoveryFloorAtOnce) {
  const std::string root = TempDir("hosted_abandon");
  for (int64_t step : {4, 8, 12}) {
    for (uint32_t i = 0; i < 2; ++i) {
      ASSERT_TRUE(WritePart(JoinPath(root, CheckpointStepDirName(step)), Config(2), i, step).ok());
    }
  }
  ThreadPool pool(1);
  StateBudget budget(uint64_t{1} << 30, 0);
  const PeriodicCheckpointOptions checkpoints = CheckpointsInto(root, 0);  // No saving thread.
  HostedModel model(v1::ModelConfig(), testing::MakeShard(&pool, 1),
                    budget.Reserve("m", 1).value(), checkpoints);
  EXPECT_EQ(model.committed_checkpoints(), (std::vector<int64_t>{12, 8, 4}));
  EXPECT_EQ(model.recovery_floor(), 8);
  ASSERT_TRUE(model.AbandonCheckpointsAfter(4).ok());
  EXPECT_EQ(model.committed_checkpoints(), (std::vector<int64_t>{4}));
  EXPECT_EQ(model.recovery_floor(), 4);
  // Set aside, not removed.
  int abandoned = 0;
  const std::vector<std::string> names = FileEnv::Default()->ListDirectory(root).value();
  for (const std::string& name : names) {
    abandoned += absl::StartsWith(name, ".abandoned.step-");
  }
  EXPECT_EQ(abandoned, 2);
}

// A model made from a shard that had applied steps already (restored) counts
// from zero; one that replaces another (a rollback to an older state) goes
// on from what the other applied: the count never goes down.
TEST(HostedModelTest, AppliedStepsCountWhatThisServerAppliedAcrossReplacements) {
  ThreadPool pool(1);
  StateBudget budget(uint64_t{1} << 30, 0);
  const auto snapshot = [](HostedModel& m) {
    return m.shard().Snapshot("", 0, 0, /*with_tensor_stats=*/false).value();
  };
  std::unique_ptr<ModelShard> restored = testing::MakeShard(&pool, 1);
  for (int64_t step = 1; step <= 2; ++step) ASSERT_TRUE(testing::PushAll(*restored, 0, step).ok());
  HostedModel first(v1::ModelConfig(), std::move(restored), budget.Reserve("a", 1).value(),
                    PeriodicCheckpointOptions());
  EXPECT_EQ(first.AppliedHere(snapshot(first)).applied, 0);
  for (int64_t step = 3; step <= 5; ++step) {
    ASSERT_TRUE(testing::PushAll(first.shard(), 0, step).ok());
  }
  EXPECT_EQ(snapshot(first).optimizer_steps, 5);
  EXPECT_EQ(first.AppliedHere(snapshot(first)).applied, 3);
  // Replaced by a model at an older state (optimizer steps 0).
  HostedModel second(v1::ModelConfig(), testing::MakeShard(&pool, 1),
                     budget.Reserve("b", 1).value(), PeriodicCheckpointOptions());
  second.TakeOverAppliedSteps(first);
  EXPECT_EQ(second.AppliedHere(snapshot(second)).applied, 3);
  ASSERT_TRUE(testing::PushAll(second.shard(), 0, 1).ok());
  EXPECT_EQ(second.AppliedHere(snapshot(second)).applied, 4);
  EXPECT_EQ(second.AppliedHere(snapshot(second)).skipped, 0);
}

// The configuration of testing::MakeShard's shard (its checkpoints' manifest).
v1::ModelConfig ShardConfig() {
  v1::ModelConfig config;
  config.set_model_id("m");
  *config.mutable_layout() = LayoutToProto(testing::TestLayout());
  *config.mutable_optimizer() = OptimizerConfigToProto(OptimizerConfig::AdamW(0.01));
  config.set_num_trainers(1);
  config.set_shard_count(testing::kShards);
  return config;
}

// The first checkpoint's step is held from the model's making, not from
// when the saving thread first runs: the pushes that come at once (a
// restored shard's trainers catching up) cannot pass it first, which made
// the shard skip that checkpoint (asynchronous: its cut then never
// committed, the other shards' parts waiting alone).
TEST(HostedModelTest, TheFirstCheckpointIsHeldFromTheModelsMaking) {
  for (int round = 0; round < 3; ++round) {
    const std::string root = TempDir(absl::StrCat("hosted_first_hold", round));
    ThreadPool pool(1);
    StateBudget budget(uint64_t{1} << 30, 0);
    const PeriodicCheckpointOptions checkpoints = CheckpointsInto(root, 2);
    HostedModel model(ShardConfig(), testing::MakeShard(&pool, 1), budget.Reserve("m", 1).value(),
                      checkpoints);
    // Pushes from before the saving thread starts (a trainer that finds the
    // model at once) wait at the first checkpoint's step.
    std::thread pushing([&] {
      for (int64_t step = 1; step <= 2; ++step) {
        EXPECT_TRUE(testing::PushAll(model.shard(), 0, step).ok());
      }
    });
    absl::SleepFor(absl::Milliseconds(20));
    model.StartCheckpoints();
    pushing.join();
    testing::ReadAll(model.shard(), 2);
    // (Step 1 waited for checkpoint 0's part, written under its hold.)
    const std::string step0 = JoinPath(root, CheckpointStepDirName(0));
    const absl::StatusOr<std::vector<std::string>> names = FileEnv::Default()->ListDirectory(step0);
    const std::string record = CheckpointPartRecordName(testing::kShard, testing::kShards);
    EXPECT_TRUE(names.ok() && std::find(names->begin(), names->end(), record) != names->end())
        << "round " << round << ": no checkpoint of step 0 in " << step0;
    model.Stop();
  }
}

// Counts the checkpoint data files opened for writing; with
// `fail_set_aside`, its first rename of a step directory aside fails; with
// a pause, each data file's opening waits that long.
class CountingFileEnv : public FileEnvWrapper {
 public:
  explicit CountingFileEnv(FileEnv* target, bool fail_set_aside = false,
                           absl::Duration pause = absl::ZeroDuration())
      : FileEnvWrapper(target), fail_set_aside_(fail_set_aside), pause_(pause) {}
  absl::StatusOr<std::unique_ptr<AtomicFileWriter>> NewAtomicFile(
      const std::string& path) override {
    if (absl::EndsWith(path, ".bin")) {
      data_files_.fetch_add(1);
      absl::SleepFor(pause_);
    }
    return FileEnvWrapper::NewAtomicFile(path);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (fail_set_aside_ && to.find("/.abandoned.") != std::string::npos &&
        !failed_.exchange(true)) {
      return absl::PermissionDeniedError("a fault injected by the test");
    }
    return FileEnvWrapper::Rename(from, to);
  }
  int data_files() const { return data_files_.load(); }

 private:
  const bool fail_set_aside_;
  const absl::Duration pause_;
  std::atomic<int> data_files_{0};
  std::atomic<bool> failed_{false};
};

// A listing of the checkpoint root that hangs (a stalled shared
// filesystem) holds up the refresh that made it, but not a metrics scrape's
// (RefreshCheckpointListUnlessBusy), which takes the list as it was.
TEST(HostedModelTest, AScrapesRefreshDoesNotWaitForAHangingListing) {
  class HangingListEnv : public FileEnvWrapper {
   public:
    explicit HangingListEnv(FileEnv* target) : FileEnvWrapper(target) {}
    absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& dir) override {
      if (hang.load()) {
        entered.Notify();
        released.WaitForNotification();
      }
      return FileEnvWrapper::ListDirectory(dir);
    }
    std::atomic<bool> hang{false};
    absl::Notification entered, released;
  };
  const std::string root = TempDir("hosted_hanging_list");
  ThreadPool pool(1);
  StateBudget budget(uint64_t{1} << 30, 0);
  HangingListEnv env(FileEnv::Default());
  const PeriodicCheckpointOptions checkpoints = CheckpointsInto(root, 2, &env);
  HostedModel model(ShardConfig(), testing::MakeShard(&pool, 1), budget.Reserve("m", 1).value(),
                    checkpoints);
  env.hang.store(true);
  std::thread inspect([&] { model.RefreshCheckpointList(); });
  ASSERT_TRUE(env.entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  absl::Notification scraped;
  std::thread scrape([&] {
    model.RefreshCheckpointListUnlessBusy();
    scraped.Notify();
  });
  EXPECT_TRUE(scraped.WaitForNotificationWithTimeout(absl::Seconds(5)))
      << "the scrape's refresh waited for the hanging listing";
  env.hang.store(false);
  env.released.Notify();
  scrape.join();
  inspect.join();
  model.Stop();
}

// A step asked for by SaveStep (a trainer's Finish) and by the saving
// thread, in either order, or twice, is written once; one a rollback set
// aside is written again.
TEST(HostedModelTest, AStepAskedForTwiceIsWrittenOnce) {
  for (int round = 0; round < 4; ++round) {
    const std::string root = TempDir(absl::StrCat("hosted_save_step", round));
    ThreadPool pool(1);
    StateBudget budget(uint64_t{1} << 30, 0);
    CountingFileEnv env(FileEnv::Default());
    const PeriodicCheckpointOptions checkpoints = CheckpointsInto(root, 2, &env);
    HostedModel model(ShardConfig(), testing::MakeShard(&pool, 1), budget.Reserve("m", 1).value(),
                      checkpoints);
    model.StartCheckpoints();
    for (int64_t step = 1; step <= 2; ++step) {
      ASSERT_TRUE(testing::PushAll(model.shard(), 0, step).ok());
    }
    // (Odd rounds: the saving thread most likely wrote step 2 first.)
    if (round % 2 == 1) absl::SleepFor(absl::Milliseconds(30));
    const auto never = [] { return false; };
    absl::Duration write_time;
    absl::StatusOr<CheckpointPartWritten> first =
        model.SaveStep(2, absl::InfiniteFuture(), never, &write_time);
    ASSERT_TRUE(first.ok()) << first.status();
    absl::StatusOr<CheckpointPartWritten> again =
        model.SaveStep(2, absl::InfiniteFuture(), never, &write_time);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->bytes, 0u);
    EXPECT_EQ(write_time, absl::ZeroDuration());
    // Step 3 waits for the saving thread's hold of step 2: it has saved.
    ASSERT_TRUE(testing::PushAll(model.shard(), 0, 3).ok());
    EXPECT_EQ(env.data_files(), 2) << "round " << round << ": steps 0 and 2, once each";

    // A step the shard is past is refused; one it has not reached is waited
    // for until the deadline.
    EXPECT_TRUE(absl::IsFailedPrecondition(
        model.SaveStep(2, absl::InfiniteFuture(), never, &write_time).status()));
    EXPECT_TRUE(absl::IsDeadlineExceeded(
        model.SaveStep(4, absl::Now() + absl::Milliseconds(20), never, &write_time).status()));
    // Step 3, saved now (no multiple of 2), then set aside by a rollback to
    // step 2 on another shard's behalf: asked for again, it is written again.
    absl::StatusOr<CheckpointPartWritten> third =
        model.SaveStep(3, absl::InfiniteFuture(), never, &write_time);
    ASSERT_TRUE(third.ok()) << third.status();
    EXPECT_GT(third->bytes, 0u);
    ASSERT_TRUE(model.AbandonCheckpointsAfter(2).ok());
    third = model.SaveStep(3, absl::InfiniteFuture(), never, &write_time);
    ASSERT_TRUE(third.ok()) << third.status();
    EXPECT_GT(third->bytes, 0u);
    EXPECT_EQ(env.data_files(), 4);
    model.Stop();
  }
}

// A rollback's set-aside that failed leaves the later step's part in place:
// asked for again, it is written again, not taken as this model's own.
TEST(HostedModelTest, APartLeftByAFailedSetAsideIsWrittenAgain) {
  const std::string root = TempDir("hosted_failed_set_aside");
  ThreadPool pool(1);
  StateBudget budget(uint64_t{1} << 30, 0);
  CountingFileEnv env(FileEnv::Default(), /*fail_set_aside=*/true);
  // (No saving thread.)
  const PeriodicCheckpointOptions checkpoints = CheckpointsInto(root, 0, &env);
  HostedModel model(ShardConfig(), testing::MakeShard(&pool, 1), budget.Reserve("m", 1).value(),
                    checkpoints);
  ASSERT_TRUE(testing::PushAll(model.shard(), 0, 1).ok());
  const auto never = [] { return false; };
  absl::Duration write_time;
  ASSERT_TRUE(model.SaveStep(1, absl::InfiniteFuture(), never, &write_time).ok());
  EXPECT_FALSE(model.AbandonCheckpointsAfter(0).ok());  // The injected failure.
  const absl::StatusOr<CheckpointPartWritten> again =
      model.SaveStep(1, absl::InfiniteFuture(), never, &write_time);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_GT(again->bytes, 0u);
  EXPECT_EQ(env.data_files(), 2);
  model.Stop();
}

// Stop waits for a part being written (a replaced model writes nothing after
// its replacement set the later steps aside), and no write starts after it;
// a second writer waits for the first, within its deadline.
TEST(HostedModelTest, StopWaitsForAPartBeingWrittenAndRefusesLaterOnes) {
  const std::string root = TempDir("hosted_stop_write");
  ThreadPool pool(1);
  StateBudget budget(uint64_t{1} << 30, 0);
  CountingFileEnv env(FileEnv::Default(), false, absl::Milliseconds(300));
  const PeriodicCheckpointOptions checkpoints = CheckpointsInto(root, 0, &env);
  HostedModel model(ShardConfig(), testing::MakeShard(&pool, 1), budget.Reserve("m", 1).value(),
                    checkpoints);
  ASSERT_TRUE(testing::PushAll(model.shard(), 0, 1).ok());
  const auto never = [] { return false; };
  absl::StatusOr<CheckpointPartWritten> first = absl::UnknownError("not run");
  std::thread writing([&] {
    absl::Duration write_time;
    first = model.SaveStep(1, absl::InfiniteFuture(), never, &write_time);
  });
  while (env.data_files() == 0) absl::SleepFor(absl::Milliseconds(1));
  absl::Duration write_time;
  // (Step 1 again, from another caller: it waits for the writer, 300 ms.)
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      model.SaveStep(1, absl::Now() + absl::Milliseconds(50), never, &write_time).status()));
  model.Stop();
  // Returned after the write it found under way.
  const std::string record = JoinPath(JoinPath(root, CheckpointStepDirName(1)),
                                      CheckpointPartRecordName(testing::kShard, testing::kShards));
  EXPECT_TRUE(FileExists(FileEnv::Default(), record));
  writing.join();
  EXPECT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(
      absl::IsUnavailable(model.SaveStep(1, absl::InfiniteFuture(), never, &write_time).status()));
  EXPECT_EQ(env.data_files(), 1);
}

TEST(HostedModelTest, SaveStepWithoutPeriodicCheckpointsIsRefused) {
  ThreadPool pool(1);
  StateBudget budget(uint64_t{1} << 30, 0);
  HostedModel model(ShardConfig(), testing::MakeShard(&pool, 1), budget.Reserve("m", 1).value(),
                    PeriodicCheckpointOptions());
  absl::Duration write_time;
  const absl::StatusOr<CheckpointPartWritten> saved = model.SaveStep(
      0, absl::InfiniteFuture(), [] { return false; }, &write_time);
  EXPECT_TRUE(absl::IsFailedPrecondition(saved.status())) << saved.status();
}

}  // namespace
}  // namespace shardopt
