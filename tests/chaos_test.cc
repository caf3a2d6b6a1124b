// Chaos: a job of real processes (3 shard servers with periodic checkpoints,
// 2 trainers with journals) is hit, on a seeded schedule printed first, by
// SIGKILLs of one shard (mid-push, mid-checkpoint-write, mid-restore), of two
// and of all shards at once, of a trainer (restarted), of a trainer and then
// of a shard right after it (the shard comes back from a checkpoint taken
// before the trainer's restart), and by a flipped byte in the newest
// checkpoint while every shard is down. Whatever happens the job must finish
// by itself, bit-identical to an uninterrupted run, with every step applied
// once on every shard.
//
// A second case takes the trainers' history away (no journal, 2 steps in
// memory): a shard restored from an older checkpoint then cannot be
// replayed, and the whole job rolls back to that checkpoint and still ends
// bit-identical (the trainers recompute the steps).
//
// SHARDOPT_CHAOS_SEED picks another schedule.
#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/checkpoint_catalog.h"
#include "common/checkpoint_files.h"
#include "common/checkpoint_testing.h"
#include "common/file.h"
#include "gtest/gtest.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "tests/support/process.h"
#include "tests/support/raw_calls.h"
#include "tests/support/synthetic.h"
#include "tests/support/training_job.h"

namespace shardopt::testing {
namespace {

constexpr uint32_t kShards = 3, kTrainers = 2;

uint64_t ChaosSeed() {
  uint64_t seed = 20261201;
  if (const char* s = std::getenv("SHARDOPT_CHAOS_SEED")) (void)absl::SimpleAtoi(s, &seed);
  return seed;
}

// The shard servers of one job: started with the same flags, restarted on
// the same addresses.
class Shards {
 public:
  Shards(std::vector<std::string> flags, const std::string& binary)
      : flags_(std::move(flags)) {
    placement_.binary = binary;
  }

  void StartAll() {
    auto servers = StartCluster(kShards, flags_, placement_);
    ASSERT_TRUE(servers.ok()) << servers.status();
    servers_ = std::move(*servers);
    addresses_ = Addresses(servers_);
  }
  const std::vector<std::string>& addresses() const { return addresses_; }

  void Kill(uint32_t i) {
    servers_[i]->process().Signal(SIGKILL);
    ASSERT_TRUE(servers_[i]->process().Wait(absl::Seconds(10)).has_value());
  }
  // Starts shard i again on its address; waits until it serves unless
  // `wait` is false (then it may still be restoring).
  void Restart(uint32_t i, bool wait = true) {
    std::vector<std::string> flags = flags_;
    flags.push_back("--listen=" + addresses_[i]);
    if (!wait) {
      // Started by hand: killed again before it reports its port.
      flags.push_back(absl::StrCat("--shard_index=", i));
      flags.push_back(absl::StrCat("--shard_count=", kShards));
      flags.push_back("--device=cpu");
      auto started = ChildProcess::Start(Runfile(placement_.binary), flags);
      ASSERT_TRUE(started.ok()) << started.status();
      early_ = std::move(*started);
      return;
    }
    auto restarted = ServerProcess::Start(i, kShards, flags, placement_);
    ASSERT_TRUE(restarted.ok()) << restarted.status();
    servers_[i] = std::move(*restarted);
  }
  // Kills the process Restart(i, false) started.
  void KillEarly() {
    early_->Signal(SIGKILL);
    ASSERT_TRUE(early_->Wait(absl::Seconds(10)).has_value());
    early_.reset();
  }
  int64_t HighestVersion(const std::string& model) const {
    int64_t v = -1;
    for (const std::string& a : addresses_) v = std::max(v, VersionOn(a, model));
    return v;
  }

 private:
  std::vector<std::string> flags_;
  ServerPlacement placement_;
  std::vector<std::unique_ptr<ServerProcess>> servers_;
  std::unique_ptr<ChildProcess> early_;
  std::vector<std::string> addresses_;
};

enum class Chaos {
  kShardMidPush,
  kShardMidCheckpointWrite,
  kShardMidRestore,
  kTwoShards,
  kAllShards,
  kTrainer,
  kTrainerThenShard,
  kCorruptNewestCheckpoint,
};

const char* Name(Chaos c) {
  switch (c) {
    case Chaos::kShardMidPush: return "kill one shard mid-push";
    case Chaos::kShardMidCheckpointWrite: return "kill one shard mid-checkpoint-write";
    case Chaos::kShardMidRestore: return "kill one shard, and again while it restores";
    case Chaos::kTwoShards: return "kill two shards at once";
    case Chaos::kAllShards: return "kill all shards at once";
    case Chaos::kTrainer: return "kill a trainer (restarted)";
    case Chaos::kTrainerThenShard: return "kill a trainer (restarted), then a shard";
    case Chaos::kCorruptNewestCheckpoint:
      return "kill all shards, flip a byte of the newest checkpoint, restart";
  }
  return "?";
}

struct Event {
  Chaos chaos;
  int64_t at_version;
  std::vector<uint32_t> victims;  // Shards (or the trainer rank).
};

// Every kind once, then extra random kills; shuffled, spread over the run.
std::vector<Event> Schedule(std::mt19937& rng, int steps, int extra) {
  std::vector<Chaos> kinds = {Chaos::kShardMidPush,     Chaos::kShardMidCheckpointWrite,
                              Chaos::kShardMidRestore,  Chaos::kTwoShards,
                              Chaos::kAllShards,        Chaos::kTrainer,
                              Chaos::kTrainerThenShard, Chaos::kCorruptNewestCheckpoint};
  for (int i = 0; i < extra; ++i) {
    kinds.push_back(static_cast<Chaos>(std::uniform_int_distribution<int>(0, 7)(rng)));
  }
  std::shuffle(kinds.begin(), kinds.end(), rng);
  std::vector<Event> events;
  for (size_t i = 0; i < kinds.size(); ++i) {
    Event e{kinds[i], static_cast<int64_t>((i + 1) * steps / (kinds.size() + 2)), {}};
    std::uniform_int_distribution<uint32_t> shard(0, kShards - 1);
    const uint32_t first = shard(rng);
    switch (e.chaos) {
      case Chaos::kTwoShards:
        e.victims = {first, (first + 1 + shard(rng) % (kShards - 1)) % kShards};
        break;
      case Chaos::kAllShards:
      case Chaos::kCorruptNewestCheckpoint:
        e.victims = {0, 1, 2};
        break;
      case Chaos::kTrainer:
      case Chaos::kTrainerThenShard:
        e.victims = {std::uniform_int_distribution<uint32_t>(0, kTrainers - 1)(rng), first};
        break;
      default:
        e.victims = {first};
    }
    events.push_back(e);
  }
  return events;
}

std::string Describe(const Event& e) {
  std::ostringstream out;
  out << "at version " << e.at_version << ": " << Name(e.chaos) << " (";
  for (size_t i = 0; i < e.victims.size(); ++i) out << (i ? ", " : "") << e.victims[i];
  out << ")";
  return out.str();
}

// Flips one byte in the first data block of shard `shard`'s part of the
// newest committed checkpoint; returns that checkpoint's step.
int64_t CorruptNewest(const std::string& model_root, uint32_t shard) {
  std::vector<CommittedCheckpoint> committed = ListCommittedCheckpoints(model_root).value();
  EXPECT_FALSE(committed.empty());
  if (committed.empty()) return -1;
  checkpoint_testing::FlipByte(
      JoinPath(committed[0].directory, CheckpointDataFileName(shard, kShards)),
      kCheckpointHeaderBytes + 12);
  return committed[0].step;
}

bool HasSetAside(const std::string& model_root, const std::string& prefix) {
  for (const std::string& n :
       FileEnv::Default()->ListDirectory(model_root).value_or(std::vector<std::string>())) {
    if (absl::StartsWith(n, prefix)) return true;
  }
  return false;
}

TEST(ChaosTest, KillsOfShardsAndTrainersNeverStopTheJob) {
  constexpr int kSteps = 300, kChangeAt = 151;
  constexpr double kMaxGradNorm = 0.5;  // Clips every step: each replay needs its decision.
  const std::string model = "adamw";
  const uint64_t seed = ChaosSeed();
  std::mt19937 rng(seed);
  const std::vector<Event> events = Schedule(rng, kSteps, /*extra=*/4);
  std::cout << "chaos seed " << seed << " (SHARDOPT_CHAOS_SEED), schedule:\n";
  for (const Event& e : events) std::cout << "  " << Describe(e) << "\n";
  std::cout << std::flush;

  const std::string root = MakeTempDir("chaos");
  const std::string ckpt = root + "/ckpt";
  const std::string model_root = ckpt + "/" + model;
  Shards shards({"--checkpoint_dir=" + ckpt, "--checkpoint_every=5", "--checkpoint_keep=3",
                 "--restore_from=" + ckpt, "--pause_checkpoint_data_writes_ms=40"},
                "tests/fault_injecting_server");
  ASSERT_NO_FATAL_FAILURE(shards.StartAll());
  const std::vector<std::string> trainer_flags = {"--journal_dir=" + root + "/journal",
                                                  "--chunk_bytes=256",
                                                  "--min_step_time=15ms",
                                                  "--retry_budget=120s",
                                                  "--rpc_timeout=20s",
                                                  absl::StrCat("--max_grad_norm=", kMaxGradNorm),
                                                  absl::StrCat("--lr_change=", kChangeAt, ":0.003"),
                                                  "--finish"};
  const std::string out = root + "/out";
  std::vector<std::unique_ptr<ChildProcess>> trainers;
  ASSERT_NO_FATAL_FAILURE(StartTrainers(shards.addresses(), kTrainers, model, kSteps, out,
                                        trainer_flags, &trainers));
  auto restart_trainer = [&](uint32_t rank) {
    trainers[rank]->Signal(SIGKILL);
    ASSERT_TRUE(trainers[rank]->Wait(absl::Seconds(10)).has_value());
    ASSERT_NO_FATAL_FAILURE(StartTrainer(shards.addresses(), rank, kTrainers, model, kSteps, out,
                                         trainer_flags, &trainers[rank]));
  };
  int corrupted = 0, mid_writes = 0;
  for (const Event& e : events) {
    const absl::Time give_up = absl::Now() + absl::Seconds(120);
    while (shards.HighestVersion(model) < e.at_version && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_GE(shards.HighestVersion(model), e.at_version) << "the job stalled before " << Describe(e);
    std::cout << "chaos: " << Describe(e) << " (the job is at version "
              << shards.HighestVersion(model) << ")" << std::endl;
    // A random moment of a step.
    absl::SleepFor(absl::Microseconds(std::uniform_int_distribution<int>(0, 15000)(rng)));
    switch (e.chaos) {
      case Chaos::kShardMidPush:
        ASSERT_NO_FATAL_FAILURE(shards.Kill(e.victims[0]));
        ASSERT_NO_FATAL_FAILURE(shards.Restart(e.victims[0]));
        break;
      case Chaos::kShardMidCheckpointWrite: {
        const bool writing =
            AwaitCheckpointInProgress(model_root, e.victims[0], kShards, absl::Seconds(5));
        std::cout << "  mid-write: " << writing << std::endl;
        mid_writes += writing;
        ASSERT_NO_FATAL_FAILURE(shards.Kill(e.victims[0]));
        ASSERT_NO_FATAL_FAILURE(shards.Restart(e.victims[0]));
        break;
      }
      case Chaos::kShardMidRestore:
        ASSERT_NO_FATAL_FAILURE(shards.Kill(e.victims[0]));
        ASSERT_NO_FATAL_FAILURE(shards.Restart(e.victims[0], /*wait=*/false));
        absl::SleepFor(absl::Milliseconds(std::uniform_int_distribution<int>(1, 25)(rng)));
        ASSERT_NO_FATAL_FAILURE(shards.KillEarly());
        ASSERT_NO_FATAL_FAILURE(shards.Restart(e.victims[0]));
        break;
      case Chaos::kTwoShards:
      case Chaos::kAllShards:
        for (uint32_t i : e.victims) ASSERT_NO_FATAL_FAILURE(shards.Kill(i));
        for (uint32_t i : e.victims) ASSERT_NO_FATAL_FAILURE(shards.Restart(i));
        break;
      case Chaos::kTrainer:
        ASSERT_NO_FATAL_FAILURE(restart_trainer(e.victims[0]));
        break;
      case Chaos::kTrainerThenShard: {
        ASSERT_NO_FATAL_FAILURE(restart_trainer(e.victims[0]));
        // Once it has rejoined (the job moves on again), the shard goes back
        // to its newest checkpoint: steps from before the trainer's restart
        // come from the restarted trainer's journal.
        const int64_t at = shards.HighestVersion(model);
        const absl::Time until = absl::Now() + absl::Seconds(60);
        while (shards.HighestVersion(model) < at + 2 && absl::Now() < until) {
          absl::SleepFor(absl::Milliseconds(2));
        }
        ASSERT_NO_FATAL_FAILURE(shards.Kill(e.victims[1]));
        ASSERT_NO_FATAL_FAILURE(shards.Restart(e.victims[1]));
        break;
      }
      case Chaos::kCorruptNewestCheckpoint: {
        for (uint32_t i : e.victims) ASSERT_NO_FATAL_FAILURE(shards.Kill(i));
        const uint32_t part = std::uniform_int_distribution<uint32_t>(0, kShards - 1)(rng);
        const int64_t step = CorruptNewest(model_root, part);
        std::cout << "  flipped a byte of shard " << part << "'s part of step " << step
                  << std::endl;
        for (uint32_t i : e.victims) ASSERT_NO_FATAL_FAILURE(shards.Restart(i));
        // Every shard fell back past it: it is set aside, never loaded.
        const bool set_aside =
            HasSetAside(model_root, absl::StrFormat(".damaged.step-%08d.", step));
        EXPECT_TRUE(set_aside);
        corrupted += set_aside;
        break;
      }
    }
  }
  ASSERT_NO_FATAL_FAILURE(AwaitTrainers(trainers, absl::Seconds(300)));
  ReferenceOptions reference;
  OptimizerConfig changed = OptimizerByName(model).value();
  changed.lr = 0.003;
  reference.changes[kChangeAt] = {changed, LrSchedule()};
  ExpectMatchesReference(model, kShards, kTrainers, kSteps, out, kMaxGradNorm, reference);
  ExpectEveryStepAppliedOnce(shards.addresses(), model, kSteps);
  // The shards still agree on their checkpoints: the last one committed
  // before the trainers' Finish returned.
  const std::string last =
      JoinPath(JoinPath(model_root, CheckpointStepDirName(kSteps)), kCheckpointManifestFile);
  EXPECT_TRUE(FileExists(FileEnv::Default(), last)) << last;
  int64_t replayed = 0, rollbacks = 0;
  for (uint32_t r = 0; r < kTrainers; ++r) {
    replayed += TrainerCount(out, r, model, "replayed");
    rollbacks += TrainerCount(out, r, model, "rollbacks");
  }
  std::cout << "chaos: " << events.size() << " events; steps re-pushed by the trainers (their "
            << "last processes): " << replayed << "; rollbacks: " << rollbacks << std::endl;
  EXPECT_GT(corrupted, 0);
  EXPECT_GT(mid_writes, 0);  // Some kill did land inside a checkpoint write.
  // The journals always reached back far enough: no rollback was needed (by
  // any trainer process: only a rollback abandons step directories).
  EXPECT_EQ(rollbacks, 0);
  EXPECT_FALSE(HasSetAside(model_root, ".abandoned.step-"));
}

// Trains `model` for 60 steps on shards that checkpoint every 10 steps; rank
// r keeps a journal when `journaled[r]`, else two steps in memory. Once
// shard 0 is at `kill_at`, shard 1 is killed and comes back from its
// checkpoint of step 20. The job must finish bit-identical, every step
// applied once. Returns where the trainers wrote.
std::string RunWithShard1BackAtStep20(const std::string& name, const std::string& model,
                                      int kill_at, const std::vector<bool>& journaled) {
  constexpr int kSteps = 60;
  const std::string root = MakeTempDir(name);
  const std::string ckpt = root + "/ckpt";
  Shards shards(CrashRecoveryFlags(ckpt, 10), "server/shardopt_server");
  EXPECT_NO_FATAL_FAILURE(shards.StartAll());
  const std::string out = root + "/out";
  std::vector<std::unique_ptr<ChildProcess>> trainers(kTrainers);
  for (uint32_t r = 0; r < kTrainers; ++r) {
    const std::vector<std::string> rank_flags = {
        "--min_step_time=10ms", "--retry_budget=60s", "--rpc_timeout=20s",
        journaled[r] ? "--journal_dir=" + root + "/journal" : "--replay_steps=2"};
    EXPECT_NO_FATAL_FAILURE(StartTrainer(shards.addresses(), r, kTrainers, model, kSteps, out,
                                         rank_flags, &trainers[r]));
  }
  if (::testing::Test::HasFatalFailure()) return out;
  AwaitVersion(shards.addresses()[0], model, kill_at);
  EXPECT_NO_FATAL_FAILURE(shards.Kill(1));
  EXPECT_NO_FATAL_FAILURE(shards.Restart(1));
  EXPECT_NO_FATAL_FAILURE(AwaitTrainers(trainers, absl::Seconds(120)));
  if (::testing::Test::HasFatalFailure()) return out;
  ExpectMatchesReference(model, kShards, kTrainers, kSteps, out);
  ExpectEveryStepAppliedOnce(shards.addresses(), model, kSteps);
  return out;
}

TEST(ChaosTest, AShardRestoredBeyondEveryTrainersHistoryRollsTheJobBack) {
  // Two steps of history in memory, no journal: a shard that goes back ten
  // steps cannot be replayed.
  const std::string model = "sgd_momentum";
  const std::string out =
      RunWithShard1BackAtStep20("rollback", model, /*kill_at=*/25, /*journaled=*/{false, false});
  ASSERT_FALSE(HasFatalFailure());
  int64_t rollbacks = 0;
  for (uint32_t r = 0; r < kTrainers; ++r) rollbacks += TrainerCount(out, r, model, "rollbacks");
  EXPECT_GE(rollbacks, 1);
  // What the trainers were told.
  std::string reason;
  for (uint32_t r = 0; r < kTrainers && reason.empty(); ++r) {
    std::ifstream in(absl::StrCat(out, "/rank", r, "/", model, ".rollback_reason"));
    std::getline(in, reason);
  }
  std::cout << "rollback: " << reason << std::endl;
  EXPECT_TRUE(absl::StrContains(reason, "the job rolled back to step 20 (the newest checkpoint "
                                        "every shard holds)"))
      << reason;
  EXPECT_TRUE(absl::StrContains(reason, "resume from step 21 with the parameters of version 20"))
      << reason;
  EXPECT_TRUE(absl::StrContains(reason, "this trainer no longer holds its push of step 21"))
      << reason;
}

// One trainer keeps a journal, the other only 2 steps in memory: a shard
// restored 6 steps back makes the second roll the job back while the first
// may be replaying to the same shard; both must end up recomputing or
// replaying the same steps on every shard, and the job still finishes
// bit-identical.
TEST(ChaosTest, ATrainerWithoutHistoryRollsBackWhileAnotherMayBeReplaying) {
  const std::string model = "adamw";
  const std::string out =
      RunWithShard1BackAtStep20("mixed_history", model, /*kill_at=*/26, /*journaled=*/{true, false});
  ASSERT_FALSE(HasFatalFailure());
  const int64_t rollbacks = TrainerCount(out, 0, model, "rollbacks") +
                            TrainerCount(out, 1, model, "rollbacks");
  std::cout << "mixed history: rollbacks " << rollbacks << ", replayed by the journaled trainer "
            << TrainerCount(out, 0, model, "replayed") << std::endl;
  EXPECT_GE(TrainerCount(out, 1, model, "rollbacks"), 1);
}

}  // namespace
}  // namespace shardopt::testing
