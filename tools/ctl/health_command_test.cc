// `shardoptctl health` against real servers: exit 0 and "SERVING" for a
// live server; exit 1 naming the server for one that is gone (refused at
// once) or frozen (its deadline, not a hang); exit 2 without --servers.
#include <signal.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/support/process.h"

namespace shardopt::testing {
namespace {

std::pair<int, std::string> RunHealth(const std::string& args) {
  return RunShell(absl::StrCat(Runfile("tools/ctl/shardoptctl"), " health ", args));
}

TEST(HealthCommandTest, ServingServersPassAndOthersFailNamingTheServer) {
  auto servers = StartCluster(2);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::string live = (*servers)[0]->address();
  const std::string doomed = (*servers)[1]->address();

  auto [rc, out] = RunHealth(absl::StrCat("--servers=", live, ",", doomed));
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(absl::StrContains(out, live + " SERVING")) << out;
  EXPECT_TRUE(absl::StrContains(out, doomed + " SERVING")) << out;

  // Frozen: the connection is accepted by the kernel but nothing answers.
  (*servers)[1]->process().Signal(SIGSTOP);
  const absl::Time start = absl::Now();
  std::tie(rc, out) = RunHealth(absl::StrCat("--timeout_s=1 --servers=", live, ",", doomed));
  EXPECT_LT(absl::Now() - start, absl::Seconds(4)) << "the check outlived its 1 s deadline";
  EXPECT_EQ(rc, 1) << out;
  EXPECT_TRUE(absl::StrContains(out, live + " SERVING")) << out;
  EXPECT_TRUE(absl::StrContains(out, doomed + " health check failed")) << out;

  // Gone: nothing listens on its port any more.
  (*servers)[1]->process().Signal(SIGKILL);
  ASSERT_TRUE((*servers)[1]->process().Wait(absl::Seconds(10)).has_value());
  std::tie(rc, out) = RunHealth("--servers=" + doomed);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_TRUE(absl::StrContains(out, doomed + " health check failed: 14")) << out;  // UNAVAILABLE

  std::tie(rc, out) = RunHealth("");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_TRUE(absl::StrContains(out, "--servers is required")) << out;
}

}  // namespace
}  // namespace shardopt::testing
