// shardoptctl against a real 2-shard cluster: the status table shows both
// shards and the model's version and ranks, inspect shows tensor statistics
// and JSON, and an unreachable server makes status exit 1.
#include <fstream>
#include <regex>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/trainer_client.h"
#include "gtest/gtest.h"
#include "tests/support/process.h"
#include "tests/support/synthetic.h"

namespace shardopt::testing {
namespace {

// Runs shardoptctl with `args`; returns (exit code, stdout).
std::pair<int, std::string> RunCtl(const std::string& args) {
  return RunShell(absl::StrCat(Runfile("tools/ctl/shardoptctl"), " ", args));
}

TEST(ShardoptctlTest, StatusAndInspectOfALiveCluster) {
  auto servers = StartCluster(2);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::string addresses = absl::StrJoin(Addresses(*servers), ",");
  auto client = TrainerClient::Connect(Addresses(*servers), TrainerClientOptions());
  ASSERT_TRUE(client.ok());
  const ModelSpec spec = SyntheticModelSpec("ctl_model", OptimizerConfig::Adam(), 2);
  const ModelLayout layout = ModelLayout::Create(spec.tensors, spec.alignment, 2).value();
  std::vector<float> params = SyntheticInitialParams(layout, 3);
  ASSERT_TRUE((*client)->Register(spec, params).ok());
  std::vector<float> grad = ConstantGradient(layout, 0.5f);
  ASSERT_TRUE((*client)->Push(1, grad).ok());  // Rank 0 of 2: step 1 stays pending.

  auto [rc, out] = RunCtl("status --servers=" + addresses);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("SERVING"), std::string::npos) << out;
  EXPECT_NE(out.find("0/2"), std::string::npos) << out;
  // The client on this host attached its segment to both shards.
  EXPECT_TRUE(std::regex_search(out, std::regex("\\n0/2 .* 1\\n"))) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("\\n1/2 .* 1\\n"))) << out;
  EXPECT_NE(out.find("SHM_ATTACHED"), std::string::npos) << out;
  EXPECT_NE(out.find("1/2"), std::string::npos) << out;
  EXPECT_NE(out.find("ctl_model"), std::string::npos) << out;
  EXPECT_NE(out.find("adam"), std::string::npos) << out;
  EXPECT_NE(out.find(absl::StrCat("[0, ", layout.ShardSize(0), ")")), std::string::npos) << out;
  // Each trainer's last push as each shard saw it: rank 0 pushed step 1 a
  // moment ago, rank 1 nothing yet.
  EXPECT_NE(out.find("LAST_PUSHED_STEP"), std::string::npos) << out;
  EXPECT_NE(out.find("CHECKPOINT"), std::string::npos) << out;
  EXPECT_TRUE(
      absl::StrContains(out, "ctl_model  0      0        1                 -             0."))
      << out;
  EXPECT_TRUE(
      absl::StrContains(out, "ctl_model  1      1        0                 -             -"))
      << out;
  EXPECT_TRUE(
      std::regex_search(out, std::regex("\nctl_model +0 +\\[0, [0-9]+\\) +sync +0 +2 +1/2 +- ")))
      << out;

  std::tie(rc, out) = RunCtl("inspect --model=ctl_model --servers=" + addresses);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("pushed [0] of 2"), std::string::npos) << out;
  EXPECT_TRUE(absl::StrContains(out, "last pushes by trainer [0: step 1 (0.")) << out;
  EXPECT_TRUE(absl::StrContains(out, "s ago), 1: step 0]  newest committed checkpoint -")) << out;
  EXPECT_NE(out.find("embed.weight"), std::string::npos) << out;
  EXPECT_NE(out.find("L2_NORM"), std::string::npos) << out;
  EXPECT_NE(out.find("optimizer adam(lr=0.001"), std::string::npos) << out;
  EXPECT_NE(out.find("lr schedule constant"), std::string::npos) << out;

  std::tie(rc, out) = RunCtl("inspect --json --model=ctl_model --tensor=layer2.bias --servers=" +
                             (*servers)[1]->address());
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("\"modelId\": \"ctl_model\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"name\": \"layer2.bias\""), std::string::npos) << out;

  std::tie(rc, out) = RunCtl("inspect --model=missing --servers=" + addresses);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("not registered"), std::string::npos) << out;

  // An asynchronous model: its mode, and each trainer's applied step.
  ModelSpec async_spec = SyntheticModelSpec("ctl_async", OptimizerConfig::Sgd(0.5), 2);
  async_spec.consistency = Consistency::kBounded;
  async_spec.staleness = 3;
  auto async_client = TrainerClient::Connect(Addresses(*servers), TrainerClientOptions());
  ASSERT_TRUE(async_client.ok());
  ASSERT_TRUE((*async_client)->Register(async_spec, params).ok());
  ASSERT_TRUE((*async_client)->Push(1, grad).ok());  // Applied alone: no wait for rank 1.
  std::tie(rc, out) = RunCtl("status --servers=" + addresses);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(std::regex_search(
      out, std::regex("\nctl_async +0 +\\[0, [0-9]+\\) +bounded\\(s=3\\) +1 +2 +- +1 ")))
      << out;
  EXPECT_TRUE(
      absl::StrContains(out, "ctl_async  0      0        1                 1             0."))
      << out;
  std::tie(rc, out) = RunCtl("inspect --model=ctl_async --servers=" + addresses);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "bounded staleness 3: applied steps by trainer [1, 0]"))
      << out;

  std::tie(rc, out) = RunCtl("status --timeout_s=1 --servers=" + addresses + ",127.0.0.1:1");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("127.0.0.1:1"), std::string::npos) << out;
}

// A server that answers health checks but refuses GetServerInfo (here: no
// token) is shown with the refusal, not only as SERVING.
TEST(ShardoptctlTest, StatusSaysWhyAServerThatIsUpDidNotAnswer) {
  const std::string dir = MakeTempDir("ctl_tokens");
  {
    std::ofstream tokens(dir + "/tokens");
    tokens << "trainer trainer-5f1c0e9a2b7d4c68\n";
  }
  auto servers = StartCluster(1, {"--auth_token_file=" + dir + "/tokens"});
  ASSERT_TRUE(servers.ok()) << servers.status();
  auto [rc, out] = RunCtl("status --servers=" + Addresses(*servers)[0]);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("GetServerInfo: error: 16 "), std::string::npos) << out;
}

}  // namespace
}  // namespace shardopt::testing
