// CheckListenAddressFree finds a port a listening socket holds (and lets
// ports 0, free ports and Unix sockets by); OnlyThisMachineReaches tells
// loopback and Unix addresses from the others.
#include "server/listen_check.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"

namespace shardopt {
namespace {

TEST(ListenCheckTest, APortAListeningSocketHoldsIsInUse) {
  const int held = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(held, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(bind(held, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(held, 4), 0);
  ASSERT_EQ(getsockname(held, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const std::string port = std::to_string(ntohs(address.sin_port));
  const absl::Status in_use = CheckListenAddressFree("127.0.0.1:" + port);
  EXPECT_EQ(in_use.code(), absl::StatusCode::kUnavailable) << in_use;
  EXPECT_NE(in_use.message().find("port " + port + " is in use"), std::string::npos) << in_use;
  // The wildcard address covers the held one.
  EXPECT_FALSE(CheckListenAddressFree("0.0.0.0:" + port).ok());
  close(held);
  EXPECT_TRUE(CheckListenAddressFree("127.0.0.1:" + port).ok());
  EXPECT_TRUE(CheckListenAddressFree("127.0.0.1:0").ok());
  EXPECT_TRUE(CheckListenAddressFree("unix:/tmp/no-such-dir/socket").ok());
  // An address of no interface here (TEST-NET-1), a host that does not
  // resolve: gRPC could not listen there either.
  EXPECT_FALSE(CheckListenAddressFree("192.0.2.1:" + port).ok());
  EXPECT_FALSE(CheckListenAddressFree("no-such-host.invalid:" + port).ok());
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
