// Network partitions, not crashes: each shard server runs on a host of its
// own (a network namespace joined to the test's by a veth pair), and the test
// cuts one shard off the network while two trainer processes train, the way a
// failed switch would: packets vanish, nothing is refused, every process keeps
// running. A short cut only stalls the open connections (TCP retransmits
// after the heal); a long one outlasts the trainers' call deadlines, so the
// calls in flight to the shard fail and are retried, some before the heal.
// Either way every step must be applied exactly once on every shard: the
// final parameters are bit-identical to the single-process reference.
//
// Needs root and the `ip` and `nft` tools (tools/setup.sh installs them);
// elsewhere the test skips, saying why.
#include <grpcpp/grpcpp.h>

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
#include "tests/support/synthetic.h"

namespace shardopt::testing {
namespace {

constexpr int kSteps = 400;
constexpr uint64_t kSeed = 7;
constexpr uint32_t kShards = 2;
constexpr uint32_t kTrainers = 2;
const char kModel[] = "adamw";

// The model's version on the shard at `address`, or nullopt when the call
// fails (within a short deadline).
std::optional<int64_t> VersionOf(const std::string& address) {
  auto stub = NewStub(address);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::InspectRequest request;
  request.set_model_id(kModel);
  v1::InspectResponse info;
  if (!stub->Inspect(&context, request, &info).ok()) return std::nullopt;
  return info.version();
}

// Polls until shard `address` reaches `version` (bounded); its version then.
int64_t AwaitVersion(const std::string& address, int64_t version) {
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  int64_t seen = -1;
  while (absl::Now() < give_up) {
    if (std::optional<int64_t> v = VersionOf(address); v.has_value()) {
      seen = *v;
      if (seen >= version) return seen;
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  return seen;
}

struct Cut {
  const char* what;
  absl::Duration length;
};

TEST(PartitionTest, ShardCutOffMidTrainingRejoinsAndEveryStepIsAppliedOnce) {
  if (std::optional<std::string> why = IsolatedHost::Unsupported(); why.has_value()) {
    GTEST_SKIP() << "no network namespaces here: " << *why;
  }
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
  const std::string out_root = MakeTempDir("partition");
  std::vector<std::unique_ptr<ChildProcess>> trainers;
  for (uint32_t r = 0; r < kTrainers; ++r) {
    const std::string out_dir = absl::StrCat(out_root, "/rank", r);
    ASSERT_EQ(system(absl::StrCat("mkdir -p ", out_dir).c_str()), 0);
    // Attempts time out after 2 s (the long cut is longer) and are retried
    // for up to a minute.
    absl::StatusOr<std::unique_ptr<ChildProcess>> proc = ChildProcess::Start(
        Runfile("tests/test_trainer"),
        {"--servers=" + absl::StrJoin(Addresses(servers), ","), absl::StrCat("--rank=", r),
         absl::StrCat("--num_trainers=", kTrainers), absl::StrCat("--models=", kModel),
         absl::StrCat("--steps=", kSteps), absl::StrCat("--seed=", kSeed), "--chunk_bytes=4096",
         "--rpc_timeout=2s", "--retry_budget=60s", "--out_dir=" + out_dir});
    ASSERT_TRUE(proc.ok()) << proc.status();
    trainers.push_back(std::move(*proc));
  }

  // Shard 1 is cut off twice; shard 0 stays reachable, so the test watches
  // the job through it.
  const std::string& watch = servers[0]->address();
  IsolatedHost& victim = *hosts[1];
  int64_t next_cut_at = 10;
  for (const Cut& cut : {Cut{"short", absl::Milliseconds(1500)}, Cut{"long", absl::Seconds(6)}}) {
    const int64_t before = AwaitVersion(watch, next_cut_at);
    ASSERT_GE(before, next_cut_at) << cut.what << " cut: the job did not get going";
    ASSERT_LT(before, kSteps - 50) << cut.what << " cut: the job ran too fast to be cut mid-way";
    ASSERT_TRUE(victim.Partition().ok());
    // Steps already past shard 1 finish; then synchronous training cannot
    // get past the step shard 1 misses, so shard 0 holds still.
    absl::SleepFor(absl::Milliseconds(500));
    const std::optional<int64_t> held = VersionOf(watch);
    absl::SleepFor(cut.length - absl::Milliseconds(500));
    const std::optional<int64_t> during = VersionOf(watch);
    ASSERT_TRUE(victim.Heal().ok());
    ASSERT_TRUE(held.has_value() && during.has_value());
    EXPECT_EQ(*during, *held) << cut.what << " cut: the job went on without shard 1";
    EXPECT_LT(*during, kSteps) << cut.what << " cut: the job ended before the cut";
    fprintf(stderr, "[test] %s cut of shard 1 near version %lld: shard 0 held at %lld for %s\n",
            cut.what, static_cast<long long>(before), static_cast<long long>(*during),
            absl::FormatDuration(cut.length).c_str());
    next_cut_at = *during + 20;
  }

  for (auto& proc : trainers) {
    std::optional<int> rc = proc->Wait(absl::Seconds(180));
    ASSERT_TRUE(rc.has_value()) << "trainer did not finish";
    ASSERT_EQ(*rc, 0) << "trainer failed";
  }

  // The long cut outlasted the calls' deadlines: some attempts failed and
  // were retried (else the test would not have exercised the abandoned calls).
  float failed_attempts = 0;
  for (uint32_t r = 0; r < kTrainers; ++r) {
    absl::StatusOr<std::vector<float>> failed =
        ReadFloats(absl::StrCat(out_root, "/rank", r, "/", kModel, ".failed_attempts"));
    ASSERT_TRUE(failed.ok()) << failed.status();
    failed_attempts += failed->at(0);
  }
  EXPECT_GT(failed_attempts, 0) << "no call to the cut-off shard timed out";

  // Each shard applied every step once.
  for (const auto& server : servers) {
    auto stub = NewStub(server->address());
    grpc::ClientContext context;
    v1::InspectRequest request;
    request.set_model_id(kModel);
    v1::InspectResponse info;
    ASSERT_TRUE(stub->Inspect(&context, request, &info).ok());
    EXPECT_EQ(info.version(), kSteps) << server->address();
    EXPECT_EQ(info.optimizer_steps(), kSteps) << server->address();
  }
  const ModelSpec spec = SyntheticModelSpec(kModel, OptimizerByName(kModel).value(), kTrainers);
  const ModelLayout layout = ModelLayout::Create(spec.tensors, spec.alignment, kShards).value();
  const std::vector<float> expected = ReferenceRun(spec, layout, kSteps, kSeed);
  for (uint32_t r = 0; r < kTrainers; ++r) {
    for (const char* suffix : {".bin", ".master.bin"}) {
      absl::StatusOr<std::vector<float>> got =
          ReadFloats(absl::StrCat(out_root, "/rank", r, "/", kModel, suffix));
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(got->size(), expected.size());
      EXPECT_EQ(std::memcmp(got->data(), expected.data(), expected.size() * sizeof(float)), 0)
          << "rank " << r << " " << suffix << " differs from the reference";
    }
  }
}

}  // namespace
}  // namespace shardopt::testing
