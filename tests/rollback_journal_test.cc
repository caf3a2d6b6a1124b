// Rollbacks against a real shard process with periodic checkpoints: a
// trainer with a journal that was away while another rolled the job back
// drops, when it attaches again, its journaled pushes of the steps given up
// (past the next one) and pushes the gradient it computes now for them; and
// a rollback whose set-aside of the later step directories failed is not
// taken for done; and the operator's going back (a restart on a named older
// checkpoint) gives up the later steps' directories as a rollback does.
#include <signal.h>
#include <sys/stat.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "client/trainer_client.h"
#include "gtest/gtest.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "tests/support/process.h"
#include "tests/support/raw_calls.h"

namespace shardopt::testing {
namespace {

constexpr size_t kElements = 4096;

bool DirectoryExists(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

// SGD (lr 1/2) on one tensor of kElements, for `trainers` trainers.
ModelSpec SgdSpec(const std::string& model_id, uint32_t trainers) {
  ModelSpec spec;
  spec.model_id = model_id;
  spec.tensors = {TensorSpec{"w", {static_cast<int64_t>(kElements)}, DType::kFloat32}};
  spec.optimizer = OptimizerConfig::Sgd(0.5);
  spec.num_trainers = trainers;
  return spec;
}

// Both trainers take step `step`, each with its own gradient value.
void BothStep(TrainerClient& a, TrainerClient& b, int64_t step, float grad_a, float grad_b,
              std::vector<float>* params_a, std::vector<float>* params_b) {
  const std::vector<float> ga(kElements, grad_a), gb(kElements, grad_b);
  std::thread t([&] {
    const absl::StatusOr<StepResult> r = b.Step(step, gb, absl::MakeSpan(*params_b));
    EXPECT_TRUE(r.ok()) << r.status();
  });
  const absl::StatusOr<StepResult> r = a.Step(step, ga, absl::MakeSpan(*params_a));
  EXPECT_TRUE(r.ok()) << r.status();
  t.join();
}

TEST(RollbackJournalTest, PushesOfStepsGivenUpWhileTheTrainerWasAwayGo) {
  const std::string checkpoints = MakeTempDir("rollback_journal_ckpt");
  const std::string journal = MakeTempDir("rollback_journal");
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(0, 1, {"--checkpoint_dir=" + checkpoints, "--checkpoint_every=2"});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::vector<std::string> addresses = {(*server)->address()};
  auto stub = NewStub((*server)->address());
  const ModelSpec spec = SgdSpec("away", 2);
  TrainerClientOptions plain;
  plain.retry_budget = absl::Seconds(10);
  TrainerClientOptions journaled = plain;
  journaled.trainer_rank = 1;
  journaled.journal_path = journal;
  std::vector<float> params(kElements, 0.25f), other(kElements);
  {
    std::unique_ptr<TrainerClient> t0 = TrainerClient::Connect(addresses, plain).value();
    std::unique_ptr<TrainerClient> t1 = TrainerClient::Connect(addresses, journaled).value();
    ASSERT_TRUE(t0->Register(spec, params).ok());
    ASSERT_TRUE(t1->Attach(spec).ok());
    for (int64_t step = 1; step <= 3; ++step) {
      ASSERT_NO_FATAL_FAILURE(BothStep(*t0, *t1, step, 0.125f, 0.125f, &params, &other));
    }
    v1::InspectResponse inspect;
    for (int i = 0; i < 500 && inspect.newest_committed_checkpoint() < 2; ++i) {
      ASSERT_TRUE(RawInspect(*stub, "away", &inspect).ok());
      absl::SleepFor(absl::Milliseconds(10));
    }
    ASSERT_EQ(inspect.newest_committed_checkpoint(), 2);
    // Trainer 1 journals and pushes step 4, then goes away.
    ASSERT_TRUE(t1->Push(4, std::vector<float>(kElements, 0.125f)).ok());
  }
  // Meanwhile the job goes back to the checkpoint of step 2 (as a trainer's
  // recovery would roll it back): steps 3 and 4 are given up.
  v1::InspectResponse inspect;
  ASSERT_TRUE(RawInspect(*stub, "away", &inspect).ok());
  v1::RollBackRequest rollback;
  rollback.set_model_id("away");
  rollback.set_to_step(2);
  rollback.set_expected_incarnation(inspect.incarnation());
  rollback.set_reason("the test");
  v1::RollBackResponse rolled;
  grpc::ClientContext context;
  const grpc::Status s = stub->RollBack(&context, rollback, &rolled);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(rolled.version(), 2);

  // Both come back; trainer 1 with its journal of steps 3 and 4.
  std::unique_ptr<TrainerClient> t0 = TrainerClient::Connect(addresses, plain).value();
  std::unique_ptr<TrainerClient> t1 = TrainerClient::Connect(addresses, journaled).value();
  ASSERT_TRUE(t0->Attach(spec).ok());
  ASSERT_TRUE(t1->Attach(spec).ok());
  ASSERT_EQ(t0->PullToResume(absl::MakeSpan(params)).value(), 2);
  ASSERT_EQ(t1->PullToResume(absl::MakeSpan(other)).value(), 2);
  // Step 3 takes trainer 1's journaled push (computed from version 2's
  // parameters, which the rollback restored; a shard could hold some of
  // it). SGD, lr 1/2, from 1/4 - 2 * 1/16 = 1/8: the mean gradient 1/8
  // gives 1/16.
  ASSERT_NO_FATAL_FAILURE(BothStep(*t0, *t1, 3, 0.125f, 0.5f, &params, &other));
  EXPECT_EQ(params, std::vector<float>(kElements, 0.0625f));
  // Its step count follows the rollback: a change for step 4 is ahead of it.
  const absl::Status changed = t1->SetHyperparameters(4, OptimizerConfig::Sgd(0.25), LrSchedule{});
  EXPECT_TRUE(changed.ok()) << changed;
  // Step 4 takes the gradient it gives now, not the journaled one of the
  // step given up: lr 1/4, the mean gradient (1/8 + 1/2) / 2, exactly
  // -1/64.
  ASSERT_NO_FATAL_FAILURE(BothStep(*t0, *t1, 4, 0.125f, 0.5f, &params, &other));
  EXPECT_EQ(params, std::vector<float>(kElements, -0.015625f))
      << "trainer 1 pushed its journaled gradient of the step given up";
  EXPECT_EQ(params, other);
}

// A rollback whose set-aside of the later step directories failed (here an
// injected PERMISSION_DENIED, as on a shared root another shard's user
// owns) leaves the shard not marked rolled back: the next RollBack, sent as
// a trainer's survey would send it, sets them aside, instead of the shard
// passing for done with the steps given up left to be taken for the new
// timeline's own.
TEST(RollbackJournalTest, ARollbackWhoseSetAsideFailedIsNotTakenForDone) {
  const std::string checkpoints = MakeTempDir("rollback_set_aside");
  ServerPlacement placement;
  placement.binary = "tests/fault_injecting_server";
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(
      0, 1, {"--checkpoint_dir=" + checkpoints, "--checkpoint_every=2", "--fail_first_set_aside"},
      placement);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = NewStub((*server)->address());
  const ModelSpec spec = SgdSpec("aside", 1);
  {
    std::unique_ptr<TrainerClient> t0 =
        TrainerClient::Connect({(*server)->address()}, TrainerClientOptions()).value();
    std::vector<float> params(kElements, 0.25f);
    ASSERT_TRUE(t0->Register(spec, params).ok());
    const std::vector<float> grad(kElements, 0.125f);
    for (int64_t step = 1; step <= 4; ++step) {
      ASSERT_TRUE(t0->Step(step, grad, absl::MakeSpan(params)).ok());
    }
  }
  v1::InspectResponse inspect;
  for (int i = 0; i < 500 && inspect.newest_committed_checkpoint() < 4; ++i) {
    ASSERT_TRUE(RawInspect(*stub, "aside", &inspect).ok());
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(inspect.newest_committed_checkpoint(), 4);
  const auto roll_back = [&](uint64_t incarnation) {
    v1::RollBackRequest rollback;
    rollback.set_model_id("aside");
    rollback.set_to_step(2);
    rollback.set_expected_incarnation(incarnation);
    rollback.set_reason("the test");
    v1::RollBackResponse rolled;
    grpc::ClientContext context;
    return stub->RollBack(&context, rollback, &rolled);
  };
  const auto summary = [&] {
    v1::ServerInfo info;
    grpc::ClientContext context;
    EXPECT_TRUE(stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
    return info.models_size() == 1 ? info.models(0) : v1::ModelSummary();
  };
  const std::string step4 = checkpoints + "/aside/step-00000004";
  const grpc::Status failed = roll_back(inspect.incarnation());
  EXPECT_EQ(failed.error_code(), grpc::PERMISSION_DENIED) << failed.error_message();
  v1::ModelSummary after = summary();
  EXPECT_EQ(after.version(), 2);
  EXPECT_NE(after.rolled_back_to(), 2) << "the shard passes for rolled back with step 4 kept";
  EXPECT_TRUE(DirectoryExists(step4));
  const grpc::Status again = roll_back(after.incarnation());
  ASSERT_TRUE(again.ok()) << again.error_message();
  EXPECT_EQ(summary().rolled_back_to(), 2);
  EXPECT_FALSE(DirectoryExists(step4)) << "the step given up is still there";
}

// A RollBack to the version a shard is at, where no committed checkpoint of
// that step is (a caller's mistake: trainers pick a step every shard holds),
// is refused and drops nothing: the next step's pushes stay, and so does the
// shard's incarnation. A negative step is refused as such.
TEST(RollbackJournalTest, ARollbackToAStepWithoutACheckpointChangesNothing) {
  const std::string checkpoints = MakeTempDir("rollback_nowhere");
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(0, 1, {"--checkpoint_dir=" + checkpoints, "--checkpoint_every=2"});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::vector<std::string> addresses = {(*server)->address()};
  auto stub = NewStub((*server)->address());
  const ModelSpec spec = SgdSpec("nowhere", 2);
  TrainerClientOptions options1;
  options1.trainer_rank = 1;
  std::unique_ptr<TrainerClient> t0 =
      TrainerClient::Connect(addresses, TrainerClientOptions()).value();
  std::unique_ptr<TrainerClient> t1 = TrainerClient::Connect(addresses, options1).value();
  std::vector<float> params(kElements, 0.25f), other(kElements);
  ASSERT_TRUE(t0->Register(spec, params).ok());
  ASSERT_TRUE(t1->Attach(spec).ok());
  for (int64_t step = 1; step <= 3; ++step) {
    ASSERT_NO_FATAL_FAILURE(BothStep(*t0, *t1, step, 0.125f, 0.125f, &params, &other));
  }
  ASSERT_TRUE(t0->Push(4, std::vector<float>(kElements, 0.125f)).ok());
  v1::InspectResponse before;
  ASSERT_TRUE(RawInspect(*stub, "nowhere", &before).ok());
  ASSERT_EQ(before.version(), 3);
  ASSERT_EQ(before.trainers_pushed_size(), 1);
  const auto roll_back = [&](int64_t to_step) {
    v1::RollBackRequest rollback;
    rollback.set_model_id("nowhere");
    rollback.set_to_step(to_step);
    rollback.set_expected_incarnation(before.incarnation());
    rollback.set_reason("the test");
    v1::RollBackResponse rolled;
    grpc::ClientContext context;
    return stub->RollBack(&context, rollback, &rolled);
  };
  const grpc::Status nowhere = roll_back(3);
  EXPECT_EQ(nowhere.error_code(), grpc::NOT_FOUND) << nowhere.error_message();
  EXPECT_EQ(roll_back(-1).error_code(), grpc::INVALID_ARGUMENT);
  v1::InspectResponse after;
  ASSERT_TRUE(RawInspect(*stub, "nowhere", &after).ok());
  EXPECT_EQ(after.trainers_pushed_size(), 1) << "trainer 0's push of step 4 was dropped";
  EXPECT_EQ(after.incarnation(), before.incarnation());
  // Step 4 completes with the push the shard kept.
  const absl::StatusOr<StepResult> last =
      t1->Step(4, std::vector<float>(kElements, 0.125f), absl::MakeSpan(other));
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->version, 4);
}

// Going back (tests/going_back_test.cc) with an asynchronous model of two
// trainers, whose checkpoint's
// version counts both trainers' pushes (step 4 is version 8) while its
// directory is named by the trainers' step: going back to step-4 sets aside
// every later step directory (it set aside only those past step 8, and the
// new timeline then took the old step 6 and 8 for its own).
TEST(RollbackJournalTest, GoingBackToAnAsynchronousCheckpointGivesUpEveryLaterStep) {
  const std::string checkpoints = MakeTempDir("go_back_async");
  const std::vector<std::string> flags = {"--checkpoint_dir=" + checkpoints,
                                          "--checkpoint_every=2"};
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(0, 1, flags);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();
  ModelSpec spec = SgdSpec("back_async", 2);
  spec.consistency = Consistency::kAsync;
  std::vector<std::unique_ptr<TrainerClient>> trainers;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    TrainerClientOptions options;
    options.trainer_rank = rank;
    trainers.push_back(TrainerClient::Connect({address}, options).value());
  }
  std::vector<float> params(kElements, 0.25f);
  ASSERT_TRUE(trainers[0]->Register(spec, params).ok());
  ASSERT_TRUE(trainers[1]->Attach(spec).ok());
  std::vector<std::thread> threads;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      std::vector<float> mine(kElements);
      for (int64_t step = 1; step <= 8; ++step) {
        const absl::StatusOr<StepResult> r =
            trainers[rank]->Step(step, std::vector<float>(kElements, 0.125f), absl::MakeSpan(mine));
        EXPECT_TRUE(r.ok()) << "trainer " << rank << " step " << step << ": " << r.status();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  auto stub = NewStub(address);
  v1::InspectResponse inspect;
  for (int i = 0; i < 500 && inspect.newest_committed_checkpoint() < 8; ++i) {
    ASSERT_TRUE(RawInspect(*stub, "back_async", &inspect).ok());
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(inspect.newest_committed_checkpoint(), 8);
  trainers.clear();

  (*server)->process().Signal(SIGKILL);
  ASSERT_TRUE((*server)->process().Wait(absl::Seconds(10)).has_value());
  std::vector<std::string> restart_flags = flags;
  restart_flags.push_back("--restore_from=" + checkpoints + "/back_async/step-00000004");
  server = StartServerAt(address, 0, 1, restart_flags);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(DirectoryExists(checkpoints + "/back_async/step-00000004"));
  for (const char* later : {"step-00000006", "step-00000008"}) {
    EXPECT_FALSE(DirectoryExists(checkpoints + "/back_async/" + later)) << later << " stayed";
  }
  struct stat marker;
  EXPECT_EQ(stat((checkpoints + "/back_async/.went-back-to-step-00000004").c_str(), &marker), 0);
}

// A named restore whose start is refused (its port is taken: an old server
// still runs there) gives up nothing: the later checkpoints stay where they
// are, for the restart that does come up. It used to set them aside before
// it found the port taken.
TEST(RollbackJournalTest, ANamedRestoreRefusedAtStartGivesUpNoLaterCheckpoint) {
  const std::string checkpoints = MakeTempDir("refused_go_back");
  const std::vector<std::string> flags = {"--checkpoint_dir=" + checkpoints,
                                          "--checkpoint_every=2"};
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(0, 1, flags);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();
  {
    TrainerClientOptions options;
    std::unique_ptr<TrainerClient> trainer = TrainerClient::Connect({address}, options).value();
    std::vector<float> params(kElements, 0.25f);
    ASSERT_TRUE(trainer->Register(SgdSpec("refused", 1), params).ok());
    for (int64_t step = 1; step <= 4; ++step) {
      ASSERT_TRUE(
          trainer->Step(step, std::vector<float>(kElements, 0.125f), absl::MakeSpan(params)).ok());
    }
  }
  auto stub = NewStub(address);
  v1::InspectResponse inspect;
  for (int i = 0; i < 500 && inspect.newest_committed_checkpoint() < 4; ++i) {
    ASSERT_TRUE(RawInspect(*stub, "refused", &inspect).ok());
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(inspect.newest_committed_checkpoint(), 4);
  (*server)->process().Signal(SIGKILL);
  ASSERT_TRUE((*server)->process().Wait(absl::Seconds(10)).has_value());

  auto squatter = StartServerAt(address, 0, 1, {});
  ASSERT_TRUE(squatter.ok()) << squatter.status();
  std::vector<std::string> restart = flags;
  restart.push_back("--listen=" + address);
  restart.push_back("--restore_from=" + checkpoints + "/refused/step-00000002");
  auto refused = ChildProcess::Start(Runfile("server/shardopt_server"), restart);
  ASSERT_TRUE(refused.ok());
  const std::optional<int> rc = (*refused)->Wait(absl::Seconds(20));
  if (!rc.has_value()) (*refused)->Signal(SIGKILL);
  EXPECT_TRUE(rc.has_value() && *rc != 0) << "it started on a port another server holds";
  EXPECT_TRUE(DirectoryExists(checkpoints + "/refused/step-00000004"))
      << "the later checkpoint was set aside by a start that did not come up";
  struct stat marker;
  EXPECT_NE(stat((checkpoints + "/refused/.went-back-to-step-00000002").c_str(), &marker), 0);
}

}  // namespace
}  // namespace shardopt::testing
