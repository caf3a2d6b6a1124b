// The device data plane with real processes, on the loopback kind (host
// memory, the NCCL protocol; tools/gpu_check.sh runs the nccl kind on a
// GPU): trainers push and pull fp32 over pairs opened with each shard, and
// the results are bit-identical to the gRPC stream's; 16-bit payloads and
// shards without pairs go the other ways in the same job; a shard killed
// with -9 in the middle of the job is re-joined over new pairs. Bad input
// through the pairs: device_pair_bad_input_test.
#include <signal.h>
#include <stdlib.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/nccl/loopback_environment.h"
#include "gtest/gtest.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "tests/support/gpu_required.h"
#include "tests/support/process.h"
#include "tests/support/raw_calls.h"
#include "tests/support/shard_queries.h"
#include "tests/support/synthetic.h"
#include "tests/support/training_job.h"
#include "tests/support/transport_jobs.h"

namespace shardopt::testing {
namespace {

constexpr int kSteps = 12;
const char kModels[] = "sgd_momentum,adam,adamw_amsgrad,adagrad";

std::vector<std::string> Models() { return absl::StrSplit(kModels, ','); }

// One job of `trainers` trainers, all with `trainer_flags`, on shards started
// with `server_flags[i]`; `own_nccl_hosts`: every process its own
// NCCL_HOSTID. Returns its root.
std::string RunJob(const std::vector<std::vector<std::string>>& server_flags, uint32_t trainers,
                   const std::vector<std::string>& trainer_flags, bool own_nccl_hosts = false) {
  return RunTransportJob(TransportJob{
      server_flags, trainers, std::vector<std::vector<std::string>>(trainers, trainer_flags),
      kModels, kSteps, own_nccl_hosts});
}

void ExpectSameResults(const std::string& a, const std::string& b, uint32_t trainers,
                       const std::string& label) {
  ExpectSameTrainerResults(a, b, trainers, kModels, label);
}

int64_t PairTransfers(const std::string& root, uint32_t rank, const std::string& name) {
  return TrainerCount(root, rank, name, "pair_transfers");
}

const std::vector<std::string> kGrpcOnly = {"--shared_memory=false", "--socket_payloads=false"};
const std::vector<std::string> kPairs = {"--shared_memory=false", "--socket_payloads=false",
                                         "--device_pairs=loopback"};
const std::vector<std::string> kPairServer = {"--device=cpu", "--device_pairs=loopback"};

class DevicePairTest : public ::testing::TestWithParam<std::tuple<uint32_t, uint32_t>> {};

TEST_P(DevicePairTest, LoopbackPairsMatchGrpcBitForBit) {
  const auto [shards, trainers] = GetParam();
  const std::vector<std::vector<std::string>> servers(shards, kPairServer);
  const std::string grpc = RunJob(servers, trainers, kGrpcOnly);
  const std::string pairs = RunJob(servers, trainers, kPairs);
  ASSERT_FALSE(HasFatalFailure());
  ExpectSameResults(grpc, pairs, trainers, "over loopback pairs");
  for (const std::string& name : Models()) {
    for (uint32_t r = 0; r < trainers; ++r) {
      EXPECT_EQ(PairTransfers(grpc, r, name), 0) << name;
      // A push and a pull per shard and step at least.
      EXPECT_GE(PairTransfers(pairs, r, name), 2 * kSteps * shards) << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ShardsByTrainers, DevicePairTest,
                         ::testing::Combine(::testing::Values(1u, 3u), ::testing::Values(1u, 2u)),
                         [](const auto& info) {
                           return absl::StrCat("S", std::get<0>(info.param), "_T",
                                               std::get<1>(info.param));
                         });

// Gradient control (clipping, loss scaling with planted overflows: pushes
// refused or skipped travel the pair too) and 16-bit payloads (which the
// pairs decline: the stream carries them), against the same over gRPC.
TEST(DevicePairVariantsTest, GradientControlAndSixteenBitMatchGrpc) {
  const std::vector<std::vector<std::string>> variants = {
      {"--max_grad_norm=1.5", "--loss_scaling", "--initial_loss_scale=1024",
       "--plant_inf_steps=3,6"},
      {"--push_dtype=bfloat16", "--pull_dtype=float32"},
  };
  for (const std::vector<std::string>& variant : variants) {
    const std::vector<std::vector<std::string>> servers(3, kPairServer);
    std::vector<std::string> grpc_flags = kGrpcOnly, pair_flags = kPairs;
    grpc_flags.insert(grpc_flags.end(), variant.begin(), variant.end());
    pair_flags.insert(pair_flags.end(), variant.begin(), variant.end());
    const std::string grpc = RunJob(servers, 2, grpc_flags);
    const std::string pairs = RunJob(servers, 2, pair_flags);
    ASSERT_FALSE(HasFatalFailure()) << absl::StrJoin(variant, " ");
    ExpectSameResults(grpc, pairs, 2, absl::StrJoin(variant, " "));
    // (bf16 pushes go over the stream, their fp32 pulls over the pairs.)
    EXPECT_GE(PairTransfers(pairs, 0, "adam"), kSteps * 3) << absl::StrJoin(variant, " ");
  }
}

// A shard without pairs in the same job: its pushes and pulls go over the
// stream, the others' over pairs.
TEST(DevicePairMixTest, AShardWithoutPairsUsesTheStream) {
  std::vector<std::vector<std::string>> servers(3, kPairServer);
  const std::string grpc = RunJob(servers, 2, kGrpcOnly);
  servers[1] = {"--device=cpu"};
  const std::string mixed = RunJob(servers, 2, kPairs);
  ASSERT_FALSE(HasFatalFailure());
  ExpectSameResults(grpc, mixed, 2, "mixed");
  for (const std::string& name : Models()) {
    EXPECT_GE(PairTransfers(mixed, 0, name), 2 * kSteps * 2) << name;
    EXPECT_LT(PairTransfers(mixed, 0, name), 2 * kSteps * 3) << name;
  }
}

// A GPU trainer's buffers (StepOnDevice, test_trainer --device_buffers: the
// parameters poisoned with NaN before each step): pairs send the gradient
// from them and write the parameters into them; a shard without pairs
// (mixed) gets its part through the host mirror. The bits of the stream.
TEST(DevicePairBuffersTest, DeviceBuffersMatchGrpcBitForBit) {
  for (bool mixed : {false, true}) {
    std::vector<std::vector<std::string>> servers(3, kPairServer);
    const std::string grpc = RunJob(servers, 2, kGrpcOnly);
    if (mixed) servers[1] = {"--device=cpu"};
    std::vector<std::string> flags = kPairs;
    flags.push_back("--device_buffers");
    const std::string pairs = RunJob(servers, 2, flags);
    ASSERT_FALSE(HasFatalFailure());
    ExpectSameResults(grpc, pairs, 2, mixed ? "device buffers, mixed" : "device buffers");
    for (const std::string& name : Models()) {
      for (uint32_t r = 0; r < 2; ++r) {
        // The pushes and pulls with a pair's shard, from and into the
        // device buffers themselves (all but a few: under load a call now
        // and then finds its pool's pairs still opening and goes over the
        // stream, into the host mirror; the bits above cover those too).
        EXPECT_GE(TrainerCount(pairs, r, name, "device_buffer_transfers"),
                  2 * kSteps * (mixed ? 2 : 3) * 9 / 10)
            << name;
        EXPECT_EQ(TrainerCount(grpc, r, name, "device_buffer_transfers"), 0) << name;
      }
    }
  }
}

// Skips (or fails, under SHARDOPT_REQUIRE_GPU=1) unless shardopt_server
// starts on cuda:0 with NCCL pairs.
void SkipUnlessNcclPairsRun() {
  const std::vector<std::string> flags = {"--device=cuda:0", "--device_pairs=nccl"};
  if (std::optional<int> rc = ServerExitsAtStart(flags)) {
    SHARDOPT_GPU_UNAVAILABLE(
        "no usable GPU: shardopt_server --device=cuda:0 --device_pairs=nccl "
        "exited with "
        << *rc << " (see its message above)");
  }
}

// NCCL pairs between trainers and shards on one GPU (tools/gpu_check.sh):
// the trainers' host buffers go through each pair's device buffer (and, as
// GPU trainers, their device buffers go straight), pushes land in the
// shards' device staging and are checked there, pulls are read device to
// device; the bits equal the same GPU job over gRPC streams.
TEST(DevicePairGpuTest, NcclPairsOnOneGpuMatchGrpcBitForBit) {
  SkipUnlessNcclPairsRun();
  if (IsSkipped() || HasFatalFailure()) return;
  const std::vector<std::vector<std::string>> servers(2,
                                                      {"--device=cuda:0", "--device_pairs=nccl"});
  const std::string grpc = RunJob(servers, 2, kGrpcOnly);
  const std::vector<std::string> nccl = {"--shared_memory=false", "--socket_payloads=false",
                                         "--device_pairs=nccl"};
  const std::string pairs = RunJob(servers, 2, nccl, /*own_nccl_hosts=*/true);
  // GPU trainers: gradients and parameters in device memory (StepOnDevice).
  std::vector<std::string> device_flags = nccl;
  device_flags.push_back("--device_buffers");
  const std::string device = RunJob(servers, 2, device_flags, /*own_nccl_hosts=*/true);
  ASSERT_FALSE(HasFatalFailure());
  ExpectSameResults(grpc, pairs, 2, "over NCCL pairs");
  ExpectSameResults(grpc, device, 2, "over NCCL pairs from device buffers");
  for (const std::string& name : Models()) {
    for (uint32_t r = 0; r < 2; ++r) {
      EXPECT_GE(PairTransfers(pairs, r, name), 2 * kSteps * 2) << name;
      EXPECT_GE(TrainerCount(device, r, name, "device_buffer_transfers"), 2 * kSteps * 2) << name;
    }
  }
}

// kill -9 of a shard in the middle of a job over pairs (checkpoints every 3
// steps, restore on restart): the trainers' pairs with it break, they join
// the restarted shard over new pairs (or, restarted with --device_pairs=off,
// go over the stream: the pairs they hold are refused and dropped), and the
// job ends with the bits of an uninterrupted one (exactly once).
// `nccl`: NCCL pairs on cuda:0 (every process its own NCCL_HOSTID), the
// trainers' pair calls failing within their deadline when the shard dies.
void KillShardMidJob(bool restart_with_pairs, bool nccl = false) {
  constexpr int kLongSteps = 60;
  const std::string root = MakeTempDir("pair_faults");
  const std::string ckpt = root + "/ckpt";
  const std::vector<std::string> flags = {nccl ? "--device=cuda:0" : "--device=cpu",
                                          nccl ? "--device_pairs=nccl" : "--device_pairs=loopback",
                                          "--checkpoint_dir=" + ckpt, "--checkpoint_every=3",
                                          "--restore_from=" + ckpt};
  if (nccl) nccl::UseNcclOverLoopback();
  const auto host_id = [nccl](const std::string& who) {
    if (nccl) setenv("NCCL_HOSTID", absl::StrCat("shardopt-faults-", who).c_str(), 1);
  };
  std::vector<std::unique_ptr<ServerProcess>> servers;
  for (uint32_t i = 0; i < 2; ++i) {
    host_id(absl::StrCat("shard", i));
    auto server = ServerProcess::Start(i, 2, flags);
    ASSERT_TRUE(server.ok()) << server.status();
    servers.push_back(std::move(*server));
  }
  const std::vector<std::string> addresses = Addresses(servers);
  std::vector<std::string> trainer_flags = {"--min_step_time=50ms", "--replay_steps=8",
                                            "--rpc_timeout=5s", "--shared_memory=false",
                                            "--socket_payloads=false"};
  trainer_flags.push_back(nccl ? "--device_pairs=nccl" : "--device_pairs=loopback");
  std::vector<std::unique_ptr<ChildProcess>> trainers(2);
  for (uint32_t r = 0; r < 2; ++r) {
    host_id(absl::StrCat("trainer", r));
    ASSERT_NO_FATAL_FAILURE(StartTrainer(addresses, r, 2, "adamw", kLongSteps, root + "/out",
                                         trainer_flags, &trainers[r]));
  }
  ASSERT_NO_FATAL_FAILURE(AwaitVersion(addresses[0], "adamw", 8));
  EXPECT_GE(ServerInfoOf(addresses[1]).device_pairs(), 2u)
      << "each trainer holds a pair with shard 1";
  servers[1]->process().Signal(SIGKILL);
  ASSERT_TRUE(servers[1]->process().Wait(absl::Seconds(10)).has_value());
  std::vector<std::string> restart = flags;
  if (!restart_with_pairs) restart.push_back("--device_pairs=off");
  host_id("shard1-again");
  auto restarted = StartServerAt(addresses[1], 1, 2, restart);
  if (nccl) unsetenv("NCCL_HOSTID");
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  servers[1] = std::move(*restarted);
  ASSERT_NO_FATAL_FAILURE(AwaitVersion(addresses[1], "adamw", 20));
  if (restart_with_pairs) {
    // (The trainers' pair calls with the dead shard failed: its retries went
    // over the stream, and new pairs come after a short backoff.)
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    while (ServerInfoOf(addresses[1]).device_pairs() < 2 && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    EXPECT_GE(ServerInfoOf(addresses[1]).device_pairs(), 2u) << "the trainers joined new pairs";
  } else {
    EXPECT_EQ(ServerInfoOf(addresses[1]).device_pair_kind(), "");
  }
  ASSERT_NO_FATAL_FAILURE(AwaitTrainers(trainers));
  ExpectMatchesReference("adamw", 2, 2, kLongSteps, root + "/out");
  for (uint32_t r = 0; r < 2; ++r) {
    // Shard 0's pushes and pulls at least, all along.
    EXPECT_GE(PairTransfers(root + "/out", r, "adamw"), 2 * kLongSteps) << "rank " << r;
  }
}

TEST(DevicePairFaultTest, AKilledShardIsJoinedAgainOverNewPairs) { KillShardMidJob(true); }

TEST(DevicePairFaultTest, AShardRestartedWithoutPairsGetsTheStream) { KillShardMidJob(false); }

// The same over NCCL pairs on one GPU (tools/gpu_check.sh): a shard killed
// in the middle of the job; the trainers' NCCL calls with it fail within
// their deadline, they join the restarted shard over new pairs, and the job
// ends exactly.
TEST(DevicePairGpuTest, AKilledShardOverNcclPairs) {
  SkipUnlessNcclPairsRun();
  if (IsSkipped() || HasFatalFailure()) return;
  KillShardMidJob(true, /*nccl=*/true);
}

}  // namespace
}  // namespace shardopt::testing
