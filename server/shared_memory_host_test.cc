#include "server/shared_memory_host.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/another_user_testing.h"
#include "common/shared_memory.h"
#include "gtest/gtest.h"
#include "server/serve_poll_testing.h"

namespace shardopt {
namespace {

// Waits (bounded) until the host holds `count` attachments.
bool WaitForAttachments(const SharedMemoryHost& host, size_t count) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (host.attachments() != count) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

// Connects and sends `message` with `fd`; returns the socket and the answer.
std::pair<int, std::string> Ask(const SharedMemoryHost& host, const std::string& message, int fd) {
  absl::StatusOr<int> socket = ConnectAbstract(host.socket_name());
  EXPECT_TRUE(socket.ok()) << socket.status();
  EXPECT_TRUE(SendMessage(*socket, message, fd).ok());
  absl::StatusOr<std::string> answer = ReceiveMessage(*socket, absl::Seconds(10));
  EXPECT_TRUE(answer.ok()) << answer.status();
  return {*socket, answer.ok() ? *answer : ""};
}

TEST(SharedMemoryHostTest, AttachmentLastsAsLongAsItsConnection) {
  absl::StatusOr<std::unique_ptr<SharedMemoryHost>> host = SharedMemoryHost::Start();
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_TRUE(absl::StartsWith((*host)->socket_name(), "shardopt-shm-"));
  absl::StatusOr<SharedSegment> segment = SharedSegment::Create(1 << 16);
  ASSERT_TRUE(segment.ok());
  auto [socket, answer] = Ask(**host, "attach 65536", segment->fd());
  ASSERT_TRUE(absl::StartsWith(answer, "ok ")) << answer;
  const std::string attachment(absl::StripPrefix(answer, "ok "));
  EXPECT_EQ(attachment.size(), 32u);

  absl::StatusOr<std::shared_ptr<const SharedSegment>> found = (*host)->Find(attachment);
  ASSERT_TRUE(found.ok()) << found.status();
  // The shard's mapping and the trainer's are one memory.
  segment->data()[1234] = 77;
  EXPECT_EQ((*found)->data()[1234], 77);
  (*found)->data()[4321] = 55;
  EXPECT_EQ(segment->data()[4321], 55);
  EXPECT_EQ((*host)->attachments(), 1u);
  EXPECT_EQ((*host)->Find("0123").status().code(), absl::StatusCode::kFailedPrecondition);

  // The trainer goes away: the attachment is dropped; a call that still
  // holds the segment keeps a valid mapping.
  close(socket);
  ASSERT_TRUE(WaitForAttachments(**host, 0));
  EXPECT_EQ((*host)->Find(attachment).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*found)->data()[1234], 77);
}

TEST(SharedMemoryHostTest, TheTrainerSeesTheServerGo) {
  absl::StatusOr<std::unique_ptr<SharedMemoryHost>> host = SharedMemoryHost::Start();
  ASSERT_TRUE(host.ok());
  absl::StatusOr<SharedSegment> segment = SharedSegment::Create(4096);
  ASSERT_TRUE(segment.ok());
  auto [socket, answer] = Ask(**host, "attach 4096", segment->fd());
  ASSERT_TRUE(absl::StartsWith(answer, "ok ")) << answer;
  EXPECT_FALSE(PeerClosed(socket));
  host->reset();
  EXPECT_TRUE(PeerClosed(socket));
  close(socket);
}

TEST(SharedMemoryHostTest, BadAttachMessagesAreAnsweredAndRefused) {
  absl::StatusOr<std::unique_ptr<SharedMemoryHost>> host = SharedMemoryHost::Start();
  ASSERT_TRUE(host.ok());
  absl::StatusOr<SharedSegment> segment = SharedSegment::Create(4096);
  ASSERT_TRUE(segment.ok());
  const int unsealed = memfd_create("test", MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(unsealed, 4096), 0);
  const struct {
    std::string message;
    int fd;
    std::string why;
  } cases[] = {
      {"attach 4096", -1, "carried no segment"},
      {"attach 8192", segment->fd(), "not the 8192 announced"},
      {"attach 0", segment->fd(), "expected 'attach <bytes>'"},
      {"hello", segment->fd(), "expected 'attach <bytes>'"},
      {"attach 4096", unsealed, "not sealed"},
  };
  for (const auto& c : cases) {
    auto [socket, answer] = Ask(**host, c.message, c.fd);
    EXPECT_TRUE(absl::StartsWith(answer, "error ")) << c.message << ": " << answer;
    EXPECT_TRUE(absl::StrContains(answer, c.why)) << c.message << ": " << answer;
    // Then the host closes the connection.
    EXPECT_EQ(ReceiveMessage(socket, absl::Seconds(10)).status().code(),
              absl::StatusCode::kUnavailable)
        << c.message;
    close(socket);
  }
  close(unsealed);
  EXPECT_EQ((*host)->attachments(), 0u);
}

// A process of another user (root's child after setuid) is refused at once.
TEST(SharedMemoryHostTest, AnotherUserIsRefused) {
  absl::StatusOr<std::unique_ptr<SharedMemoryHost>> host = SharedMemoryHost::Start();
  ASSERT_TRUE(host.ok());
  const AbstractSocketAddress address = AbstractSocketAddressOf((*host)->socket_name());
  const AnotherUserRun run = RunAsAnotherUser(
      [&](const AnotherUserChannel& channel) {
        char buffer[512] = {};
        ssize_t n = -1;
        const int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
        if (s >= 0 && connect(s, address.get(), address.length) == 0) {
          // The host answers at accept, before any message (one sent and
          // left unread there would turn its close into ECONNRESET here).
          pollfd waiting{s, POLLIN, 0};
          if (poll(&waiting, 1, 10000) == 1) n = recv(s, buffer, sizeof(buffer) - 1, 0);
        }
        if (n > 0) channel.Say(buffer, static_cast<size_t>(n));
        return n > 0;
      },
      [] {});
  if (run.outcome == AnotherUserRun::kNotRoot || run.outcome == AnotherUserRun::kCannotSwitch) {
    GTEST_SKIP() << run.skip_reason();
  }
  ASSERT_EQ(run.outcome, AnotherUserRun::kRan) << "the child got no answer";
  EXPECT_TRUE(absl::StartsWith(run.said, "error the trainer runs as another user (uid 65534"))
      << run.said;
  EXPECT_EQ((*host)->attachments(), 0u);
}

// A failed poll (here: more descriptors watched than a lowered limit
// allows) does not stop the host for good: it attaches again once the
// cause clears, and it can be stopped while its polls fail.
TEST(SharedMemoryHostTest, KeepsServingAfterItsPollsFail) {
  absl::StatusOr<std::unique_ptr<SharedMemoryHost>> host = SharedMemoryHost::Start();
  ASSERT_TRUE(host.ok()) << host.status();
  {
    testing::StarvedDescriptors starved;
    absl::SleepFor(absl::Milliseconds(1500));  // (Its loop polls at least once a second.)
  }
  absl::StatusOr<SharedSegment> segment = SharedSegment::Create(1 << 16);
  ASSERT_TRUE(segment.ok());
  auto [socket, answer] = Ask(**host, "attach 65536", segment->fd());
  EXPECT_TRUE(absl::StartsWith(answer, "ok "))
      << "after failed polls the host said '" << answer << "'";
  EXPECT_TRUE(WaitForAttachments(**host, 1));
  close(socket);

  const absl::Time stopping = absl::Now();
  {
    testing::StarvedDescriptors starved;
    absl::SleepFor(absl::Milliseconds(1200));
    host->reset();
  }
  EXPECT_LT(absl::Now() - stopping, absl::Seconds(4)) << "stopping it while its polls failed";
}

// Its timeout runs while its polls fail too: a connection that never sends
// its attach message is closed on time, which is what can bring the
// watched set back under the limit.
TEST(SharedMemoryHostTest, ItsTimeoutRunsWhileItsPollsFail) {
  absl::StatusOr<std::unique_ptr<SharedMemoryHost>> host = SharedMemoryHost::Start();
  ASSERT_TRUE(host.ok()) << host.status();
  absl::StatusOr<int> silent = ConnectAbstract((*host)->socket_name());
  ASSERT_TRUE(silent.ok()) << silent.status();
  // Accepted after `silent` (in order): once it is answered, `silent` is
  // held, before the limit drops (no descriptor can be made after).
  auto [asked, answer] = Ask(**host, "hello", -1);
  EXPECT_TRUE(absl::StartsWith(answer, "error ")) << answer;
  close(asked);
  bool closed = false;
  {
    testing::StarvedDescriptors starved;
    const absl::Time deadline =
        absl::Now() + SharedMemoryHost::kAttachMessageTimeout + absl::Seconds(5);
    while (!closed && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(50));
      char byte;
      const ssize_t n = recv(*silent, &byte, 1, MSG_DONTWAIT);
      closed = n == 0 || (n < 0 && errno != EAGAIN);
    }
  }
  EXPECT_TRUE(closed) << "the silent connection outlived its timeout while polls failed";
  close(*silent);
}

}  // namespace
}  // namespace shardopt
