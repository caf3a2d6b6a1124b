// Durability with real processes: checkpoints restored on other shard
// counts, shards killed with SIGKILL and restarted from their periodic
// checkpoints while trainers run, trainers killed and restarted. Every run
// must end with the parameters of an uninterrupted single-process run, bit
// for bit (the CPU path's arithmetic does not depend on the shard count).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <iostream>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "tests/support/process.h"
#include "tests/support/raw_calls.h"
#include "tests/support/synthetic.h"
#include "tests/support/training_job.h"

namespace shardopt::testing {
namespace {

// Train N steps on 3 shards, checkpoint, restore on S' shards, train M more:
// the parameters equal an uninterrupted N + M step run.
TEST(DurabilityTest, CheckpointRestoresOnAnyShardCount) {
  constexpr int kFirst = 9, kTotal = 16;
  constexpr uint32_t kTrainers = 2;
  const std::vector<std::string> models = {"adamw_amsgrad", "sgd_momentum", "adagrad"};
  const std::string root = MakeTempDir("reshard");
  {
    auto servers = StartCluster(3);
    ASSERT_TRUE(servers.ok()) << servers.status();
    RunTrainers(Addresses(*servers), kTrainers, absl::StrJoin(models, ","), kFirst,
                root + "/first");
    for (const std::string& model : models) {
      CheckpointEveryShard(Addresses(*servers), model, kFirst, root + "/ckpt/" + model);
      // Again: the committed checkpoint is kept, nothing is rewritten.
      auto stub = NewStub((*servers)[0]->address());
      grpc::ClientContext context;
      v1::CheckpointRequest request;
      request.set_model_id(model);
      request.set_directory(root + "/ckpt/" + model);
      request.set_step(kFirst);
      v1::CheckpointResponse response;
      ASSERT_TRUE(stub->Checkpoint(&context, request, &response).ok());
      EXPECT_EQ(response.bytes_written(), 0u);
      EXPECT_FALSE(response.manifest().empty());
    }
  }
  {
    // Bad Checkpoint calls get their status and leave the model as it is.
    auto servers = StartCluster(1, {"--restore_from=" + root + "/ckpt"});
    ASSERT_TRUE(servers.ok()) << servers.status();
    auto stub = NewStub((*servers)[0]->address());
    auto call = [&](const std::string& model, const std::string& dir, int64_t step) {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      v1::CheckpointRequest request;
      request.set_model_id(model);
      request.set_directory(dir);
      request.set_step(step);
      v1::CheckpointResponse response;
      return stub->Checkpoint(&context, request, &response);
    };
    EXPECT_EQ(call("adagrad", "", kFirst).error_code(), grpc::INVALID_ARGUMENT);
    EXPECT_EQ(call("adagrad", root + "/x", -2).error_code(), grpc::INVALID_ARGUMENT);
    EXPECT_EQ(call("nope", root + "/x", kFirst).error_code(), grpc::NOT_FOUND);
    EXPECT_EQ(call("adagrad", root + "/x", kFirst - 1).error_code(), grpc::FAILED_PRECONDITION);
    // A directory holding another checkpoint is not overwritten.
    EXPECT_EQ(call("adagrad", root + "/ckpt/sgd_momentum", kFirst).error_code(),
              grpc::FAILED_PRECONDITION);
    EXPECT_EQ(VersionOn((*servers)[0]->address(), "adagrad"), kFirst);
  }
  for (uint32_t shards : {1u, 2u, 4u, 5u}) {
    SCOPED_TRACE(absl::StrCat(shards, " shards"));
    // The directory of model directories, as --checkpoint_dir lays it out.
    auto servers = StartCluster(shards, {"--restore_from=" + root + "/ckpt"});
    ASSERT_TRUE(servers.ok()) << servers.status();
    const std::string out = absl::StrCat(root, "/resumed", shards);
    RunTrainers(Addresses(*servers), kTrainers, absl::StrJoin(models, ","), kTotal, out);
    for (const std::string& model : models) {
      ExpectMatchesReference(model, shards, kTrainers, kTotal, out);
    }
  }
}

// A model's directory of periodic checkpoints whose only step directory
// never committed (every shard died while writing the registration's
// checkpoint) is a fresh start, as the root form takes it, not a server that
// refuses to start at every restart.
TEST(DurabilityTest, AModelDirectoryWithoutACommittedCheckpointIsAFreshStart) {
  const std::string root = MakeTempDir("torn_first");
  const std::string step0 = root + "/m/step-00000000";
  ASSERT_EQ(RunShell("mkdir -p " + step0 + " && : > " + step0 + "/shard-00000-of-00001.bin").first,
            0);
  for (const std::string& from : {root + "/m", root}) {
    auto server = ServerProcess::Start(
        0, 1,
        {"--checkpoint_dir=" + root, "--checkpoint_every=2", "--restore_from=" + from});
    ASSERT_TRUE(server.ok()) << from << ": " << server.status();
  }
}

// An on-demand checkpoint written into the --checkpoint_dir root (as the k8s
// deployment's --checkpoint_request_root allows) is not taken for a model
// directory at the next restart from the root: the server starts and the
// model comes back from its periodic checkpoints. Every place a restart
// would take for periodic checkpoints is refused (a mislabelled step
// directory in the model's directory used to be accepted and restored).
TEST(DurabilityTest, AnExportInTheCheckpointRootDoesNotStopTheRestart) {
  const std::string root = MakeTempDir("export_in_root");
  const std::vector<std::string> flags = CrashRecoveryFlags(root, 2);
  auto server = ServerProcess::Start(0, 1, flags);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();
  auto client = TrainerClient::Connect({address}, TrainerClientOptions()).value();
  const ModelSpec spec = SyntheticModelSpec("mlp", OptimizerConfig::Sgd(0.5), 1);
  std::vector<float> params = SyntheticInitialParams(client->LayoutFor(spec).value(), 4);
  ASSERT_TRUE(client->Register(spec, params).ok());
  const std::vector<float> grad(params.size(), 0.0f);
  for (int64_t step = 1; step <= 2; ++step) {
    ASSERT_TRUE(client->Step(step, grad, absl::MakeSpan(params)).ok());
  }
  AwaitVersion(address, "mlp", 2);
  ASSERT_TRUE(client->Checkpoint(root + "/export1", 2).ok());
  auto stub = NewStub(address);
  v1::InspectResponse inspect;
  for (int i = 0; i < 500 && inspect.newest_committed_checkpoint() < 2; ++i) {
    ASSERT_TRUE(RawInspect(*stub, "mlp", &inspect).ok());
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(inspect.newest_committed_checkpoint(), 2);
  // Places a restart would take for periodic checkpoints: step 2 saved as
  // step 1, something else in the model's directory, step directories of a
  // directory of the root, the root's own top level.
  for (const std::string& place : {root + "/mlp/", root + "/", root + "/mlp/step-00000001",
                                   root + "/mlp/extra", root + "/mlp/step-00000002/inner",
                                   root + "/export2/step-00000002", root + "/step-00000002"}) {
    const absl::StatusOr<std::string> refused = client->Checkpoint(place, 2);
    EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << place << ": " << refused.status();
  }
  for (const char* never_made :
       {"/mlp/step-00000001", "/mlp/extra", "/export2", "/step-00000002"}) {
    struct stat info;
    EXPECT_NE(stat((root + never_made).c_str(), &info), 0) << never_made << " was made";
  }
  // The model's own step directory of that very step is its periodic
  // checkpoint (shardopt.torch's state_dict() names it so).
  EXPECT_TRUE(client->Checkpoint(root + "/mlp/step-00000002", 2).ok());
  client.reset();
  (*server)->process().Signal(SIGKILL);
  ASSERT_TRUE((*server)->process().Wait(absl::Seconds(10)).has_value());
  auto restarted = StartServerAt(address, 0, 1, flags);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  // (Polled: the process's channel to the address backs off after the kill.)
  AwaitVersion(address, "mlp", 2);
  EXPECT_EQ(VersionOn(address, "mlp"), 2);
}

// Registers `spec` (initial values *params, seed 4) from a rank 0 client
// that is gone when this returns (as a killed trainer's).
void RegisterFromAClientGone(const std::vector<std::string>& addresses, const ModelSpec& spec,
                             std::vector<float>* params) {
  auto first = TrainerClient::Connect(addresses, TrainerClientOptions()).value();
  *params = SyntheticInitialParams(first->LayoutFor(spec).value(), 4);
  ASSERT_TRUE(first->Register(spec, *params).ok());
}

// Rank 0 registers, restarted, a model whose shard 1 came back empty (it
// died before the model's first checkpoint was whole): shard 1 joins the run
// the others hold, and the job trains on. Without periodic checkpoints it
// is created for that run (it got a new run, and the shards refused to
// train as one model for good); with them, when the others committed the
// run's step 0 after shard 1 restarted, shard 1 restores it at the
// registration (it refused: the directory holds checkpoints).
TEST(DurabilityTest, AShardBackEmptyBeforeTheFirstCheckpointRejoinsTheRun) {
  for (const bool periodic : {false, true}) {
    SCOPED_TRACE(periodic ? "periodic checkpoints" : "no checkpoints");
    const std::string root = MakeTempDir("back_empty");
    const std::vector<std::string> flags =
        periodic ? CrashRecoveryFlags(root, 2) : std::vector<std::string>{};
    auto servers = StartCluster(2, flags);
    ASSERT_TRUE(servers.ok()) << servers.status();
    const std::vector<std::string> addresses = Addresses(*servers);
    const ModelSpec spec = SyntheticModelSpec("early", OptimizerConfig::Sgd(0.5), 1);
    std::vector<float> params;
    ASSERT_NO_FATAL_FAILURE(RegisterFromAClientGone(addresses, spec, &params));
    const std::string model_dir = root + "/early";
    if (periodic) {
      struct stat info;
      for (int i = 0;
           i < 500 && stat((model_dir + "/step-00000000/manifest.json").c_str(), &info) != 0; ++i) {
        absl::SleepFor(absl::Milliseconds(10));
      }
      ASSERT_EQ(stat((model_dir + "/step-00000000/manifest.json").c_str(), &info), 0);
    }
    (*servers)[1]->process().Signal(SIGKILL);
    ASSERT_TRUE((*servers)[1]->process().Wait(absl::Seconds(10)).has_value());
    // (Moved away while it restarts: as if the commit came after its start.)
    const std::string hidden = MakeTempDir("hidden_model") + "/early";
    if (periodic) ASSERT_EQ(rename(model_dir.c_str(), hidden.c_str()), 0);
    auto restarted = StartServerAt(addresses[1], 1, 2, flags);
    ASSERT_TRUE(restarted.ok()) << restarted.status();
    if (periodic) ASSERT_EQ(rename(hidden.c_str(), model_dir.c_str()), 0);

    TrainerClientOptions options;
    options.retry_budget = absl::Seconds(10);
    auto again = TrainerClient::Connect(addresses, options).value();
    const absl::Status registered = again->Register(spec, params);
    ASSERT_TRUE(registered.ok()) << registered;
    const std::vector<float> grad = ConstantGradient(again->LayoutFor(spec).value(), 0.25f);
    for (int64_t step = 1; step <= 2; ++step) {
      absl::StatusOr<StepResult> r = again->Step(step, grad, absl::MakeSpan(params));
      ASSERT_TRUE(r.ok()) << "step " << step << ": " << r.status();
    }
    EXPECT_EQ(VersionOn(addresses[0], "early"), 2);
    EXPECT_EQ(VersionOn(addresses[1], "early"), 2);
  }
}

// A restarted rank 0 that initializes the model otherwise than the shards
// holding it at version 0 (unseeded) is refused, naming the element: the
// shard that came back empty would otherwise train its part from other
// values than the rest (it used to be refused for its other run).
TEST(DurabilityTest, ARestartedRankZeroWithOtherInitialValuesIsRefused) {
  auto servers = StartCluster(2);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::vector<std::string> addresses = Addresses(*servers);
  const ModelSpec spec = SyntheticModelSpec("reinit", OptimizerConfig::Sgd(0.5), 1);
  std::vector<float> params;
  ASSERT_NO_FATAL_FAILURE(RegisterFromAClientGone(addresses, spec, &params));
  (*servers)[1]->process().Signal(SIGKILL);
  ASSERT_TRUE((*servers)[1]->process().Wait(absl::Seconds(10)).has_value());
  auto restarted = StartServerAt(addresses[1], 1, 2, {});
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  auto again = TrainerClient::Connect(addresses, TrainerClientOptions()).value();
  const std::vector<float> other = SyntheticInitialParams(again->LayoutFor(spec).value(), 5);
  for (int attempt = 0; attempt < 2; ++attempt) {  // (The second finds shard 1 held too.)
    const absl::Status refused = again->Register(spec, other);
    EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
    EXPECT_NE(refused.message().find("initialized the model otherwise"), std::string::npos)
        << refused;
  }
}

// Every trainer of an asynchronous model may Register it with the initial
// values, and another's first pushes can land between a registration's
// answer (version 0) and its check of those values: the check reads the
// pulled version and does not refuse a model trained since (it did:
// "initialized the model otherwise").
TEST(DurabilityTest, AsynchronousTrainersRegisteringTogetherAreNotRefused) {
  auto servers = StartCluster(2);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::vector<std::string> addresses = Addresses(*servers);
  // (The moment is narrow: about one round in twenty met it.)
  for (int round = 0; round < 100; ++round) {
    ModelSpec spec =
        SyntheticModelSpec(absl::StrCat("together", round), OptimizerConfig::Sgd(0.5), 2);
    spec.consistency = Consistency::kAsync;
    TrainerClientOptions rank1;
    rank1.trainer_rank = 1;
    auto first = TrainerClient::Connect(addresses, TrainerClientOptions()).value();
    auto second = TrainerClient::Connect(addresses, rank1).value();
    const ModelLayout layout = first->LayoutFor(spec).value();
    const std::vector<float> initial = SyntheticInitialParams(layout, 4);
    ASSERT_TRUE(first->Register(spec, initial).ok());
    std::atomic<bool> second_done{false};
    std::thread pushing([&] {
      std::vector<float> params = initial;
      const std::vector<float> grad = ConstantGradient(layout, 0.25f);
      for (int64_t step = 1; step <= 200 && !second_done.load(); ++step) {
        if (!first->Step(step, grad, absl::MakeSpan(params)).ok()) return;
      }
    });
    const absl::Status registered = second->Register(spec, initial);
    second_done = true;
    pushing.join();
    EXPECT_TRUE(registered.ok()) << "round " << round << ": " << registered;
  }
}

// The partition is part of the checkpoint, and a restore may change it
// (--restore_partition) along with the shard count: AdamW trained flat on 3
// shards goes on as whole tensors on 2 and flat again on 5; LAMB (whole
// tensors only) goes 3 -> 2 -> 5 shards. Each ends bit for bit where an
// uninterrupted run on the last layout does (the synthetic workload is keyed
// by tensor element, not offset), and LAMB restored flat on 3 shards too.
// Adafactor goes 3 -> 2 -> 5 shards on whole tensors like LAMB.
TEST(DurabilityTest, CheckpointRestoresOntoEitherPartition) {
  constexpr int kFirst = 6, kSecond = 11, kTotal = 16;
  constexpr uint32_t kTrainers = 2;
  const std::string root = MakeTempDir("repartition");
  const std::string models = "adamw_amsgrad,lamb,adafactor";
  {
    auto servers = StartCluster(3);
    ASSERT_TRUE(servers.ok()) << servers.status();
    RunTrainers(Addresses(*servers), kTrainers, models, kFirst, root + "/first");
    for (const std::string model : {"adamw_amsgrad", "lamb", "adafactor"}) {
      CheckpointEveryShard(Addresses(*servers), model, kFirst, root + "/a/" + model);
    }
  }
  {
    auto servers =
        StartCluster(2, {"--restore_from=" + root + "/a", "--restore_partition=whole_tensors"});
    ASSERT_TRUE(servers.ok()) << servers.status();
    // The restored adamw model is whole_tensors now: a flat trainer is refused.
    TrainerClientOptions options;
    options.retry_budget = absl::Seconds(5);
    auto client = TrainerClient::Connect(Addresses(*servers), options).value();
    const ModelSpec flat_spec =
        SyntheticModelSpec("adamw_amsgrad", OptimizerByName("adamw_amsgrad").value(), kTrainers);
    const absl::Status refused = client->Attach(flat_spec);
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
    EXPECT_NE(refused.message().find("partition"), std::string::npos) << refused;
    client.reset();
    RunTrainers(Addresses(*servers), kTrainers, models, kSecond, root + "/second",
                {"--partition=whole_tensors"});
    for (const std::string model : {"adamw_amsgrad", "lamb", "adafactor"}) {
      CheckpointEveryShard(Addresses(*servers), model, kSecond, root + "/b/" + model);
    }
  }
  {
    // adamw back to flat on 5 shards; lamb stays whole on 5.
    auto flat = StartCluster(
        5, {"--restore_from=" + root + "/b/adamw_amsgrad", "--restore_partition=flat"});
    ASSERT_TRUE(flat.ok()) << flat.status();
    RunTrainers(Addresses(*flat), kTrainers, "adamw_amsgrad", kTotal, root + "/third");
    ExpectMatchesReference("adamw_amsgrad", 5, kTrainers, kTotal, root + "/third");
  }
  for (const std::string model : {"lamb", "adafactor"}) {
    // Whole tensors on 5 shards: most tensors move to another shard, with
    // their state (Adafactor: only its factors are held, see
    // Optimizer::AddPackedSlot).
    auto whole = StartCluster(5, {"--restore_from=" + root + "/b/" + model});
    ASSERT_TRUE(whole.ok()) << whole.status();
    RunTrainers(Addresses(*whole), kTrainers, model, kTotal, root + "/third_" + model);
    ExpectMatchesReference(model, 5, kTrainers, kTotal, root + "/third_" + model);
  }
  {
    // LAMB restored flat on 3 shards: its tensors straddle shards now, each
    // step gathers their norms from every shard, and the job still ends on
    // the bits of the whole-tensor run.
    auto flat = StartCluster(3, {"--restore_from=" + root + "/b/lamb", "--restore_partition=flat"});
    ASSERT_TRUE(flat.ok()) << flat.status();
    RunTrainers(Addresses(*flat), kTrainers, "lamb", kTotal, root + "/fourth",
                {"--partition=flat"});
    ModelSpec spec = SyntheticModelSpec("lamb", OptimizerByName("lamb").value(), kTrainers);
    spec.partition = Partition::kFlat;
    ExpectMatchesReference(spec, 3, kTotal, root + "/fourth");
  }
}

// SIGKILL shards at random moments (and in the middle of checkpoints) while
// two trainers train; each comes back from its latest checkpoint on the same
// port, the trainers re-push what it lost, and the job ends exactly where an
// uninterrupted one does.
// With `max_grad_norm` > 0 every step also takes a decision (clipping),
// which the re-pushed steps must get again.
// With `keep` > 0 the servers keep only that many periodic checkpoints.
// With `flat` the model (test_trainer's `model`) is on the flat partition.
void KillShardsDuringTraining(double max_grad_norm, int keep, const std::string& model = "adamw",
                              bool flat = false) {
  constexpr uint32_t kShards = 3, kTrainers = 2;
  constexpr int kSteps = 60, kKills = 6, kChangeAt = 31;
  ModelSpec spec = SyntheticModelSpec(model, OptimizerByName(model).value(), kTrainers);
  spec.max_grad_norm = max_grad_norm;
  if (flat) spec.partition = Partition::kFlat;
  const std::string root = MakeTempDir("faults");
  const std::string ckpt = root + "/ckpt";
  const std::vector<std::string> flags = {
      "--checkpoint_dir=" + ckpt, "--checkpoint_every=4", "--restore_from=" + ckpt,
      "--pause_checkpoint_data_writes_ms=100", absl::StrCat("--checkpoint_keep=", keep)};
  // The production program with a FileEnv that stalls each checkpoint data
  // file after its header, so that kills can land mid-write.
  ServerPlacement faulty;
  faulty.binary = "tests/fault_injecting_server";
  auto servers = StartCluster(kShards, flags, faulty);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::vector<std::string> addresses = Addresses(*servers);

  std::vector<std::unique_ptr<ChildProcess>> trainers;
  // Slow steps (many small chunks) leave time for kills mid-push.
  ASSERT_NO_FATAL_FAILURE(
      StartTrainers(addresses, kTrainers, model, kSteps, root + "/out",
                    {"--replay_steps=12", "--retry_budget=60s", "--chunk_bytes=64",
                     absl::StrCat("--max_grad_norm=", max_grad_norm),
                     absl::StrCat("--lr_change=", kChangeAt, ":0.003"),
                     absl::StrCat("--partition=", PartitionName(spec.partition))},
                    &trainers));
  std::mt19937 rng(2026);
  int mid_checkpoint_kills = 0;
  for (int kill = 0; kill < kKills; ++kill) {
    const uint32_t victim = std::uniform_int_distribution<uint32_t>(0, kShards - 1)(rng);
    const bool during_checkpoint = kill % 2 == 1;
    // Spread over the run, at a random moment of a step.
    AwaitVersion(addresses[victim], model, (kill + 1) * kSteps / (kKills + 2));
    absl::SleepFor(absl::Microseconds(std::uniform_int_distribution<int>(0, 3000)(rng)));
    if (during_checkpoint) {
      // Wait (bounded) for the victim to be inside a checkpoint write.
      mid_checkpoint_kills +=
          AwaitCheckpointInProgress(ckpt + "/" + model, victim, kShards, absl::Seconds(5));
    }
    (*servers)[victim]->process().Signal(SIGKILL);
    ASSERT_TRUE((*servers)[victim]->process().Wait(absl::Seconds(10)).has_value());
    auto restarted = StartServerAt(addresses[victim], victim, kShards, flags, faulty);
    ASSERT_TRUE(restarted.ok()) << restarted.status();
    (*servers)[victim] = std::move(*restarted);
    bool finished = true;
    for (auto& t : trainers) finished = finished && t->Wait(absl::ZeroDuration()).has_value();
    if (finished) break;
  }
  ASSERT_NO_FATAL_FAILURE(AwaitTrainers(trainers));
  // A change scheduled after a restarted shard's checkpoint was sent to it
  // again by the trainers (the kill near step 30 restores step 28).
  ReferenceOptions reference;
  OptimizerConfig changed = OptimizerByName(model).value();
  changed.lr = 0.003;
  reference.changes[kChangeAt] = {changed, LrSchedule()};
  ExpectMatchesReference(spec, kShards, kSteps, root + "/out", reference);
  // Every periodic checkpoint was committed in the end, also those a kill
  // interrupted (the restarted shard writes its part again when it gets
  // there).
  const int first_kept = keep > 0 ? kSteps - 4 * (keep - 1) : 0;
  for (int step = first_kept; step <= kSteps; step += 4) {
    const std::string manifest =
        absl::StrFormat("%s/%s/step-%08d/manifest.json", ckpt, model, step);
    // (The last one may still be being written as the trainers finish.)
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (access(manifest.c_str(), F_OK) != 0 && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_EQ(access(manifest.c_str(), F_OK), 0) << manifest;
  }
  // Older ones are gone, every shard's files included (but for the newest of
  // them: a shard that finished the last checkpoint before it was committed
  // pruned then, and removes the rest at its next checkpoint).
  for (int step = 0; step < first_kept - 4; step += 4) {
    const std::string dir = absl::StrFormat("%s/%s/step-%08d", ckpt, model, step);
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (access(dir.c_str(), F_OK) == 0 && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_NE(access(dir.c_str(), F_OK), 0) << dir << " should have been pruned";
  }
  int64_t replayed = 0;
  for (uint32_t r = 0; r < kTrainers; ++r) {
    replayed += TrainerCount(root + "/out", r, model, "replayed");
  }
  std::cout << "kills: " << kKills << " (" << mid_checkpoint_kills
            << " during a checkpoint write); steps re-pushed by the trainers: " << replayed
            << std::endl;
  EXPECT_GT(mid_checkpoint_kills, 0);
  EXPECT_GT(replayed, 0) << "no kill made a shard lose a step: the test proved nothing";

  // A new run of the model into the same checkpoint directory is refused:
  // after a restart, its checkpoints and these would be taken for each other.
  servers->clear();
  auto fresh = StartCluster(kShards, {"--checkpoint_dir=" + ckpt, "--checkpoint_every=4"});
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  TrainerClientOptions options;
  options.retry_budget = absl::Seconds(5);
  auto client = TrainerClient::Connect(Addresses(*fresh), options).value();
  const absl::Status s =
      client->Register(spec, SyntheticInitialParams(client->LayoutFor(spec).value(), kJobSeed));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("already holds checkpoints"), std::string::npos) << s;
}

TEST(DurabilityTest, KilledShardsRecoverWithNothingLostOrAppliedTwice) {
  KillShardsDuringTraining(0, /*keep=*/0);
}

// Clipping on (a norm this small clips every step): each re-pushed step needs
// its statistics and decision again on the restarted shard.
// Also keeping only the 3 newest periodic checkpoints.
TEST(DurabilityTest, KilledShardsRecoverWithGradientControl) {
  KillShardsDuringTraining(0.5, /*keep=*/3);
}

// LAMB on the flat partition: each step's decision comes in two halves
// (the tensor norms gathered from every shard), and a restarted shard
// measures its partials again for the steps it re-applies.
TEST(DurabilityTest, KilledShardsRecoverWithLambOnTheFlatPartition) {
  KillShardsDuringTraining(0, /*keep=*/0, "lamb", /*flat=*/true);
}

// A trainer killed mid-run comes back, re-attaches at the model's version and
// finishes; with a decision step (clipping on) a push cut off half-way
// cannot have been applied anywhere, so the result is exact.
TEST(DurabilityTest, KilledTrainerRejoinsAndResumes) {
  constexpr uint32_t kShards = 2, kTrainers = 2;
  constexpr int kSteps = 40;
  const std::string model = "adam";
  const std::string root = MakeTempDir("trainer_restart");
  auto servers = StartCluster(kShards);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::vector<std::string> extra = {"--max_grad_norm=1000", "--chunk_bytes=64"};
  std::vector<std::unique_ptr<ChildProcess>> trainers;
  ASSERT_NO_FATAL_FAILURE(
      StartTrainers(Addresses(*servers), kTrainers, model, kSteps, root, extra, &trainers));
  std::mt19937 rng(11);
  for (int kill = 0; kill < 3; ++kill) {
    AwaitVersion((*servers)[0]->address(), model, (kill + 1) * kSteps / 4);
    absl::SleepFor(absl::Microseconds(std::uniform_int_distribution<int>(0, 3000)(rng)));
    if (trainers[1]->Wait(absl::ZeroDuration()).has_value()) break;
    trainers[1]->Signal(SIGKILL);
    ASSERT_TRUE(trainers[1]->Wait(absl::Seconds(10)).has_value());
    ASSERT_NO_FATAL_FAILURE(
        StartTrainer(Addresses(*servers), 1, kTrainers, model, kSteps, root, extra, &trainers[1]));
  }
  ASSERT_NO_FATAL_FAILURE(AwaitTrainers(trainers));
  ExpectMatchesReference(model, kShards, kTrainers, kSteps, root, /*max_grad_norm=*/1000);
}

// With loss scaling, a restarted trainer's scaler starts where the others'
// are (the shards' replica): overflows before the kill backed the scale off,
// so a scaler starting afresh would push with another scale and be refused.
TEST(DurabilityTest, KilledTrainerResumesTheLossScale) {
  constexpr uint32_t kShards = 2, kTrainers = 2;
  constexpr int kSteps = 30;
  const std::string model = "adamw";
  const std::vector<int64_t> planted = {3, 5, 7};  // Hysteresis 2: backs off at 5 and 7.
  const std::string root = MakeTempDir("scaler_restart");
  auto servers = StartCluster(kShards);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::vector<std::string> extra = {"--loss_scaling", "--initial_loss_scale=1024",
                                          "--plant_inf_steps=3,5,7", "--chunk_bytes=64"};
  std::vector<std::unique_ptr<ChildProcess>> trainers;
  ASSERT_NO_FATAL_FAILURE(
      StartTrainers(Addresses(*servers), kTrainers, model, kSteps, root, extra, &trainers));
  AwaitVersion((*servers)[0]->address(), model, 12);
  trainers[1]->Signal(SIGKILL);
  ASSERT_TRUE(trainers[1]->Wait(absl::Seconds(10)).has_value());
  ASSERT_NO_FATAL_FAILURE(
      StartTrainer(Addresses(*servers), 1, kTrainers, model, kSteps, root, extra, &trainers[1]));
  ASSERT_NO_FATAL_FAILURE(AwaitTrainers(trainers, absl::Seconds(120)));
  ModelSpec spec = SyntheticModelSpec(model, OptimizerByName(model).value(), kTrainers);
  spec.loss_scaling = true;
  spec.loss_scaler.initial_scale = 1024;
  ReferenceOptions reference;
  reference.plant_inf_steps = {planted.begin(), planted.end()};
  ExpectMatchesReference(spec, kShards, kSteps, root, reference);
}

// Without a decision step, a trainer that dies after pushing a step to some
// shards only leaves them a version apart; restarted, it re-sends the
// journaled push to the shards that missed it, and the job ends exactly.
TEST(DurabilityTest, TrainerDyingMidPushResendsItsJournal) {
  constexpr uint32_t kShards = 2, kTrainers = 2;
  constexpr int kSteps = 20, kDieAt = 7;
  const std::string model = "sgd_momentum";
  const std::string root = MakeTempDir("journal");
  auto servers = StartCluster(kShards);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::vector<std::string> journal = {"--journal_dir=" + root};
  std::vector<std::unique_ptr<ChildProcess>> trainers(kTrainers);
  ASSERT_NO_FATAL_FAILURE(
      StartTrainer(Addresses(*servers), 0, kTrainers, model, kSteps, root, journal, &trainers[0]));
  std::vector<std::string> dying = journal;
  dying.push_back(absl::StrCat("--die_mid_push_at_step=", kDieAt));
  ASSERT_NO_FATAL_FAILURE(
      StartTrainer(Addresses(*servers), 1, kTrainers, model, kSteps, root, dying, &trainers[1]));
  std::optional<int> died = trainers[1]->Wait(absl::Seconds(60));
  ASSERT_EQ(died, std::optional<int>(3));
  // Shard 0 applied step 7 (it had both pushes), shard 1 waits for rank 1.
  AwaitVersion((*servers)[0]->address(), model, kDieAt);
  EXPECT_EQ(VersionOn((*servers)[0]->address(), model), kDieAt);
  EXPECT_EQ(VersionOn((*servers)[1]->address(), model), kDieAt - 1);
  ASSERT_NO_FATAL_FAILURE(
      StartTrainer(Addresses(*servers), 1, kTrainers, model, kSteps, root, journal, &trainers[1]));
  ASSERT_NO_FATAL_FAILURE(AwaitTrainers(trainers, absl::Seconds(120)));
  ExpectMatchesReference(model, kShards, kTrainers, kSteps, root);
}

}  // namespace
}  // namespace shardopt::testing
