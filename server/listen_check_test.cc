// CheckListenAddressFree finds a port a listening socket holds, and a Unix
// socket a server listens on (and lets ports 0, free ports and unused Unix
// sockets by, but no address without a port); HoldListenAddress's hold keeps
// the port from sockets asking for a free one while gRPC can listen there;
// OnlyThisMachineReaches tells loopback and Unix addresses from the others.
#include "server/listen_check.h"

#include <arpa/inet.h>
#include <errno.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <stddef.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/loopback_listener_testing.h"
#include "common/payload_socket.h"
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

// A Unix socket a server listens on is in use (gRPC would unlink its file
// and take the name); a stale file nobody listens on is not, nor a path with
// nothing there; a name too long for a socket address is refused.
TEST(ListenCheckTest, AUnixSocketALiveServerListensOnIsInUse) {
  // (Short: a socket path has room for 107 bytes, less than a test's TempDir.)
  const std::string path = "/tmp/shardopt_listen_check_" + std::to_string(getpid()) + ".sock";
  unlink(path.c_str());
  const std::string abstract_name = "shardopt-listen-check-" + std::to_string(getpid());
  for (bool abstract : {false, true}) {
    const std::string address = abstract ? "unix-abstract:" + abstract_name : "unix:" + path;
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    const std::string name = abstract ? abstract_name : path;
    memcpy(a.sun_path + (abstract ? 1 : 0), name.data(), name.size());
    const socklen_t length =
        static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + (abstract ? 1 : 0) + name.size());
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(bind(fd, reinterpret_cast<const sockaddr*>(&a), length), 0) << strerror(errno);
    ASSERT_EQ(listen(fd, 4), 0);
    const absl::Status in_use = CheckListenAddressFree(address);
    EXPECT_EQ(in_use.code(), absl::StatusCode::kUnavailable) << address << ": " << in_use;
    EXPECT_NE(in_use.message().find("a server is listening there"), std::string::npos) << in_use;
    if (!abstract) {
      EXPECT_FALSE(CheckListenAddressFree("unix://" + path).ok());
    }
    close(fd);  // A path's file stays: stale, fine to take.
    EXPECT_TRUE(CheckListenAddressFree(address).ok()) << address;
  }
  unlink(path.c_str());
  EXPECT_TRUE(CheckListenAddressFree("unix:" + path).ok());
  const absl::Status too_long = CheckListenAddressFree("unix:/" + std::string(200, 'x'));
  EXPECT_EQ(too_long.code(), absl::StatusCode::kInvalidArgument) << too_long;
  EXPECT_EQ(CheckListenAddressFree("unix:").code(), absl::StatusCode::kInvalidArgument);
  // A TCP host whose name starts with "unix" is a TCP host.
  EXPECT_FALSE(IsUnixSocketAddress("unix01.cluster:50051"));
  EXPECT_TRUE(IsUnixSocketAddress("unix-abstract:x"));
  EXPECT_EQ(CheckListenAddressFree("unix01.invalid:50051").code(), absl::StatusCode::kUnavailable);
}

// A server that stopped accepting (its backlog full) still holds its
// socket: the check says so at once instead of hanging the start.
TEST(ListenCheckTest, AUnixSocketWithAFullBacklogIsInUseAndAnsweredAtOnce) {
  const std::string name = "shardopt-listen-full-" + std::to_string(getpid());
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  memcpy(a.sun_path + 1, name.data(), name.size());
  const socklen_t length =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(bind(fd, reinterpret_cast<const sockaddr*>(&a), length), 0) << strerror(errno);
  ASSERT_EQ(listen(fd, 0), 0);
  std::vector<int> queued;  // Never accepted: they fill the backlog.
  for (int i = 0; i < 8; ++i) {
    const int c = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
    connect(c, reinterpret_cast<const sockaddr*>(&a), length);
    queued.push_back(c);
  }
  const absl::Time start = absl::Now();
  const absl::Status in_use = CheckListenAddressFree("unix-abstract:" + name);
  EXPECT_EQ(in_use.code(), absl::StatusCode::kUnavailable) << in_use;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  for (int c : queued) close(c);
  close(fd);
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

// A held port is no free port for any socket that asks for one (a payload
// socket's listener, an outgoing connection), and gRPC's listener binds it
// while it is held. In a network namespace of its own (a child process)
// whose ephemeral range is two ports, the kernel's picks are known: a
// listener's free port is the one it picks first unless that is held, and
// a connection's is the other (the kernel prefers the other parity for
// connections) unless that is held.
TEST(ListenCheckTest, AHeldPortIsNoFreePortAndGrpcListensThere) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (unshare(CLONE_NEWNET) != 0) _exit(77);
    std::ofstream("/proc/sys/net/ipv4/ip_local_port_range") << "40000 40001\n";
    std::string range;
    std::getline(std::ifstream("/proc/sys/net/ipv4/ip_local_port_range"), range);
    if (range != "40000\t40001") _exit(78);
    const int control = socket(AF_INET, SOCK_DGRAM, 0);
    ifreq lo{};
    strcpy(lo.ifr_name, "lo");
    if (ioctl(control, SIOCGIFFLAGS, &lo) != 0) _exit(79);
    lo.ifr_flags |= IFF_UP;
    if (ioctl(control, SIOCSIFFLAGS, &lo) != 0) _exit(79);
    close(control);

    absl::StatusOr<TcpListener> probe = ListenTcp("127.0.0.1", 0);
    if (!probe.ok()) _exit(2);
    const uint16_t first = probe->port;
    const uint16_t other = first == 40000 ? 40001 : 40000;
    close(probe->fd);
    {
      absl::StatusOr<ListenAddressHold> hold = HoldListenAddress(absl::StrCat("127.0.0.1:", first));
      if (!hold.ok() || hold->sockets() != 1) _exit(3);
      for (int round = 0; round < 10; ++round) {
        for (const char* host : {"127.0.0.1", ""}) {
          absl::StatusOr<TcpListener> listener = ListenTcp(host, 0);
          if (!listener.ok()) _exit(4);
          close(listener->fd);
          if (listener->port != other) _exit(5);
        }
      }
    }
    {
      absl::StatusOr<ListenAddressHold> hold = HoldListenAddress(absl::StrCat("127.0.0.1:", other));
      if (!hold.ok()) _exit(3);
      absl::StatusOr<TcpListener> target = ListenTcp("127.0.0.1", 5000);
      if (!target.ok()) _exit(6);
      sockaddr_in to{};
      to.sin_family = AF_INET;
      to.sin_port = htons(5000);
      to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      const int out = socket(AF_INET, SOCK_STREAM, 0);
      if (connect(out, reinterpret_cast<const sockaddr*>(&to), sizeof(to)) != 0) _exit(6);
      sockaddr_in local{};
      socklen_t length = sizeof(local);
      getsockname(out, reinterpret_cast<sockaddr*>(&local), &length);
      if (ntohs(local.sin_port) != first) _exit(7);
      close(out);
      close(target->fd);
    }
    {
      const std::string address = absl::StrCat("127.0.0.1:", first);
      absl::StatusOr<ListenAddressHold> hold = HoldListenAddress(address);
      if (!hold.ok()) _exit(3);
      int port = 0;
      grpc::CallbackGenericService service;  // (A server needs one.)
      grpc::ServerBuilder builder;
      builder.RegisterCallbackGenericService(&service);
      builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
      builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
      std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
      if (server == nullptr || port != first) _exit(8);
      *hold = ListenAddressHold();
      if (CheckListenAddressFree(address).code() != absl::StatusCode::kUnavailable) _exit(9);
      server->Shutdown();
    }
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) >= 77 && WEXITSTATUS(status) <= 79) {
    GTEST_SKIP() << (WEXITSTATUS(status) == 77
                         ? "no network namespace for this user (unshare needs CAP_SYS_ADMIN)"
                     : WEXITSTATUS(status) == 78
                         ? "the namespace's ip_local_port_range cannot be set"
                         : "the namespace's loopback interface cannot be brought up");
  }
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "2: no probe listener, 3: no hold, 4: no listener, 5: a listener took the held port, "
         "6: no connection, 7: a connection took the held port, 8: gRPC did not listen on the "
         "held port, 9: the port gRPC listens on was not found in use";
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
