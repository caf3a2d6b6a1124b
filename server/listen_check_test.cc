// CheckListenAddressFree finds a port a listening socket holds (and lets
// ports 0, free ports and Unix sockets by, but no address without a port); OnlyThisMachineReaches
// tells loopback and Unix addresses from the others.
#include "server/listen_check.h"

#include <optional>
#include <string>

#include "common/loopback_listener_testing.h"
#include "gtest/gtest.h"

namespace shardopt {
namespace {

TEST(ListenCheckTest, APortAListeningSocketHoldsIsInUse) {
  std::optional<LoopbackListener> held;
  held.emplace();
  const std::string port = std::to_string(held->port());
  const absl::Status in_use = CheckListenAddressFree("127.0.0.1:" + port);
  EXPECT_EQ(in_use.code(), absl::StatusCode::kUnavailable) << in_use;
  EXPECT_NE(in_use.message().find("port " + port + " is in use"), std::string::npos) << in_use;
  // The wildcard address covers the held one.
  EXPECT_FALSE(CheckListenAddressFree("0.0.0.0:" + port).ok());
  held.reset();
  EXPECT_TRUE(CheckListenAddressFree("127.0.0.1:" + port).ok());
  EXPECT_TRUE(CheckListenAddressFree("127.0.0.1:0").ok());
  EXPECT_TRUE(CheckListenAddressFree("unix:/tmp/no-such-dir/socket").ok());
  // An address of no interface here (TEST-NET-1), a host that does not
  // resolve: gRPC could not listen there either.
  EXPECT_FALSE(CheckListenAddressFree("192.0.2.1:" + port).ok());
  EXPECT_FALSE(CheckListenAddressFree("no-such-host.invalid:" + port).ok());
}

// Without a numeric port gRPC would pick a default one or a service's, and
// fail, if at all, only after the restore: refused here.
TEST(ListenCheckTest, AnAddressWithoutANumericPortIsRefused) {
  for (const char* bad :
       {"localhost", "[::1]", "127.0.0.1:https", "127.0.0.1:", "127.0.0.1:-1", "127.0.0.1:65536"}) {
    const absl::Status refused = CheckListenAddressFree(bad);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << bad << ": " << refused;
    EXPECT_NE(refused.message().find("give HOST:PORT"), std::string::npos) << refused;
  }
  EXPECT_TRUE(CheckListenAddressFree("[::1]:0").ok());
  EXPECT_TRUE(CheckListenAddressFree(":0").ok());
}

TEST(ListenCheckTest, OnlyLoopbackAndUnixAddressesStayOnThisMachine) {
  for (const char* local : {"127.0.0.1:50051", "127.1.2.3:1", "[::1]:50051", "localhost:50051",
                            "unix:/run/shardopt.sock", "unix-abstract:shardopt"}) {
    EXPECT_TRUE(OnlyThisMachineReaches(local)) << local;
  }
  for (const char* open : {"0.0.0.0:50051", "[::]:50051", "10.0.0.2:50051", "shard-0:50051",
                           ":50051"}) {
    EXPECT_FALSE(OnlyThisMachineReaches(open)) << open;
  }
}

}  // namespace
}  // namespace shardopt
