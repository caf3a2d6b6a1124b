// The shared-memory data plane with real processes: trainers and shards on
// this host move payloads through the trainer's segment, and the results are
// bit-identical to the gRPC stream's (the reference comparison itself is in
// end_to_end_test, which runs over shared memory); mixed jobs; kill -9 of
// either side (the shard's mapping goes away, the trainer re-attaches to a
// restarted shard); and bad input through the new path.
#include "common/shared_memory.h"

#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "tests/support/process.h"
#include "tests/support/raw_calls.h"
#include "tests/support/synthetic.h"
#include "tests/support/training_job.h"

namespace shardopt::testing {
namespace {

constexpr int kSteps = 12;
// A model of every optimizer family.
const char kModels[] = "sgd_momentum,adam,adamw_amsgrad,adagrad";

std::vector<std::string> Models() { return absl::StrSplit(kModels, ','); }

std::vector<float> Floats(const std::string& path) {
  absl::StatusOr<std::vector<float>> got = ReadFloats(path);
  EXPECT_TRUE(got.ok()) << got.status();
  return got.ok() ? *got : std::vector<float>{};
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// One job of `trainers` trainers on shards started with `server_flags[i]`
// (one entry per shard), trainer r with `trainer_flags[r]`; returns its root.
std::string RunJob(const std::vector<std::vector<std::string>>& server_flags, uint32_t trainers,
                   const std::vector<std::vector<std::string>>& trainer_flags,
                   const std::string& models = kModels) {
  const uint32_t shards = static_cast<uint32_t>(server_flags.size());
  std::vector<std::unique_ptr<ServerProcess>> servers;
  for (uint32_t i = 0; i < shards; ++i) {
    auto server = ServerProcess::Start(i, shards, server_flags[i]);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return "";
    servers.push_back(std::move(*server));
  }
  const std::string root = MakeTempDir("shm");
  std::vector<std::unique_ptr<ChildProcess>> procs(trainers);
  for (uint32_t r = 0; r < trainers; ++r) {
    StartTrainer(Addresses(servers), r, trainers, models, kSteps, root, trainer_flags[r],
                 &procs[r]);
  }
  AwaitTrainers(procs);
  return root;
}

// Every rank's pulled parameters and the masters are the same in both jobs.
void ExpectSameResults(const std::string& a, const std::string& b, uint32_t trainers,
                       const std::string& label) {
  for (const std::string& name : Models()) {
    for (uint32_t r = 0; r < trainers; ++r) {
      for (const char* suffix : {".bin", ".master.bin"}) {
        const std::string file = absl::StrCat("/rank", r, "/", name, suffix);
        EXPECT_TRUE(SameBits(Floats(a + file), Floats(b + file))) << label << ": " << file;
      }
    }
  }
}

int64_t Transfers(const std::string& root, uint32_t rank, const std::string& name) {
  return TrainerCount(root, rank, name, "shm_transfers");
}

class TransportTest : public ::testing::TestWithParam<std::tuple<uint32_t, uint32_t>> {};

// The same job over the gRPC stream, through shared memory with the client
// copying (any buffers) and with the client's shared buffers (no copy on the
// trainer's side): the same bits.
TEST_P(TransportTest, SharedMemoryMatchesGrpcBitForBit) {
  const auto [shards, trainers] = GetParam();
  const std::vector<std::vector<std::string>> servers(shards, {"--device=cpu"});
  const std::string grpc =
      RunJob(servers, trainers,
             std::vector<std::vector<std::string>>(trainers, {"--shared_memory=false"}));
  const std::string copied =
      RunJob(servers, trainers, std::vector<std::vector<std::string>>(trainers));
  const std::string in_place = RunJob(
      servers, trainers, std::vector<std::vector<std::string>>(trainers, {"--shared_buffers"}));
  ASSERT_FALSE(HasFatalFailure());
  ExpectSameResults(grpc, copied, trainers, "copied through shared memory");
  ExpectSameResults(grpc, in_place, trainers, "in the shared buffers");
  for (const std::string& name : Models()) {
    for (uint32_t r = 0; r < trainers; ++r) {
      EXPECT_EQ(Transfers(grpc, r, name), 0) << name;
      // A push and a pull per shard and step at least.
      EXPECT_GE(Transfers(copied, r, name), 2 * kSteps * shards) << name;
      EXPECT_GE(Transfers(in_place, r, name), 2 * kSteps * shards) << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ShardsByTrainers, TransportTest,
                         ::testing::Combine(::testing::Values(1u, 3u), ::testing::Values(1u, 2u)),
                         [](const auto& info) {
                           return absl::StrCat("S", std::get<0>(info.param), "_T",
                                               std::get<1>(info.param));
                         });

// 16-bit wire types and gradient control (clipping, loss scaling with
// planted overflows) through shared memory, against the same over gRPC.
TEST(TransportVariantsTest, SixteenBitAndGradientControlMatchGrpc) {
  const std::vector<std::vector<std::string>> variants = {
      {"--push_dtype=bfloat16", "--pull_dtype=bfloat16"},
      {"--push_dtype=float16", "--pull_dtype=float32"},
      {"--pull_dtype=float16", "--shared_buffers"},
      {"--max_grad_norm=1.5", "--loss_scaling", "--initial_loss_scale=1024",
       "--plant_inf_steps=3,6"},
  };
  for (const std::vector<std::string>& variant : variants) {
    const std::vector<std::vector<std::string>> servers(3, {"--device=cpu"});
    std::vector<std::string> grpc_flags = {"--shared_memory=false"};
    for (const std::string& f : variant) {
      if (f != "--shared_buffers") grpc_flags.push_back(f);
    }
    const std::string grpc =
        RunJob(servers, 2, std::vector<std::vector<std::string>>(2, grpc_flags));
    const std::string shared =
        RunJob(servers, 2, std::vector<std::vector<std::string>>(2, variant));
    ASSERT_FALSE(HasFatalFailure()) << absl::StrJoin(variant, " ");
    ExpectSameResults(grpc, shared, 2, absl::StrJoin(variant, " "));
    EXPECT_GT(Transfers(shared, 0, "adam"), 0) << absl::StrJoin(variant, " ");
  }
}

// Some pairs through shared memory, others over gRPC: a trainer that turned
// it off, and a shard that runs without it.
TEST(TransportMixTest, MixedPairsMatchAllGrpc) {
  const std::vector<std::vector<std::string>> plain(3, {"--device=cpu"});
  const std::string grpc =
      RunJob(plain, 2, std::vector<std::vector<std::string>>(2, {"--shared_memory=false"}));
  std::vector<std::vector<std::string>> one_without = plain;
  one_without[1].push_back("--noshared_memory");
  const std::string mixed = RunJob(one_without, 2, {{}, {"--shared_memory=false"}});
  ASSERT_FALSE(HasFatalFailure());
  ExpectSameResults(grpc, mixed, 2, "mixed");
  for (const std::string& name : Models()) {
    // Rank 0 used shared memory with shards 0 and 2 only; rank 1 never.
    EXPECT_GE(Transfers(mixed, 0, name), 2 * kSteps * 2) << name;
    EXPECT_LT(Transfers(mixed, 0, name), 2 * kSteps * 3) << name;
    EXPECT_EQ(Transfers(mixed, 1, name), 0) << name;
  }
}

// Lines of /proc/<pid>/maps that map a shardopt memfd segment.
int SegmentMappings(pid_t pid) {
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  int count = 0;
  for (std::string line; std::getline(maps, line);) {
    count += absl::StrContains(line, "/memfd:shardopt") ? 1 : 0;
  }
  return count;
}

// Polls `holds` until it is true or `timeout` passed; whether it held.
bool Becomes(const std::function<bool()>& holds, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!holds()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

v1::ServerInfo Info(const std::string& address) {
  v1::ServerInfo info;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  EXPECT_TRUE(NewStub(address)->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
  return info;
}

// kill -9 of a trainer: the shard drops its attachment and unmaps the
// segment (the memory is gone with the last holder). kill -9 of a shard
// mid-job: the trainers re-attach to its restarted process and the job ends
// with the bits of an uninterrupted one.
TEST(TransportFaultTest, KilledTrainerIsDetachedAndKilledShardReattached) {
  const std::string root = MakeTempDir("shm_faults");
  const std::string ckpt = root + "/ckpt";
  const std::vector<std::string> flags = {"--checkpoint_dir=" + ckpt, "--checkpoint_every=3",
                                          "--restore_from=" + ckpt};
  auto servers = StartCluster(2, flags);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::vector<std::string> addresses = Addresses(*servers);
  constexpr int kLongSteps = 80;
  std::vector<std::unique_ptr<ChildProcess>> trainers(2);
  const std::vector<std::string> slow = {"--min_step_time=50ms", "--replay_steps=8"};
  for (uint32_t r = 0; r < 2; ++r) {
    ASSERT_NO_FATAL_FAILURE(
        StartTrainer(addresses, r, 2, "adamw", kLongSteps, root + "/out", slow, &trainers[r]));
  }
  ASSERT_NO_FATAL_FAILURE(AwaitVersion(addresses[0], "adamw", 8));
  EXPECT_EQ(Info(addresses[0]).shared_memory_attachments(), 2u);
  EXPECT_GE(SegmentMappings((*servers)[0]->process().pid()), 2);

  // A shard dies in the middle of the job and comes back on its port.
  (*servers)[1]->process().Signal(SIGKILL);
  ASSERT_TRUE((*servers)[1]->process().Wait(absl::Seconds(10)).has_value());
  std::vector<std::string> restart = flags;
  restart.push_back("--listen=" + addresses[1]);
  auto restarted = ServerProcess::Start(1, 2, restart);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  (*servers)[1] = std::move(*restarted);
  ASSERT_NO_FATAL_FAILURE(AwaitVersion(addresses[1], "adamw", 20));
  // (A trainer asks a shard that did not answer again 250 ms later.)
  Becomes([&] { return Info(addresses[1]).shared_memory_attachments() == 2; }, absl::Seconds(10));
  EXPECT_EQ(Info(addresses[1]).shared_memory_attachments(), 2u) << "the trainers re-attached";
  ASSERT_NO_FATAL_FAILURE(AwaitTrainers(trainers));
  ExpectMatchesReference("adamw", 2, 2, kLongSteps, root + "/out");
  EXPECT_GE(TrainerCount(root + "/out", 0, "adamw", "shm_transfers"), 2 * kLongSteps);

  // The trainers have exited: every attachment and mapping is gone.
  for (const auto& server : *servers) {
    Becomes([&] { return Info(server->address()).shared_memory_attachments() == 0; },
            absl::Seconds(10));
    EXPECT_EQ(Info(server->address()).shared_memory_attachments(), 0u);
    EXPECT_EQ(SegmentMappings(server->process().pid()), 0);
  }

  // A trainer killed with SIGKILL mid-job is detached the same way.
  std::unique_ptr<ChildProcess> doomed;
  ASSERT_NO_FATAL_FAILURE(
      StartTrainer(addresses, 0, 2, "adamw", kLongSteps + 100, root + "/out2", slow, &doomed));
  Becomes([&] { return Info(addresses[0]).shared_memory_attachments() != 0; }, absl::Seconds(30));
  ASSERT_EQ(Info(addresses[0]).shared_memory_attachments(), 1u);
  doomed->Signal(SIGKILL);
  ASSERT_TRUE(doomed->Wait(absl::Seconds(10)).has_value());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  Becomes([&] { return Info(addresses[0]).shared_memory_attachments() == 0; },
          deadline - absl::Now());
  EXPECT_EQ(Info(addresses[0]).shared_memory_attachments(), 0u);
  // (Its pull of the next step held the mapping until the shard saw that
  // call cancelled.)
  Becomes([&] { return SegmentMappings((*servers)[0]->process().pid()) == 0; },
          deadline - absl::Now());
  EXPECT_EQ(SegmentMappings((*servers)[0]->process().pid()), 0);
}

}  // namespace
}  // namespace shardopt::testing
