#include "server/payload_socket_host.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "common/payload_socket.h"
#include "gtest/gtest.h"
#include "server/serve_poll_testing.h"

namespace shardopt {
namespace {

bool WaitForLinks(const PayloadSocketHost& host, size_t count) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (host.links() != count) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

SocketWait Soon() {
  SocketWait wait;
  wait.deadline = absl::Now() + absl::Seconds(10);
  return wait;
}

// Connects and sends `hello`; the socket, or -1 when the host did not accept it.
int OpenWithHello(const PayloadSocketHost& host, const std::string& hello) {
  absl::StatusOr<int> socket = ConnectTcp("127.0.0.1", host.port(), absl::Seconds(5));
  EXPECT_TRUE(socket.ok()) << socket.status();
  if (!socket.ok()) return -1;
  EXPECT_TRUE(SendAll(*socket, hello.data(), hello.size(), Soon()).ok());
  char answer[kHelloAnswerBytes];
  if (!ReceiveAll(*socket, answer, sizeof(answer), Soon()).ok() ||
      absl::string_view(answer, sizeof(answer)) != HelloAccepted()) {
    close(*socket);
    return -1;
  }
  return *socket;
}

const std::string kToken(kLinkTokenChars, 'b');

TEST(PayloadSocketHostTest, ALinkServesOneTransferAtATimeAndLastsWithItsConnection) {
  absl::StatusOr<std::unique_ptr<PayloadSocketHost>> host = PayloadSocketHost::Start("127.0.0.1");
  ASSERT_TRUE(host.ok()) << host.status();
  const int socket = OpenWithHello(**host, EncodeHello(kToken));
  ASSERT_GE(socket, 0);
  EXPECT_EQ((*host)->links(), 1u);
  {
    absl::StatusOr<PayloadSocketHost::Lease> lease = (*host)->Acquire(kToken);
    ASSERT_TRUE(lease.ok()) << lease.status();
    absl::StatusOr<PayloadSocketHost::Lease> second = (*host)->Acquire(kToken);
    EXPECT_TRUE(absl::IsFailedPrecondition(second.status())) << second.status();
    EXPECT_TRUE(absl::StrContains(second.status().message(), "another transfer"));
    // The bytes the trainer sends reach the transfer holding the link.
    const char bytes[] = "payload";
    ASSERT_TRUE(SendAll(socket, bytes, sizeof(bytes), Soon()).ok());
    char got[sizeof(bytes)];
    ASSERT_TRUE(ReceiveAll(lease->socket(), got, sizeof(got), Soon()).ok());
    EXPECT_STREQ(got, bytes);
    lease->Finished();
  }
  // Finished: the link serves the next transfer.
  EXPECT_TRUE((*host)->Acquire(kToken).ok());
  // (That lease ended unfinished: the link is closed, the trainer sees it.)
  EXPECT_EQ((*host)->links(), 0u);
  char byte;
  EXPECT_TRUE(absl::IsUnavailable(ReceiveAll(socket, &byte, 1, Soon())));
  close(socket);
  absl::StatusOr<PayloadSocketHost::Lease> gone = (*host)->Acquire(kToken);
  EXPECT_TRUE(absl::IsFailedPrecondition(gone.status()));
  EXPECT_TRUE(absl::StrContains(gone.status().message(), kLinkNotOpen)) << gone.status();
}

TEST(PayloadSocketHostTest, TheTrainerClosingItsEndDropsTheLink) {
  absl::StatusOr<std::unique_ptr<PayloadSocketHost>> host = PayloadSocketHost::Start("127.0.0.1");
  ASSERT_TRUE(host.ok()) << host.status();
  const int socket = OpenWithHello(**host, EncodeHello(kToken));
  ASSERT_GE(socket, 0);
  close(socket);
  EXPECT_TRUE(WaitForLinks(**host, 0));
}

TEST(PayloadSocketHostTest, BadHellosAndTakenTokensAreRefused) {
  absl::StatusOr<std::unique_ptr<PayloadSocketHost>> host = PayloadSocketHost::Start("127.0.0.1");
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_LT(OpenWithHello(**host, std::string(kHelloBytes, 'x')), 0);
  EXPECT_LT(OpenWithHello(**host, EncodeHello(std::string(kLinkTokenChars, 'g'))), 0);
  const int socket = OpenWithHello(**host, EncodeHello(kToken));
  ASSERT_GE(socket, 0);
  // A second connection cannot take over a link that is open.
  EXPECT_LT(OpenWithHello(**host, EncodeHello(kToken)), 0);
  EXPECT_EQ((*host)->links(), 1u);
  close(socket);
}

TEST(PayloadSocketHostTest, LinksNoCallNamesAreClosed) {
  absl::StatusOr<std::unique_ptr<PayloadSocketHost>> host = PayloadSocketHost::Start("127.0.0.1");
  ASSERT_TRUE(host.ok()) << host.status();
  const std::string named(kLinkTokenChars, 'd');
  const int stranger = OpenWithHello(**host, EncodeHello(kToken));
  const int trainer = OpenWithHello(**host, EncodeHello(named));
  ASSERT_GE(stranger, 0);
  ASSERT_GE(trainer, 0);
  ASSERT_TRUE((*host)->Claim(named).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition((*host)->Claim(std::string(kLinkTokenChars, 'e'))));
  // The stranger's link goes after kUnclaimedTimeout; the named one stays.
  const absl::Time deadline =
      absl::Now() + PayloadSocketHost::kUnclaimedTimeout + absl::Seconds(10);
  while ((*host)->links() != 1 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ((*host)->links(), 1u);
  char byte;
  EXPECT_TRUE(absl::IsUnavailable(ReceiveAll(stranger, &byte, 1, Soon())));
  EXPECT_TRUE((*host)->Acquire(named).ok());
  close(stranger);
  close(trainer);
}

TEST(PayloadSocketHostTest, ClosingTheHostEndsItsLinks) {
  absl::StatusOr<std::unique_ptr<PayloadSocketHost>> host = PayloadSocketHost::Start("127.0.0.1");
  ASSERT_TRUE(host.ok()) << host.status();
  const int socket = OpenWithHello(**host, EncodeHello(kToken));
  ASSERT_GE(socket, 0);
  host->reset();
  char byte;
  EXPECT_TRUE(absl::IsUnavailable(ReceiveAll(socket, &byte, 1, Soon())));
  close(socket);
}

// A failed poll (here: more descriptors watched than a lowered limit
// allows) does not stop the host for good: it takes links again once the
// cause clears, and it can be stopped while its polls fail.
TEST(PayloadSocketHostTest, KeepsServingAfterItsPollsFail) {
  absl::StatusOr<std::unique_ptr<PayloadSocketHost>> host = PayloadSocketHost::Start("127.0.0.1");
  ASSERT_TRUE(host.ok()) << host.status();
  {
    testing::StarvedDescriptors starved;
    absl::SleepFor(absl::Milliseconds(1500));  // (Its loop polls at least once a second.)
  }
  const int socket = OpenWithHello(**host, EncodeHello(kToken));
  EXPECT_GE(socket, 0) << "after failed polls the host took no link";
  EXPECT_TRUE(WaitForLinks(**host, 1));
  if (socket >= 0) close(socket);

  const absl::Time stopping = absl::Now();
  {
    testing::StarvedDescriptors starved;
    absl::SleepFor(absl::Milliseconds(1200));
    host->reset();
  }
  EXPECT_LT(absl::Now() - stopping, absl::Seconds(4)) << "stopping it while its polls failed";
}

// The host's timeouts run while its polls fail too: a stranger's link no
// call names and a connection that never sends its hello are closed on
// time, which is what can bring the watched set back under the limit.
TEST(PayloadSocketHostTest, ItsTimeoutsRunWhileItsPollsFail) {
  absl::StatusOr<std::unique_ptr<PayloadSocketHost>> host = PayloadSocketHost::Start("127.0.0.1");
  ASSERT_TRUE(host.ok()) << host.status();
  absl::StatusOr<int> silent = ConnectTcp("127.0.0.1", (*host)->port(), absl::Seconds(5));
  ASSERT_TRUE(silent.ok()) << silent.status();
  // Accepted after `silent` (in order): once it is answered, both are held,
  // before the limit drops (no descriptor can be made after).
  const int stranger = OpenWithHello(**host, EncodeHello(kToken));
  ASSERT_GE(stranger, 0);
  bool silent_closed = false;
  size_t links = 1;
  {
    testing::StarvedDescriptors starved;
    const absl::Time deadline =
        absl::Now() +
        std::max(PayloadSocketHost::kUnclaimedTimeout, PayloadSocketHost::kHelloTimeout) +
        absl::Seconds(5);
    while ((links != 0 || !silent_closed) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(50));
      links = (*host)->links();
      char byte;
      const ssize_t n = recv(*silent, &byte, 1, MSG_DONTWAIT);
      silent_closed = silent_closed || n == 0 || (n < 0 && errno != EAGAIN);
    }
  }
  EXPECT_EQ(links, 0u) << "the unclaimed link outlived its timeout while polls failed";
  EXPECT_TRUE(silent_closed) << "the silent connection outlived its timeout while polls failed";
  close(stranger);
  close(*silent);
}

}  // namespace
}  // namespace shardopt
