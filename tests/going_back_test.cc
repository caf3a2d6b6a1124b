// The operator's going back against a real shard process with periodic
// checkpoints (--checkpoint_dir=ROOT, every 2 steps): a restart on a
// checkpoint other than the newest of ROOT starts another timeline, and
// ROOT's step directories from there on belong to the one given up. They
// are set aside, so that neither the new timeline's saves of those steps
// (which would find them committed and write nothing) nor a later restart
// from ROOT take them for its own. Whichever way the checkpoint is named:
// ROOT's own step directory, or a copy of the whole root (a backup); the
// root reached through a symlink is no going back.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/trainer_client.h"
#include "common/checkpoint_files.h"
#include "gtest/gtest.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "tests/support/process.h"
#include "tests/support/raw_calls.h"

namespace shardopt::testing {
namespace {

constexpr size_t kElements = 4096;
constexpr char kModel[] = "back";

bool DirectoryExists(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

class GoingBackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = MakeTempDir("go_back");
    flags_ = {"--checkpoint_dir=" + root_, "--checkpoint_every=2", "--checkpoint_keep=5"};
    server_ = ServerProcess::Start(0, 1, flags_);
    ASSERT_TRUE(server_.ok()) << server_.status();
    address_ = (*server_)->address();
    // SGD, lr 1/2, on one tensor from 1/4.
    spec_.model_id = kModel;
    spec_.tensors = {TensorSpec{"w", {static_cast<int64_t>(kElements)}, DType::kFloat32}};
    spec_.optimizer = OptimizerConfig::Sgd(0.5);
    spec_.num_trainers = 1;
  }

  std::string StepDir(const std::string& root, int64_t step) const {
    return absl::StrCat(root, "/", kModel, "/", CheckpointStepDirName(step));
  }

  std::unique_ptr<TrainerClient> Trainer() {
    return TrainerClient::Connect({address_}, TrainerClientOptions()).value();
  }

  // Steps `from`..`to` with gradient `grad` from where the model is (`from`
  // 1: registers it); one parameter's value then.
  float Train(int64_t from, int64_t to, float grad) {
    std::unique_ptr<TrainerClient> t = Trainer();
    std::vector<float> params(kElements, 0.25f);
    if (from == 1) {
      EXPECT_TRUE(t->Register(spec_, params).ok());
    } else {
      EXPECT_TRUE(t->Attach(spec_).ok());
      EXPECT_EQ(t->PullToResume(absl::MakeSpan(params)).value(), from - 1);
    }
    for (int64_t step = from; step <= to; ++step) {
      EXPECT_TRUE(t->Step(step, std::vector<float>(kElements, grad), absl::MakeSpan(params)).ok());
    }
    return params[0];
  }

  // Waits (bounded: 5 s) for a committed checkpoint of `step` or later.
  bool CommittedThrough(int64_t step) {
    auto stub = NewStub(address_);
    v1::InspectResponse inspect;
    for (int i = 0; i < 500 && inspect.newest_committed_checkpoint() < step; ++i) {
      EXPECT_TRUE(RawInspect(*stub, kModel, &inspect).ok());
      absl::SleepFor(absl::Milliseconds(10));
    }
    return inspect.newest_committed_checkpoint() >= step;
  }

  // kill -9, then a start on the same address with --restore_from.
  void Restart(const std::string& restore_from) {
    (*server_)->process().Signal(SIGKILL);
    ASSERT_TRUE((*server_)->process().Wait(absl::Seconds(10)).has_value());
    std::vector<std::string> flags = flags_;
    flags.push_back("--restore_from=" + restore_from);
    server_ = StartServerAt(address_, 0, 1, flags);
    ASSERT_TRUE(server_.ok()) << server_.status();
  }

  // Where a trainer that comes back finds the model: version, a value.
  std::pair<int64_t, float> Resume() {
    std::unique_ptr<TrainerClient> t = Trainer();
    EXPECT_TRUE(t->Attach(spec_).ok());
    std::vector<float> params(kElements);
    const int64_t version = t->PullToResume(absl::MakeSpan(params)).value_or(-1);
    return {version, params[0]};
  }

  // A start left naming `restore_from` is refused (it would give up the
  // steps saved since), and `kept` stays.
  void ExpectAStaleRestartRefused(const std::string& restore_from, const std::string& kept) {
    std::vector<std::string> stale = flags_;
    stale.push_back("--restore_from=" + restore_from);
    const std::optional<int> refused = ServerExitsAtStart(stale);
    EXPECT_TRUE(refused.has_value() && *refused != 0) << "it started (or was killed)";
    EXPECT_TRUE(DirectoryExists(kept));
  }

  std::string root_;
  std::vector<std::string> flags_;
  absl::StatusOr<std::unique_ptr<ServerProcess>> server_;
  std::string address_;
  ModelSpec spec_;
};

// By its step directory (--restore_from=ROOT/m/step-N, as a state dict's
// message says).
TEST_F(GoingBackTest, ToANamedStepOfTheRootGivesUpTheLaterSteps) {
  // Gradient 1/8 for 8 steps gives -1/4.
  EXPECT_EQ(Train(1, 8, 0.125f), -0.25f);
  ASSERT_TRUE(CommittedThrough(8));

  ASSERT_NO_FATAL_FAILURE(Restart(StepDir(root_, 4)));
  EXPECT_FALSE(DirectoryExists(StepDir(root_, 6)));
  EXPECT_FALSE(DirectoryExists(StepDir(root_, 8)));
  // Another timeline from step 4 (0): gradient 1/4 gives -1/2 at step 8.
  EXPECT_EQ(Train(5, 8, 0.25f), -0.5f);
  ASSERT_TRUE(CommittedThrough(8));
  EXPECT_TRUE(DirectoryExists(StepDir(root_, 4))) << "pruned below the kept";
  ExpectAStaleRestartRefused(StepDir(root_, 4), StepDir(root_, 8));
  ASSERT_NO_FATAL_FAILURE(Restart(root_));
  EXPECT_EQ(Resume(), std::make_pair(int64_t{8}, -0.5f)) << "restored the abandoned timeline";
}

// By a copy of the whole root (a backup) given as --restore_from while
// --checkpoint_dir still holds the same run's later steps: that is going
// back too (it was taken for a crash restart, and the new timeline's saves
// of steps 6 and 8 found the old ones committed).
TEST_F(GoingBackTest, ToACopyOfTheRootGivesUpTheRootsLaterSteps) {
  const std::string backup = MakeTempDir("go_back_backup");
  EXPECT_EQ(Train(1, 4, 0.125f), 0.0f);
  ASSERT_TRUE(CommittedThrough(4));
  ASSERT_EQ(system(absl::StrCat("cp -a ", root_, "/", kModel, " ", backup, "/").c_str()), 0);
  EXPECT_EQ(Train(5, 8, 0.125f), -0.25f);
  ASSERT_TRUE(CommittedThrough(8));

  ASSERT_NO_FATAL_FAILURE(Restart(backup));
  for (int64_t later : {6, 8}) EXPECT_FALSE(DirectoryExists(StepDir(root_, later))) << later;
  EXPECT_EQ(Train(5, 8, 0.25f), -0.5f);
  ASSERT_TRUE(CommittedThrough(8));
  ExpectAStaleRestartRefused(backup, StepDir(root_, 8));
  ASSERT_NO_FATAL_FAILURE(Restart(root_));
  EXPECT_EQ(Resume(), std::make_pair(int64_t{8}, -0.5f)) << "restored the abandoned timeline";
}

// A restart whose --restore_from reaches --checkpoint_dir through a symlink
// is a restart from the root, not a going back: nothing is set aside (it
// set the newest step aside and saved it again at every restart).
TEST_F(GoingBackTest, TheRootThroughASymlinkIsNoGoingBack) {
  const std::string link = MakeTempDir("go_back_link") + "/root";
  ASSERT_EQ(symlink(root_.c_str(), link.c_str()), 0);
  EXPECT_EQ(Train(1, 4, 0.125f), 0.0f);
  ASSERT_TRUE(CommittedThrough(4));
  ASSERT_NO_FATAL_FAILURE(Restart(link));
  EXPECT_EQ(Resume(), std::make_pair(int64_t{4}, 0.0f));
  struct stat marker;
  EXPECT_NE(stat(absl::StrCat(root_, "/", kModel, "/.went-back-to-step-00000004").c_str(), &marker),
            0)
      << "taken for a going back";
  EXPECT_EQ(system(absl::StrCat("ls -a ", root_, "/", kModel, " | grep -q abandoned").c_str()), 256)
      << "a step directory was set aside";
}

}  // namespace
}  // namespace shardopt::testing
