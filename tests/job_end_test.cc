// The end of a job (TrainerClient::Finish) with real processes: once every
// trainer's Finish returned, the last step is a committed periodic
// checkpoint, so shards that restart after the trainers exited come back at
// the end (not at the last multiple of --checkpoint_every, which no trainer
// is left to replay), and trainers started again with the same flags find
// the job done. A shard that restarts after the last step but before the
// end is saved is brought back by the trainers' Finish first, also one whose
// part of the end (written before it restarted) completed the commit while
// it sat behind. Finish refuses
// a job whose shards do not all keep checkpoints. Bad requests for a periodic
// checkpoint get their status and change nothing.
#include <signal.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/trainer_client.h"
#include "common/checkpoint_files.h"
#include "common/file.h"
#include "gtest/gtest.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "tests/support/process.h"
#include "tests/support/raw_calls.h"
#include "tests/support/synthetic.h"
#include "tests/support/training_job.h"

namespace shardopt::testing {
namespace {

constexpr uint32_t kShards = 2, kTrainers = 2;
constexpr int kEvery = 10;

std::string ManifestOf(const std::string& model_root, int64_t step) {
  return JoinPath(JoinPath(model_root, CheckpointStepDirName(step)), kCheckpointManifestFile);
}

// The model's summary on the shard at `address` (gtest failure when absent).
v1::ModelSummary SummaryOn(const std::string& address, const std::string& model) {
  grpc::ClientContext context;
  v1::ServerInfo info;
  const grpc::Status s =
      NewStub(address)->GetServerInfo(&context, v1::GetServerInfoRequest(), &info);
  EXPECT_TRUE(s.ok()) << address << ": " << s.error_message();
  for (const v1::ModelSummary& m : info.models()) {
    if (m.model_id() == model) return m;
  }
  ADD_FAILURE() << "no model '" << model << "' on " << address;
  return v1::ModelSummary();
}

// Kills every server with SIGKILL and starts each again on its address.
void KillAndRestartAll(std::vector<std::unique_ptr<ServerProcess>>& servers,
                       const std::vector<std::string>& flags) {
  const std::vector<std::string> addresses = Addresses(servers);
  for (auto& s : servers) {
    s->process().Signal(SIGKILL);
    ASSERT_TRUE(s->process().Wait(absl::Seconds(10)).has_value());
  }
  for (uint32_t i = 0; i < servers.size(); ++i) {
    auto restarted = StartServerAt(addresses[i], i, kShards, flags);
    ASSERT_TRUE(restarted.ok()) << restarted.status();
    servers[i] = std::move(*restarted);
  }
}

// 15 steps, checkpoints every 10: without the end saved, a restart after the
// trainers exited would come back at step 10 with nobody to replay 11-15.
TEST(JobEndTest, TheEndIsSavedSoShardsRestartedAfterTheTrainersExitComeBackThere) {
  constexpr int kSteps = 15;
  const std::string model = "adamw";
  const std::string root = MakeTempDir("job_end");
  const std::string ckpt = root + "/ckpt";
  const std::vector<std::string> flags = CrashRecoveryFlags(ckpt, kEvery);
  auto servers = StartCluster(kShards, flags);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::vector<std::string> addresses = Addresses(*servers);
  ASSERT_NO_FATAL_FAILURE(
      RunTrainers(addresses, kTrainers, model, kSteps, root + "/out", {"--finish"}));
  EXPECT_TRUE(FileExists(FileEnv::Default(), ManifestOf(ckpt + "/" + model, kSteps)));
  ExpectMatchesReference(model, kShards, kTrainers, kSteps, root + "/out");

  ASSERT_NO_FATAL_FAILURE(KillAndRestartAll(*servers, flags));
  ExpectEveryStepAppliedOnce(addresses, model, kSteps);
  // The same trainers started again (the documented restart) find the job
  // done: nothing is pushed, they end with the same parameters.
  ASSERT_NO_FATAL_FAILURE(
      RunTrainers(addresses, kTrainers, model, kSteps, root + "/again", {"--finish"}));
  ExpectMatchesReference(model, kShards, kTrainers, kSteps, root + "/again");
  ExpectEveryStepAppliedOnce(addresses, model, kSteps);
}

// The last step is one the shards' saving threads save too: both ask for
// it, it is committed once and the job ends there.
TEST(JobEndTest, ALastStepTheShardsSaveThemselvesEndsTheSame) {
  constexpr int kSteps = 2 * kEvery;
  const std::string model = "sgd_momentum";
  const std::string root = MakeTempDir("job_end_multiple");
  const std::string ckpt = root + "/ckpt";
  const std::vector<std::string> flags = CrashRecoveryFlags(ckpt, kEvery);
  auto servers = StartCluster(kShards, flags);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::vector<std::string> addresses = Addresses(*servers);
  ASSERT_NO_FATAL_FAILURE(
      RunTrainers(addresses, kTrainers, model, kSteps, root + "/out", {"--finish"}));
  EXPECT_TRUE(FileExists(FileEnv::Default(), ManifestOf(ckpt + "/" + model, kSteps)));
  ASSERT_NO_FATAL_FAILURE(KillAndRestartAll(*servers, flags));
  ExpectEveryStepAppliedOnce(addresses, model, kSteps);
  ExpectMatchesReference(model, kShards, kTrainers, kSteps, root + "/out");
}

// Shard 1 restarts (from step 10) after both trainers' step 15 and before
// their Finish: Finish brings it to step 15 again from the trainers'
// histories, each step applied once, and only then saves the end.
TEST(JobEndTest, AShardThatRestartsBeforeTheEndIsSavedIsBroughtBackFirst) {
  constexpr int kSteps = 15;
  const std::string model = "adamw";
  const std::string root = MakeTempDir("job_end_restart");
  const std::string ckpt = root + "/ckpt";
  const std::string go = root + "/go";
  const std::vector<std::string> flags = CrashRecoveryFlags(ckpt, kEvery);
  auto servers = StartCluster(kShards, flags);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::vector<std::string> addresses = Addresses(*servers);
  std::vector<std::unique_ptr<ChildProcess>> trainers;
  ASSERT_NO_FATAL_FAILURE(StartTrainers(
      addresses, kTrainers, model, kSteps, root + "/out",
      {"--finish", "--finish_after_file=" + go, "--replay_steps=20"}, &trainers));
  for (const std::string& a : addresses) ASSERT_NO_FATAL_FAILURE(AwaitVersion(a, model, kSteps));
  (*servers)[1]->process().Signal(SIGKILL);
  ASSERT_TRUE((*servers)[1]->process().Wait(absl::Seconds(10)).has_value());
  auto restarted = StartServerAt(addresses[1], 1, kShards, flags);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  (*servers)[1] = std::move(*restarted);
  ASSERT_EQ(VersionOn(addresses[1], model), kEvery);
  std::ofstream(go) << "go";
  ASSERT_NO_FATAL_FAILURE(AwaitTrainers(trainers));
  EXPECT_TRUE(FileExists(FileEnv::Default(), ManifestOf(ckpt + "/" + model, kSteps)));
  ExpectEveryStepAppliedOnce(addresses, model, kSteps);
  ExpectMatchesReference(model, kShards, kTrainers, kSteps, root + "/out");
  ASSERT_NO_FATAL_FAILURE(KillAndRestartAll(*servers, flags));
  ExpectEveryStepAppliedOnce(addresses, model, kSteps);
}

// Shard 1 writes its part of the end (step 15) and restarts (from step 10)
// while shard 0's part is still being written (a 5 s stall); shard 0 then
// commits the end with shard 1's part from before its restart. Every save
// answered, one with the manifest, yet shard 1 sits at step 10: Finish looks
// at every shard again after saving, brings shard 1 back from the trainers'
// histories, and only then lets the trainers go.
TEST(JobEndTest, AShardBehindAnEndItsOldPartCommittedIsBroughtBackBeforeTheTrainersLeave) {
  constexpr int kSteps = 15;
  const std::string model = "adamw";
  const std::string root = MakeTempDir("job_end_old_part");
  const std::string ckpt = root + "/ckpt";
  const std::string step_dir = JoinPath(ckpt + "/" + model, CheckpointStepDirName(kSteps));
  const std::vector<std::string> flags = CrashRecoveryFlags(ckpt, kEvery);
  ServerPlacement slow;
  slow.binary = "tests/fault_injecting_server";
  std::vector<std::string> slow_flags = flags;
  slow_flags.push_back("--pause_checkpoint_data_writes_ms=5000");
  std::vector<std::unique_ptr<ServerProcess>> servers(kShards);
  auto started = ServerProcess::Start(0, kShards, slow_flags, slow);
  ASSERT_TRUE(started.ok()) << started.status();
  servers[0] = std::move(*started);
  started = ServerProcess::Start(1, kShards, flags);
  ASSERT_TRUE(started.ok()) << started.status();
  servers[1] = std::move(*started);
  const std::vector<std::string> addresses = Addresses(servers);
  std::vector<std::unique_ptr<ChildProcess>> trainers;
  ASSERT_NO_FATAL_FAILURE(StartTrainers(addresses, kTrainers, model, kSteps, root + "/out",
                                        {"--finish", "--replay_steps=20", "--retry_budget=120s"},
                                        &trainers));
  // Shard 1's part of the end is written; shard 0's is not (stalled).
  const std::string part1 = JoinPath(step_dir, CheckpointPartRecordName(1, kShards));
  const absl::Time until = absl::Now() + absl::Seconds(90);
  while (!FileExists(FileEnv::Default(), part1) && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  ASSERT_TRUE(FileExists(FileEnv::Default(), part1)) << part1;
  servers[1]->process().Signal(SIGKILL);
  ASSERT_TRUE(servers[1]->process().Wait(absl::Seconds(10)).has_value());
  started = StartServerAt(addresses[1], 1, kShards, flags);
  ASSERT_TRUE(started.ok()) << started.status();
  servers[1] = std::move(*started);
  // (Otherwise the stall was too short for this machine: not the case meant.)
  ASSERT_FALSE(FileExists(FileEnv::Default(), JoinPath(step_dir, kCheckpointManifestFile)))
      << "shard 0 committed before shard 1 restarted";
  ASSERT_EQ(VersionOn(addresses[1], model), kEvery);
  ASSERT_NO_FATAL_FAILURE(AwaitTrainers(trainers));
  EXPECT_TRUE(FileExists(FileEnv::Default(), JoinPath(step_dir, kCheckpointManifestFile)));
  ExpectEveryStepAppliedOnce(addresses, model, kSteps);
  ExpectMatchesReference(model, kShards, kTrainers, kSteps, root + "/out");
}

// Asynchronous: the end is every trainer's step 15 on every shard (Finish
// waits for it), saved as that cut.
TEST(JobEndTest, AnAsynchronousJobsEndIsEveryTrainersLastStep) {
  constexpr int kSteps = 15;
  const std::string model = "adamw";
  const std::string root = MakeTempDir("job_end_async");
  const std::string ckpt = root + "/ckpt";
  const std::vector<std::string> flags = CrashRecoveryFlags(ckpt, kEvery);
  auto servers = StartCluster(kShards, flags);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::vector<std::string> addresses = Addresses(*servers);
  ASSERT_NO_FATAL_FAILURE(RunTrainers(addresses, kTrainers, model, kSteps, root + "/out",
                                      {"--finish", "--consistency=async"}));
  EXPECT_TRUE(FileExists(FileEnv::Default(), ManifestOf(ckpt + "/" + model, kSteps)));
  ASSERT_NO_FATAL_FAILURE(KillAndRestartAll(*servers, flags));
  for (const std::string& a : addresses) {
    const v1::ModelSummary summary = SummaryOn(a, model);
    EXPECT_EQ(summary.version(), kSteps * kTrainers) << a;
    ASSERT_EQ(summary.trainer_steps_size(), static_cast<int>(kTrainers)) << a;
    for (int64_t step : summary.trainer_steps()) EXPECT_EQ(step, kSteps) << a;
  }
}

// Without periodic checkpoints Finish only waits; the summary says so.
TEST(JobEndTest, WithoutPeriodicCheckpointsFinishOnlyWaits) {
  constexpr int kSteps = 5;
  const std::string model = "adamw";
  const std::string root = MakeTempDir("job_end_plain");
  auto servers = StartCluster(kShards);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::vector<std::string> addresses = Addresses(*servers);
  ASSERT_NO_FATAL_FAILURE(
      RunTrainers(addresses, kTrainers, model, kSteps, root + "/out", {"--finish"}));
  ExpectMatchesReference(model, kShards, kTrainers, kSteps, root + "/out");
  for (const std::string& a : addresses) EXPECT_FALSE(SummaryOn(a, model).periodic_checkpoints());
}

// Only some shards keep periodic checkpoints: the end could never commit,
// and Finish says which shards lack them (the job itself trains).
TEST(JobEndTest, FinishRefusesShardsThatDoNotAllKeepCheckpoints) {
  const std::string root = MakeTempDir("job_end_mixed");
  auto kept = ServerProcess::Start(0, kShards, CrashRecoveryFlags(root + "/ckpt", kEvery));
  ASSERT_TRUE(kept.ok()) << kept.status();
  auto plain = ServerProcess::Start(1, kShards);
  ASSERT_TRUE(plain.ok()) << plain.status();
  const std::vector<std::string> addresses = {(*kept)->address(), (*plain)->address()};
  const ModelSpec spec = SyntheticModelSpec("mixed", OptimizerConfig::AdamW(0.01), 1);
  const ModelLayout layout = ModelLayout::Create(spec.tensors, spec.alignment, kShards).value();
  std::vector<float> params = SyntheticInitialParams(layout, 5);
  std::unique_ptr<TrainerClient> client =
      TrainerClient::Connect(addresses, TrainerClientOptions()).value();
  ASSERT_TRUE(client->Register(spec, params).ok());
  std::vector<float> grad(layout.total_elements());
  for (int64_t step = 1; step <= 3; ++step) {
    SyntheticGradient(layout, params, 0, step, 5, absl::MakeSpan(grad));
    ASSERT_TRUE(client->Step(step, grad, absl::MakeSpan(params)).ok());
  }
  // A step this trainer never pushed: refused before anything is asked.
  const absl::Status ahead = client->Finish(4);
  EXPECT_TRUE(absl::IsFailedPrecondition(ahead)) << ahead;
  EXPECT_NE(ahead.message().find("this trainer's last step is 3"), std::string::npos) << ahead;
  const absl::Status finished = client->Finish(3);
  EXPECT_TRUE(absl::IsFailedPrecondition(finished)) << finished;
  EXPECT_NE(finished.message().find("shard(s) 1 keep no periodic checkpoints"), std::string::npos)
      << finished;
  EXPECT_TRUE(absl::IsInvalidArgument(client->Finish(-1)));
}

grpc::Status PeriodicCheckpoint(const std::string& address, const std::string& model,
                                int64_t step, uint32_t shard, const std::string& directory = "",
                                v1::CheckpointResponse* response = nullptr) {
  grpc::ClientContext context;
  v1::CheckpointRequest request;
  request.set_model_id(model);
  request.set_periodic(true);
  request.set_step(step);
  request.set_shard_index(shard);
  request.set_directory(directory);
  request.set_max_wait_ms(200);
  v1::CheckpointResponse unused;
  return NewStub(address)->Checkpoint(&context, request, response ? response : &unused);
}

// Bad requests for a periodic checkpoint: each its status, nothing written,
// the model unchanged.
TEST(JobEndTest, BadPeriodicCheckpointRequestsChangeNothing) {
  constexpr int kSteps = 6;
  const std::string model = "adamw";
  const std::string root = MakeTempDir("job_end_bad");
  const std::string ckpt = root + "/ckpt";
  auto plain = StartCluster(1);
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto kept = StartCluster(1, CrashRecoveryFlags(ckpt, kEvery));
  ASSERT_TRUE(kept.ok()) << kept.status();
  const std::string plain_address = (*plain)[0]->address();
  const std::string kept_address = (*kept)[0]->address();
  ASSERT_NO_FATAL_FAILURE(RunTrainers({plain_address}, 1, model, kSteps, root + "/plain"));
  ASSERT_NO_FATAL_FAILURE(RunTrainers({kept_address}, 1, model, kSteps, root + "/kept"));
  EXPECT_TRUE(SummaryOn(kept_address, model).periodic_checkpoints());

  grpc::Status s = PeriodicCheckpoint(plain_address, model, kSteps, 0);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("keeps no periodic checkpoints"), std::string::npos)
      << s.error_message();
  s = PeriodicCheckpoint(kept_address, model, kSteps, 0, root + "/elsewhere");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_FALSE(FileExists(FileEnv::Default(), root + "/elsewhere"));
  s = PeriodicCheckpoint(kept_address, model, kSteps - 1, 0);  // Past it.
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  s = PeriodicCheckpoint(kept_address, model, -2, 0);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  s = PeriodicCheckpoint(kept_address, model, kSteps, 1);  // Not this server's shard.
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  s = PeriodicCheckpoint(kept_address, "no_such_model", kSteps, 0);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  s = PeriodicCheckpoint(kept_address, model, kSteps + 1, 0);  // Never comes.
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  for (int64_t step : {kSteps - 1, kSteps + 1}) {
    EXPECT_FALSE(FileExists(FileEnv::Default(),
                            JoinPath(ckpt + "/" + model, CheckpointStepDirName(step))))
        << step;
  }
  ExpectEveryStepAppliedOnce({kept_address}, model, kSteps);

  // And a good one, twice: written once, committed (one shard).
  v1::CheckpointResponse first, second;
  s = PeriodicCheckpoint(kept_address, model, kSteps, 0, "", &first);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_GT(first.bytes_written(), 0u);
  EXPECT_TRUE(first.committed());
  EXPECT_EQ(first.manifest(), ManifestOf(ckpt + "/" + model, kSteps));
  s = PeriodicCheckpoint(kept_address, model, -1, 0, "", &second);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(second.step(), kSteps);
  EXPECT_EQ(second.bytes_written(), 0u);
  EXPECT_EQ(second.manifest(), first.manifest());
  const v1::ModelSummary summary = SummaryOn(kept_address, model);
  ASSERT_GT(summary.committed_checkpoints_size(), 0);
  EXPECT_EQ(summary.committed_checkpoints(0), kSteps);
  ExpectEveryStepAppliedOnce({kept_address}, model, kSteps);
}

}  // namespace
}  // namespace shardopt::testing
