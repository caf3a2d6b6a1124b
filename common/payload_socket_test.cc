#include "common/payload_socket.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace shardopt {
namespace {

TEST(PayloadSocketTest, FrameHeadersRoundTripInLittleEndian) {
  char head[kFrameHeaderBytes];
  EncodeFrameHeader(PayloadFrame{PayloadFrame::kData, 0x0102030405060708, 9, 1ull << 40}, head);
  EXPECT_EQ(std::string(head, 4), "SOFR");
  EXPECT_EQ(head[8], 0x08);
  absl::StatusOr<PayloadFrame> frame = DecodeFrameHeader(head);
  ASSERT_TRUE(frame.ok()) << frame.status();
  EXPECT_EQ(frame->flags, PayloadFrame::kData);
  EXPECT_EQ(frame->transfer, 0x0102030405060708u);
  EXPECT_EQ(frame->offset, 9u);
  EXPECT_EQ(frame->bytes, 1ull << 40);

  // An end frame carries no bytes (they would stay on a reused link).
  EncodeFrameHeader(PayloadFrame{PayloadFrame::kEnded, 3, 4096, 0}, head);
  frame = DecodeFrameHeader(head);
  ASSERT_TRUE(frame.ok()) << frame.status();
  EXPECT_EQ(frame->flags, PayloadFrame::kEnded);
  EXPECT_EQ(frame->offset, 4096u);
  EncodeFrameHeader(PayloadFrame{PayloadFrame::kEnded, 3, 4096, 8}, head);
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeFrameHeader(head).status()));
  EncodeFrameHeader(PayloadFrame{PayloadFrame::kData, 3, 4096, 8}, head);

  head[4] = 7;  // Unknown flags.
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeFrameHeader(head).status()));
  head[0] = 'X';
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeFrameHeader(head).status()));
}

TEST(PayloadSocketTest, HellosCarryAHexToken) {
  const std::string token(kLinkTokenChars, 'a');
  absl::StatusOr<std::string> decoded = DecodeHello(EncodeHello(token));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, token);
  EXPECT_FALSE(DecodeHello(EncodeHello(std::string(kLinkTokenChars, 'z'))).ok());
  EXPECT_FALSE(DecodeHello(EncodeHello("abc")).ok());
  EXPECT_FALSE(DecodeHello(std::string(kHelloBytes, 'S')).ok());
}

TEST(PayloadSocketTest, HostOfTarget) {
  EXPECT_EQ(HostOfTarget("127.0.0.1:5000"), "127.0.0.1");
  EXPECT_EQ(HostOfTarget("ipv4:10.0.0.2:80"), "10.0.0.2");
  EXPECT_EQ(HostOfTarget("[::1]:5000"), "::1");
  EXPECT_EQ(HostOfTarget("dns:///shard-1:7000"), "shard-1");
  EXPECT_EQ(HostOfTarget("unix:/tmp/socket"), "");
}

TEST(PayloadSocketTest, BytesCrossALoopbackConnectionWhole) {
  absl::StatusOr<TcpListener> listener = ListenTcp("127.0.0.1");
  ASSERT_TRUE(listener.ok()) << listener.status();
  ASSERT_GT(listener->port, 0);
  std::vector<char> sent(8 << 20);
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<char>(i * 31);
  std::vector<char> received(sent.size());
  std::thread reader([&] {
    int connection = -1;
    for (int i = 0; i < 1000 && connection < 0; ++i) {
      connection = accept(listener->fd, nullptr, nullptr);
      if (connection < 0) absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_GE(connection, 0);
    SocketWait wait;
    wait.deadline = absl::Now() + absl::Seconds(30);
    EXPECT_TRUE(ReceiveAll(connection, received.data(), received.size(), wait).ok());
    close(connection);
  });
  absl::StatusOr<int> socket = ConnectTcp("127.0.0.1", listener->port, absl::Seconds(5));
  ASSERT_TRUE(socket.ok()) << socket.status();
  SocketWait wait;
  wait.deadline = absl::Now() + absl::Seconds(30);
  EXPECT_TRUE(SendAll(*socket, sent.data(), sent.size(), wait).ok());
  reader.join();
  EXPECT_EQ(sent, received);
  close(*socket);
  close(listener->fd);
}

int IntOption(int socket, int level, int name) {
  int value = -1;
  socklen_t length = sizeof(value);
  EXPECT_EQ(getsockopt(socket, level, name, &value, &length), 0) << strerror(errno);
  return value;
}

// Both ends of a link probe an idle peer: one whose host vanished without a
// FIN must not hold a link forever (tests/partition_test.cc has the shard's
// side of it through a real cut).
TEST(PayloadSocketTest, LinksAreKeptAliveWithoutDelay) {
  absl::StatusOr<TcpListener> listener = ListenTcp("127.0.0.1");
  ASSERT_TRUE(listener.ok()) << listener.status();
  absl::StatusOr<int> socket = ConnectTcp("127.0.0.1", listener->port, absl::Seconds(5));
  ASSERT_TRUE(socket.ok()) << socket.status();
  EXPECT_EQ(IntOption(*socket, IPPROTO_TCP, TCP_NODELAY), 1);
  EXPECT_EQ(IntOption(*socket, SOL_SOCKET, SO_KEEPALIVE), 1);
  EXPECT_EQ(IntOption(*socket, IPPROTO_TCP, TCP_KEEPIDLE), kLinkKeepaliveIdleSeconds);
  EXPECT_EQ(IntOption(*socket, IPPROTO_TCP, TCP_KEEPINTVL), kLinkKeepaliveIntervalSeconds);
  EXPECT_EQ(IntOption(*socket, IPPROTO_TCP, TCP_USER_TIMEOUT),
            absl::ToInt64Milliseconds(kLinkUnansweredTimeout));
  close(*socket);
  close(listener->fd);
}

TEST(PayloadSocketTest, WaitsEndSayingWhy) {
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  char byte = 1;
  ASSERT_EQ(write(pair[1], &byte, 1), 1);
  char buffer[16];
  SocketWait stall;
  stall.stall = absl::Milliseconds(100);
  absl::Status s = ReceiveAll(pair[0], buffer, sizeof(buffer), stall);
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "1 of 16 bytes moved")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "the peer froze")) << s;

  SocketWait deadline;
  deadline.deadline = absl::Now() + absl::Milliseconds(100);
  s = ReceiveAll(pair[0], buffer, sizeof(buffer), deadline);
  EXPECT_TRUE(absl::StrContains(s.message(), "the call's deadline passed")) << s;

  ASSERT_EQ(write(pair[1], &byte, 1), 1);
  close(pair[1]);
  s = ReceiveAll(pair[0], buffer, sizeof(buffer), deadline);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "closed it after 1 of 16 bytes")) << s;
  // Sending to a closed peer fails instead of raising SIGPIPE.
  s = SendAll(pair[0], buffer, sizeof(buffer), deadline);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  close(pair[0]);
}

TEST(PayloadSocketTest, ConnectingWhereNothingListensIsUnavailable) {
  absl::StatusOr<TcpListener> listener = ListenTcp("127.0.0.1");
  ASSERT_TRUE(listener.ok());
  const uint16_t port = listener->port;
  close(listener->fd);
  absl::StatusOr<int> socket = ConnectTcp("127.0.0.1", port, absl::Seconds(2));
  EXPECT_TRUE(absl::IsUnavailable(socket.status())) << socket.status();
}

}  // namespace
}  // namespace shardopt
