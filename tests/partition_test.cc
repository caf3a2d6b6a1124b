// Network partitions, not crashes: shard servers (or trainers) run on hosts of
// their own (network namespaces joined to the test's by veth pairs), and the
// test cuts one shard (or one trainer) off the network while two trainer
// processes train, the way a failed switch would: packets vanish, nothing is
// refused, every process keeps running. A short cut (300 ms) only stalls the open connections,
// which TCP retransmits after the heal; a long one (6 s) outlasts the trainers' 2 s call deadlines,
// so the calls in flight to the shard fail and are retried. Either way every step must be applied
// exactly once on every shard: the final parameters are bit-identical to the single-process
// reference. A last case cuts a trainer's host off for good: the shard must
// close that trainer's payload socket links by itself.
//
// Needs root and the `ip` and `nft` tools (tools/setup.sh installs them);
// elsewhere the test skips, saying why.
#include <grpcpp/grpcpp.h>

#include <csignal>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "tests/support/netns.h"
#include "tests/support/process.h"
#include "tests/support/raw_calls.h"
#include "tests/support/shard_queries.h"
#include "tests/support/synthetic.h"

namespace shardopt::testing {
namespace {

constexpr int kSteps = 400;
constexpr uint64_t kSeed = 7;
constexpr uint32_t kShards = 2;
constexpr uint32_t kTrainers = 2;
const char kModel[] = "adamw";

// The model's version on the shard `stub` talks to, or nullopt when the call
// fails (within a short deadline).
std::optional<int64_t> VersionOf(v1::ShardService::Stub& stub) {
  v1::InspectResponse info;
  if (!RawInspect(stub, kModel, &info, /*deadline_seconds=*/2).ok()) return std::nullopt;
  return info.version();
}

// Polls until the shard reaches `version` (bounded); its version then.
int64_t AwaitVersion(v1::ShardService::Stub& stub, int64_t version) {
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  int64_t seen = -1;
  while (absl::Now() < give_up) {
    if (std::optional<int64_t> v = VersionOf(stub); v.has_value()) {
      seen = *v;
      if (seen >= version) return seen;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return seen;
}

struct Cut {
  const char* what;
  absl::Duration length;
  bool check_held;  // Long enough to see the job held still.
};

// Starts the trainers: rank r through launchers[r] (empty: in the test's own
// namespace). Attempts time out after 2 s (the long cut is longer) and are
// retried for up to a minute; 10 ms steps keep the job going through both
// cuts.
void StartTrainers(const std::vector<std::string>& addresses,
                   const std::vector<std::vector<std::string>>& launchers,
                   std::vector<std::string>* out_dirs,
                   std::vector<std::unique_ptr<ChildProcess>>* trainers) {
  for (uint32_t r = 0; r < kTrainers; ++r) {
    out_dirs->push_back(MakeTempDir(absl::StrCat("partition_rank", r)));
    std::vector<std::string> argv = {Runfile("tests/test_trainer"),
                                     "--servers=" + absl::StrJoin(addresses, ","),
                                     absl::StrCat("--rank=", r),
                                     absl::StrCat("--num_trainers=", kTrainers),
                                     absl::StrCat("--models=", kModel),
                                     absl::StrCat("--steps=", kSteps),
                                     absl::StrCat("--seed=", kSeed),
                                     "--chunk_bytes=4096",
                                     "--rpc_timeout=2s",
                                     "--retry_budget=60s",
                                     "--min_step_time=10ms",
                                     "--out_dir=" + out_dirs->back()};
    argv.insert(argv.begin(), launchers[r].begin(), launchers[r].end());
    absl::StatusOr<std::unique_ptr<ChildProcess>> proc =
        ChildProcess::Start(argv[0], std::vector<std::string>(argv.begin() + 1, argv.end()));
    ASSERT_TRUE(proc.ok()) << proc.status();
    trainers->push_back(std::move(*proc));
  }
}

// Cuts `victim` off twice, a short and a long time, watching the job through
// the shard `watch` talks to (which the cuts leave reachable).
void CutTwice(v1::ShardService::Stub& watch, IsolatedHost& victim, const std::string& who) {
  int64_t next_cut_at = 10;
  for (const Cut& cut :
       {Cut{"short", absl::Milliseconds(300), false}, Cut{"long", absl::Seconds(6), true}}) {
    const int64_t before = AwaitVersion(watch, next_cut_at);
    ASSERT_GE(before, next_cut_at) << cut.what << " cut: the job did not get going";
    ASSERT_LT(before, kSteps - 50) << cut.what << " cut: the job ran too fast to be cut mid-way";
    ASSERT_TRUE(victim.Partition().ok());
    std::optional<int64_t> held;
    if (cut.check_held) {
      // Steps already past the victim finish; then synchronous training
      // cannot get past the step the victim misses.
      absl::SleepFor(absl::Milliseconds(500));
      held = VersionOf(watch);
      absl::SleepFor(cut.length - absl::Milliseconds(500));
    } else {
      absl::SleepFor(cut.length);
    }
    const std::optional<int64_t> during = VersionOf(watch);
    ASSERT_TRUE(victim.Heal().ok());
    ASSERT_TRUE(during.has_value());
    EXPECT_LT(*during, kSteps) << cut.what << " cut: the job ended before the cut";
    if (cut.check_held) {
      ASSERT_TRUE(held.has_value());
      // (One more step may end on a machine slow enough that a trainer's
      // push of the step in flight came after the first look.)
      EXPECT_LE(*during, *held + 1) << cut.what << " cut: the job went on without " << who;
    }
    fprintf(stderr, "[test] %s cut of %s at version %lld: the job at %lld after %s\n", cut.what,
            who.c_str(), static_cast<long long>(before), static_cast<long long>(*during),
            absl::FormatDuration(cut.length).c_str());
    next_cut_at = *during + 20;
  }
}

// Each trainer's attempts that failed unreachable or late, per shard.
std::vector<std::vector<float>> FailedAttempts(const std::vector<std::string>& out_dirs) {
  std::vector<std::vector<float>> out;
  for (uint32_t r = 0; r < kTrainers; ++r) {
    absl::StatusOr<std::vector<float>> failed =
        ReadFloats(absl::StrCat(out_dirs[r], "/", kModel, ".failed_attempts"));
    EXPECT_TRUE(failed.ok()) << failed.status();
    out.push_back(failed.ok() ? *failed : std::vector<float>(kShards, 0.0f));
    EXPECT_EQ(out.back().size(), kShards);
    out.back().resize(kShards);
    fprintf(stderr, "[test] rank %u: attempts failed unreachable/late: shard 0 %g, shard 1 %g\n", r,
            out.back()[0], out.back()[1]);
  }
  return out;
}

// The trainers ended well, every shard applied each step once, and what they
// hold is the reference run's result, bit for bit.
void CheckExactlyOnce(std::vector<std::unique_ptr<ChildProcess>>& trainers,
                      const std::vector<std::unique_ptr<ServerProcess>>& servers,
                      const std::vector<std::string>& out_dirs) {
  for (auto& proc : trainers) {
    std::optional<int> rc = proc->Wait(absl::Seconds(180));
    ASSERT_TRUE(rc.has_value()) << "trainer did not finish";
    ASSERT_EQ(*rc, 0) << "trainer failed";
  }
  for (const auto& server : servers) {
    v1::InspectResponse info;
    ASSERT_TRUE(RawInspect(*NewStub(server->address()), kModel, &info).ok());
    EXPECT_EQ(info.version(), kSteps) << server->address();
    EXPECT_EQ(info.optimizer_steps(), kSteps) << server->address();
  }
  const ModelSpec spec = SyntheticModelSpec(kModel, OptimizerByName(kModel).value(), kTrainers);
  const ModelLayout layout = ModelLayout::Create(spec.tensors, spec.alignment, kShards).value();
  const std::vector<float> expected = ReferenceRun(spec, layout, kSteps, kSeed);
  for (uint32_t r = 0; r < kTrainers; ++r) {
    for (const char* suffix : {".bin", ".master.bin"}) {
      absl::StatusOr<std::vector<float>> got =
          ReadFloats(absl::StrCat(out_dirs[r], "/", kModel, suffix));
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(got->size(), expected.size());
      EXPECT_EQ(std::memcmp(got->data(), expected.data(), expected.size() * sizeof(float)), 0)
          << "rank " << r << " " << suffix << " differs from the reference";
    }
  }
}

class PartitionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    IsolatedHost::RemoveStaleHosts();
    if (std::optional<std::string> why = IsolatedHost::Unsupported(); why.has_value()) {
      GTEST_SKIP() << "no network namespaces here: " << *why;
    }
  }
};

// Each shard on a host of its own; shard 1 is cut off.
TEST_F(PartitionTest, ShardCutOffMidTrainingRejoinsAndEveryStepIsAppliedOnce) {
  std::vector<std::unique_ptr<IsolatedHost>> hosts;
  std::vector<std::unique_ptr<ServerProcess>> servers;
  for (uint32_t i = 0; i < kShards; ++i) {
    absl::StatusOr<std::unique_ptr<IsolatedHost>> host = IsolatedHost::Create(static_cast<int>(i));
    ASSERT_TRUE(host.ok()) << host.status();
    ServerPlacement placement;
    placement.host = (*host)->address();
    placement.launcher = (*host)->Wrap({});
    // A push stream silent for 2 s is dropped (the long cut outlasts it).
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::Start(i, kShards, {"--stream_idle_timeout_s=2"}, placement);
    ASSERT_TRUE(server.ok()) << server.status();
    hosts.push_back(std::move(*host));
    servers.push_back(std::move(*server));
  }
  std::vector<std::string> out_dirs;
  std::vector<std::unique_ptr<ChildProcess>> trainers;
  StartTrainers(Addresses(servers), {{}, {}}, &out_dirs, &trainers);
  auto watch = NewStub(servers[0]->address());
  CutTwice(*watch, *hosts[1], "shard 1");
  CheckExactlyOnce(trainers, servers, out_dirs);
  // The long cut outlasted the calls' deadlines: attempts to shard 1 timed
  // out and were retried (else the test did not exercise abandoned calls).
  const std::vector<std::vector<float>> failed = FailedAttempts(out_dirs);
  EXPECT_GT(failed[0][1] + failed[1][1], 0) << "no call to the cut-off shard timed out";
}

// Each trainer on a host of its own (the shards in the test's namespace, on
// trainer 0's gateway address); trainer 1 is cut off. While it is away the
// other trainer waits (the shards report, every second, that they wait for
// trainer 1); a push of
// trainer 1 caught half-sent would be dropped by the shards after 2 s of
// silence.
TEST_F(PartitionTest, TrainerCutOffMidTrainingRejoinsAndEveryStepIsAppliedOnce) {
  std::vector<std::unique_ptr<IsolatedHost>> hosts;
  for (uint32_t r = 0; r < kTrainers; ++r) {
    absl::StatusOr<std::unique_ptr<IsolatedHost>> host = IsolatedHost::Create(static_cast<int>(r));
    ASSERT_TRUE(host.ok()) << host.status();
    hosts.push_back(std::move(*host));
  }
  ServerPlacement placement;
  placement.host = hosts[0]->gateway();  // Reached by both hosts through their gateways.
  std::vector<std::unique_ptr<ServerProcess>> servers;
  for (uint32_t i = 0; i < kShards; ++i) {
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::Start(i, kShards, {"--stream_idle_timeout_s=2"}, placement);
    ASSERT_TRUE(server.ok()) << server.status();
    servers.push_back(std::move(*server));
  }
  std::vector<std::string> out_dirs;
  std::vector<std::unique_ptr<ChildProcess>> trainers;
  StartTrainers(Addresses(servers), {hosts[0]->Wrap({}), hosts[1]->Wrap({})}, &out_dirs, &trainers);
  auto watch = NewStub(servers[0]->address());
  CutTwice(*watch, *hosts[1], "trainer 1");
  CheckExactlyOnce(trainers, servers, out_dirs);
  const std::vector<std::vector<float>> failed = FailedAttempts(out_dirs);
  EXPECT_GT(failed[1][0] + failed[1][1], 0) << "no call of the cut-off trainer timed out";
  // (The other trainer's pulls do not time out: the shards report what they
  // wait for within half its 2 s deadline, and it waits on. CutTwice checks
  // that the job did not go on without trainer 1.)
}

// A trainer's host that vanishes without a word (cut off the network, and
// the trainer killed there, so that not even its FIN arrives) must not leave
// its idle payload socket links open on the shard for good, each holding a
// descriptor and a place under the shard's cap of links: TCP keepalive and
// the user timeout (common/payload_socket.h) find them dead after about 30 s
// without an acknowledgement (a link whose last end frame the cut swallowed
// included).
TEST_F(PartitionTest, ShardClosesThePayloadLinksOfATrainerHostThatVanished) {
  absl::StatusOr<std::unique_ptr<IsolatedHost>> host = IsolatedHost::Create(0);
  ASSERT_TRUE(host.ok()) << host.status();
  ServerPlacement placement;
  placement.host = (*host)->gateway();
  // Calls in flight when the trainer vanishes end within 2 s (their
  // deadlines, the shard's idle bound), closing their links: what is left is
  // the trainer's idle links, which only the keepalive finds dead.
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(0, 1, {"--stream_idle_timeout_s=2"}, placement);
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<std::string> argv =
      (*host)->Wrap({Runfile("tests/test_trainer"), "--servers=" + (*server)->address(), "--rank=0",
                     "--num_trainers=1", absl::StrCat("--models=", kModel), "--steps=1000000",
                     "--min_step_time=10ms", "--rpc_timeout=2s", "--shared_memory=false",
                     "--out_dir=" + MakeTempDir("vanished")});
  absl::StatusOr<std::unique_ptr<ChildProcess>> trainer =
      ChildProcess::Start(argv[0], std::vector<std::string>(argv.begin() + 1, argv.end()));
  ASSERT_TRUE(trainer.ok()) << trainer.status();

  auto watch = NewStub((*server)->address());
  ASSERT_GE(AwaitVersion(*watch, 20), 20) << "the trainer did not get going";
  const uint32_t links = ServerInfoOf((*server)->address()).payload_socket_links();
  ASSERT_GT(links, 0u) << "the trainer opened no payload socket link: nothing to test";

  ASSERT_TRUE((*host)->Partition().ok());
  (*trainer)->Signal(SIGKILL);
  ASSERT_TRUE((*trainer)->Wait(absl::Seconds(10)).has_value()) << "the trainer outlived SIGKILL";
  const absl::Time cut = absl::Now();
  uint32_t left = links;
  while (absl::Now() - cut < absl::Seconds(60)) {
    left = ServerInfoOf((*server)->address()).payload_socket_links();
    if (left == 0) break;
    absl::SleepFor(absl::Milliseconds(250));
  }
  EXPECT_EQ(left, 0u) << "the shard still holds " << left << " of the vanished trainer's " << links
                      << " payload links 60 s after it vanished";
  fprintf(stderr, "[test] %u payload links of the vanished trainer closed after %s\n", links,
          absl::FormatDuration(absl::Now() - cut).c_str());
}

}  // namespace
}  // namespace shardopt::testing
