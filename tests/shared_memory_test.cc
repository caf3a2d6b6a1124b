// The data planes with real processes: trainers and shards on this host
// move payloads through the trainer's shared segment, or (shared memory off)
// over payload sockets, and the results are bit-identical to the gRPC
// stream's (the reference comparison itself is in end_to_end_test, which
// runs over shared memory); mixed jobs; kill -9 of either side (the shard's
// mapping or links go away, the trainer re-attaches to a restarted shard).
// Bad input through the new paths: shared_memory_bad_input_test,
// payload_socket_bad_input_test.
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

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "tests/support/process.h"
#include "tests/support/raw_calls.h"
#include "tests/support/shard_queries.h"
#include "tests/support/synthetic.h"
#include "tests/support/training_job.h"
#include "tests/support/transport_jobs.h"

namespace shardopt::testing {
namespace {

constexpr int kSteps = 12;
// A model of every optimizer family.
const char kModels[] = "sgd_momentum,adam,adamw_amsgrad,adagrad";

std::vector<std::string> Models() { return absl::StrSplit(kModels, ','); }

// One job of `trainers` trainers on shards started with `server_flags[i]`
// (one entry per shard), trainer r with `trainer_flags[r]`; returns its root.
std::string RunJob(const std::vector<std::vector<std::string>>& server_flags, uint32_t trainers,
                   const std::vector<std::vector<std::string>>& trainer_flags,
                   const std::string& models = kModels) {
  return RunTransportJob(TransportJob{server_flags, trainers, trainer_flags, models, kSteps});
}

// Every rank's pulled parameters and the masters are the same in both jobs.
void ExpectSameResults(const std::string& a, const std::string& b, uint32_t trainers,
                       const std::string& label) {
  ExpectSameTrainerResults(a, b, trainers, kModels, label);
}

int64_t Transfers(const std::string& root, uint32_t rank, const std::string& name) {
  return TrainerCount(root, rank, name, "shm_transfers");
}
int64_t SocketTransfers(const std::string& root, uint32_t rank, const std::string& name) {
  return TrainerCount(root, rank, name, "socket_transfers");
}

// Trainers whose payloads go in the gRPC streams, and over payload sockets.
const std::vector<std::string> kGrpcOnly = {"--shared_memory=false", "--socket_payloads=false"};
const std::vector<std::string> kSocket = {"--shared_memory=false"};

class TransportTest : public ::testing::TestWithParam<std::tuple<uint32_t, uint32_t>> {};

// The same job over the gRPC stream, through shared memory with the client
// copying (any buffers) and with the client's shared buffers (no copy on the
// trainer's side): the same bits.
TEST_P(TransportTest, SharedMemoryMatchesGrpcBitForBit) {
  const auto [shards, trainers] = GetParam();
  const std::vector<std::vector<std::string>> servers(shards, {"--device=cpu"});
  const std::string grpc =
      RunJob(servers, trainers, std::vector<std::vector<std::string>>(trainers, kGrpcOnly));
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
      EXPECT_EQ(SocketTransfers(copied, r, name), 0) << "shared memory goes first";
    }
  }
}

// The same job over the gRPC stream and over payload sockets: the same bits.
TEST_P(TransportTest, PayloadSocketsMatchGrpcBitForBit) {
  const auto [shards, trainers] = GetParam();
  const std::vector<std::vector<std::string>> servers(shards, {"--device=cpu"});
  const std::string grpc =
      RunJob(servers, trainers, std::vector<std::vector<std::string>>(trainers, kGrpcOnly));
  const std::string socket =
      RunJob(servers, trainers, std::vector<std::vector<std::string>>(trainers, kSocket));
  ASSERT_FALSE(HasFatalFailure());
  ExpectSameResults(grpc, socket, trainers, "over payload sockets");
  for (const std::string& name : Models()) {
    for (uint32_t r = 0; r < trainers; ++r) {
      EXPECT_EQ(SocketTransfers(grpc, r, name), 0) << name;
      EXPECT_EQ(Transfers(socket, r, name), 0) << name;
      EXPECT_GE(SocketTransfers(socket, r, name), 2 * kSteps * shards) << name;
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
// planted overflows) through shared memory and over payload sockets,
// against the same over gRPC.
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
    std::vector<std::string> grpc_flags = kGrpcOnly;
    std::vector<std::string> socket_flags = kSocket;
    for (const std::string& f : variant) {
      if (f == "--shared_buffers") continue;
      grpc_flags.push_back(f);
      socket_flags.push_back(f);
    }
    const std::string grpc =
        RunJob(servers, 2, std::vector<std::vector<std::string>>(2, grpc_flags));
    const std::string shared =
        RunJob(servers, 2, std::vector<std::vector<std::string>>(2, variant));
    const std::string socket =
        RunJob(servers, 2, std::vector<std::vector<std::string>>(2, socket_flags));
    ASSERT_FALSE(HasFatalFailure()) << absl::StrJoin(variant, " ");
    ExpectSameResults(grpc, shared, 2, absl::StrJoin(variant, " "));
    ExpectSameResults(grpc, socket, 2, absl::StrJoin(socket_flags, " "));
    EXPECT_GT(Transfers(shared, 0, "adam"), 0) << absl::StrJoin(variant, " ");
    EXPECT_GT(SocketTransfers(socket, 0, "adam"), 0) << absl::StrJoin(variant, " ");
  }
}

// Some pairs through shared memory, others over gRPC: a trainer that turned
// it off, and a shard that runs without it.
TEST(TransportMixTest, MixedPairsMatchAllGrpc) {
  const std::vector<std::vector<std::string>> plain(3, {"--device=cpu"});
  const std::string grpc = RunJob(plain, 2, std::vector<std::vector<std::string>>(2, kGrpcOnly));
  std::vector<std::vector<std::string>> one_without = plain;
  one_without[1].push_back("--noshared_memory");
  one_without[1].push_back("--nopayload_socket");
  one_without[2].push_back("--noshared_memory");
  // Rank 0: shared memory with shard 0, a payload socket with shard 2, the
  // stream with shard 1; rank 1: payload sockets with shards 0 and 2.
  const std::string mixed = RunJob(one_without, 2, {{}, kSocket});
  ASSERT_FALSE(HasFatalFailure());
  ExpectSameResults(grpc, mixed, 2, "mixed");
  for (const std::string& name : Models()) {
    EXPECT_GE(Transfers(mixed, 0, name), 2 * kSteps) << name;
    EXPECT_LT(Transfers(mixed, 0, name), 2 * kSteps * 2) << name;
    EXPECT_GE(SocketTransfers(mixed, 0, name), 2 * kSteps) << name;
    EXPECT_LT(SocketTransfers(mixed, 0, name), 2 * kSteps * 2) << name;
    EXPECT_EQ(Transfers(mixed, 1, name), 0) << name;
    EXPECT_GE(SocketTransfers(mixed, 1, name), 2 * kSteps * 2) << name;
    EXPECT_LT(SocketTransfers(mixed, 1, name), 2 * kSteps * 3) << name;
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

// A job of 2 trainers on 2 shards that checkpoint every 3 steps and
// restore on restart, slow enough to be hit mid-job.
class TransportFaultTest : public ::testing::Test {
 protected:
  static constexpr int kLongSteps = 80;

  // Starts the shards and the trainers (with `trainer_flags` besides the
  // pace); returns once shard 0 is at version 8.
  void StartJob(const std::string& prefix, const std::vector<std::string>& trainer_flags) {
    root_ = MakeTempDir(prefix);
    const std::string ckpt = root_ + "/ckpt";
    flags_ = CrashRecoveryFlags(ckpt, 3);
    auto servers = StartCluster(2, flags_);
    ASSERT_TRUE(servers.ok()) << servers.status();
    servers_ = *std::move(servers);
    addresses_ = Addresses(servers_);
    trainer_flags_ = {"--min_step_time=50ms", "--replay_steps=8"};
    trainer_flags_.insert(trainer_flags_.end(), trainer_flags.begin(), trainer_flags.end());
    trainers_.resize(2);
    for (uint32_t r = 0; r < 2; ++r) {
      ASSERT_NO_FATAL_FAILURE(StartTrainer(addresses_, r, 2, "adamw", kLongSteps, root_ + "/out",
                                           trainer_flags_, &trainers_[r]));
    }
    ASSERT_NO_FATAL_FAILURE(AwaitVersion(addresses_[0], "adamw", 8));
  }
  // kill -9 of shard 1, restarted on its port; returns once it is at 20.
  void KillAndRestartShard() {
    servers_[1]->process().Signal(SIGKILL);
    ASSERT_TRUE(servers_[1]->process().Wait(absl::Seconds(10)).has_value());
    auto restarted = StartServerAt(addresses_[1], 1, 2, flags_);
    ASSERT_TRUE(restarted.ok()) << restarted.status();
    servers_[1] = std::move(*restarted);
    ASSERT_NO_FATAL_FAILURE(AwaitVersion(addresses_[1], "adamw", 20));
  }
  // The trainers end; the job has the bits of an uninterrupted one.
  void AwaitJob() {
    ASSERT_NO_FATAL_FAILURE(AwaitTrainers(trainers_));
    ExpectMatchesReference("adamw", 2, 2, kLongSteps, root_ + "/out");
  }
  // A third trainer (as rank 0 of another job root) that `started` says
  // reached shard 0, then kill -9.
  void KillATrainerOnceItIsIn(const std::function<bool()>& started) {
    std::unique_ptr<ChildProcess> doomed;
    ASSERT_NO_FATAL_FAILURE(StartTrainer(addresses_, 0, 2, "adamw", kLongSteps + 100,
                                         root_ + "/out2", trainer_flags_, &doomed));
    ASSERT_TRUE(Becomes(started, absl::Seconds(30)));
    doomed->Signal(SIGKILL);
    ASSERT_TRUE(doomed->Wait(absl::Seconds(10)).has_value());
  }

  std::string root_;
  std::vector<std::string> flags_;
  std::vector<std::string> trainer_flags_;
  std::vector<std::unique_ptr<ServerProcess>> servers_;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<ChildProcess>> trainers_;
};

// kill -9 of a trainer: the shard drops its attachment and unmaps the
// segment (the memory is gone with the last holder). kill -9 of a shard
// mid-job: the trainers re-attach to its restarted process and the job ends
// with the bits of an uninterrupted one.
TEST_F(TransportFaultTest, KilledTrainerIsDetachedAndKilledShardReattached) {
  ASSERT_NO_FATAL_FAILURE(StartJob("shm_faults", {}));
  EXPECT_EQ(ServerInfoOf(addresses_[0]).shared_memory_attachments(), 2u);
  EXPECT_GE(SegmentMappings(servers_[0]->process().pid()), 2);

  ASSERT_NO_FATAL_FAILURE(KillAndRestartShard());
  // (A trainer asks a shard that did not answer again 250 ms later.)
  Becomes([&] { return ServerInfoOf(addresses_[1]).shared_memory_attachments() == 2; },
          absl::Seconds(10));
  EXPECT_EQ(ServerInfoOf(addresses_[1]).shared_memory_attachments(), 2u)
      << "the trainers re-attached";
  ASSERT_NO_FATAL_FAILURE(AwaitJob());
  EXPECT_GE(Transfers(root_ + "/out", 0, "adamw"), 2 * kLongSteps);

  // The trainers have exited: every attachment and mapping is gone.
  for (const auto& server : servers_) {
    Becomes([&] { return ServerInfoOf(server->address()).shared_memory_attachments() == 0; },
            absl::Seconds(10));
    EXPECT_EQ(ServerInfoOf(server->address()).shared_memory_attachments(), 0u);
    EXPECT_EQ(SegmentMappings(server->process().pid()), 0);
  }

  // A trainer killed with SIGKILL mid-job is detached the same way.
  ASSERT_NO_FATAL_FAILURE(KillATrainerOnceItIsIn(
      [&] { return ServerInfoOf(addresses_[0]).shared_memory_attachments() == 1; }));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  Becomes([&] { return ServerInfoOf(addresses_[0]).shared_memory_attachments() == 0; },
          deadline - absl::Now());
  EXPECT_EQ(ServerInfoOf(addresses_[0]).shared_memory_attachments(), 0u);
  // (Its pull of the next step held the mapping until the shard saw that
  // call cancelled.)
  Becomes([&] { return SegmentMappings(servers_[0]->process().pid()) == 0; },
          deadline - absl::Now());
  EXPECT_EQ(SegmentMappings(servers_[0]->process().pid()), 0);
}

// The same over payload sockets: kill -9 of a shard in the middle of the
// job (the trainers' links break; they open new ones to the restarted shard
// and the job ends with the bits of an uninterrupted one), then kill -9 of a
// trainer (its links are dropped).
TEST_F(TransportFaultTest, PayloadSocketLinksSurviveKilledShardsAndTrainers) {
  ASSERT_NO_FATAL_FAILURE(StartJob("socket_faults", kSocket));
  EXPECT_GE(ServerInfoOf(addresses_[0]).payload_socket_links(), 2u);

  ASSERT_NO_FATAL_FAILURE(KillAndRestartShard());
  EXPECT_GE(ServerInfoOf(addresses_[1]).payload_socket_links(), 2u)
      << "the trainers opened new links";
  ASSERT_NO_FATAL_FAILURE(AwaitJob());
  EXPECT_GE(SocketTransfers(root_ + "/out", 0, "adamw"), 2 * kLongSteps);
  for (const auto& server : servers_) {
    Becomes([&] { return ServerInfoOf(server->address()).payload_socket_links() == 0; },
            absl::Seconds(10));
    EXPECT_EQ(ServerInfoOf(server->address()).payload_socket_links(), 0u);
  }

  ASSERT_NO_FATAL_FAILURE(KillATrainerOnceItIsIn(
      [&] { return ServerInfoOf(addresses_[0]).payload_socket_links() != 0; }));
  Becomes([&] { return ServerInfoOf(addresses_[0]).payload_socket_links() == 0; },
          absl::Seconds(10));
  EXPECT_EQ(ServerInfoOf(addresses_[0]).payload_socket_links(), 0u);
}

// A child the trainer forked without exec (a DataLoader worker) that lives
// on after a kill -9 of the trainer holds none of the trainer's data-plane
// sockets (common/fork_private.h): the shard drops the attachment (its
// mapping of the segment) and the payload links while the child still runs.
TEST(ForkedChildTest, AKilledTrainersForkedChildHoldsNoAttachmentOrLink) {
  struct Plane {
    const char* name;
    std::vector<std::string> flags;
    std::function<uint32_t(const v1::ServerInfo&)> held;
    bool maps_segment;
  };
  const Plane planes[] = {
      {"shared memory",
       {},
       [](const v1::ServerInfo& info) { return info.shared_memory_attachments(); },
       true},
      {"payload sockets", kSocket,
       [](const v1::ServerInfo& info) { return info.payload_socket_links(); }, false}};
  for (const Plane& plane : planes) {
    SCOPED_TRACE(plane.name);
    auto servers = StartCluster(1, {});  // (A shard of its own: the model starts at 0.)
    ASSERT_TRUE(servers.ok()) << servers.status();
    const std::string address = (*servers)[0]->address();
    const std::string root = MakeTempDir("forked_child");
    // (The child holds the trainer's gRPC connection, which is not ours to
    // close: the shard's calls of the dead trainer end at their 5 s
    // deadlines instead of at once.)
    std::vector<std::string> flags = {"--min_step_time=50ms", "--fork_child_at_step=3",
                                      "--rpc_timeout=5s"};
    flags.insert(flags.end(), plane.flags.begin(), plane.flags.end());
    std::unique_ptr<ChildProcess> trainer;
    ASSERT_NO_FATAL_FAILURE(StartTrainer({address}, 0, 1, "adamw", 100000, root, flags, &trainer));
    pid_t child = 0;
    // (The child sleeps 5 minutes: not past a failed check.)
    const absl::Cleanup kill_child = [&child] {
      if (child > 0) kill(child, SIGKILL);
    };
    ASSERT_TRUE(Becomes(
        [&] {
          std::ifstream(root + "/rank0/forked_child.pid") >> child;
          return child > 0 && plane.held(ServerInfoOf(address)) > 0;
        },
        absl::Seconds(30)))
        << "the trainer did not fork its child, or holds nothing on the shard";
    trainer->Signal(SIGKILL);
    ASSERT_TRUE(trainer->Wait(absl::Seconds(10)).has_value());
    const bool dropped =
        Becomes([&] { return plane.held(ServerInfoOf(address)) == 0; }, absl::Seconds(10));
    const bool child_alive = kill(child, 0) == 0;
    EXPECT_TRUE(dropped) << "the shard still holds " << plane.held(ServerInfoOf(address))
                         << " of the killed trainer's " << plane.name
                         << " through the child it forked";
    EXPECT_TRUE(child_alive) << "the child was gone before the shard looked: nothing shown";
    if (plane.maps_segment) {
      const pid_t shard = (*servers)[0]->process().pid();
      EXPECT_TRUE(Becomes([&] { return SegmentMappings(shard) == 0; }, absl::Seconds(15)))
          << "the shard still maps the killed trainer's segment";
    }
  }
}

}  // namespace
}  // namespace shardopt::testing
