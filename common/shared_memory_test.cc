#include "common/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "gtest/gtest.h"

namespace shardopt {
namespace {

TEST(SharedSegmentTest, CreatedZeroedSealedAndMappable) {
  absl::StatusOr<SharedSegment> segment = SharedSegment::Create(10000);
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(segment->size(), 10000u);
  for (size_t i = 0; i < segment->size(); ++i) ASSERT_EQ(segment->data()[i], 0);
  // The seals hold: nobody can shrink it under a mapping.
  EXPECT_NE(ftruncate(segment->fd(), 100), 0);
  EXPECT_NE(ftruncate(segment->fd(), 20000), 0);

  // A second mapping (as the other process makes) sees the same bytes.
  std::memcpy(segment->data() + 5000, "abc", 3);
  absl::StatusOr<SharedSegment> other = SharedSegment::Map(dup(segment->fd()), 10000);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(std::memcmp(other->data() + 5000, "abc", 3), 0);
  other->data()[7] = 9;
  EXPECT_EQ(segment->data()[7], 9);
  EXPECT_TRUE(other->Contains(9990, 10));
  EXPECT_FALSE(other->Contains(9990, 11));
  EXPECT_FALSE(other->Contains(10001, 0));
  EXPECT_FALSE(other->Contains(1, ~uint64_t{0}));

  // Both mappings name one memory file; another segment is another file.
  EXPECT_NE(segment->file_id().inode, 0u);
  EXPECT_EQ(other->file_id().device, segment->file_id().device);
  EXPECT_EQ(other->file_id().inode, segment->file_id().inode);
  absl::StatusOr<SharedSegment> second = SharedSegment::Create(10000);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(second->file_id().inode, segment->file_id().inode);
}

TEST(SharedSegmentTest, MapRefusesAWrongSizeAndAnUnsealedSegment) {
  absl::StatusOr<SharedSegment> segment = SharedSegment::Create(4096);
  ASSERT_TRUE(segment.ok());
  absl::StatusOr<SharedSegment> wrong = SharedSegment::Map(dup(segment->fd()), 8192);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(wrong.status().message().find("4096 bytes"), std::string::npos);

  const int unsealed = memfd_create("test", MFD_CLOEXEC);
  ASSERT_GE(unsealed, 0);
  ASSERT_EQ(ftruncate(unsealed, 4096), 0);
  absl::StatusOr<SharedSegment> refused = SharedSegment::Map(unsealed, 4096);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("not sealed"), std::string::npos);
}

// A hugetlbfs memfd takes the seals, but a hole punched in it would read
// as a SIGBUS on the shard: refused before it is mapped.
TEST(SharedSegmentTest, MapRefusesAHugePageSegment) {
  const int huge = memfd_create("test", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB);
  if (huge < 0) GTEST_SKIP() << "this kernel makes no hugetlbfs memfd: " << std::strerror(errno);
  const off_t two_mib = 2 << 20;
  if (ftruncate(huge, two_mib) != 0 ||
      fcntl(huge, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const int error = errno;
    close(huge);
    GTEST_SKIP() << "this host's huge pages take no 2 MiB sealed memfd: " << std::strerror(error);
  }
  absl::StatusOr<SharedSegment> refused = SharedSegment::Map(huge, two_mib);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("not plain shared memory"), std::string::npos)
      << refused.status();
}

TEST(SharedSegmentTest, TooLargeIsRefusedCleanly) {
  // More than any test machine has: refused at creation, not a SIGBUS later.
  absl::StatusOr<SharedSegment> segment = SharedSegment::Create(size_t{1} << 50);
  EXPECT_EQ(segment.status().code(), absl::StatusCode::kResourceExhausted) << segment.status();
}

TEST(SharedMemorySocketTest, DescriptorTravelsWithItsMessage) {
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair), 0);
  absl::StatusOr<SharedSegment> segment = SharedSegment::Create(8192);
  ASSERT_TRUE(segment.ok());
  segment->data()[100] = 42;
  ASSERT_TRUE(SendMessage(pair[0], "attach 8192", segment->fd()).ok());
  int fd = -1;
  absl::StatusOr<std::string> message = ReceiveMessage(pair[1], absl::Seconds(5), &fd);
  ASSERT_TRUE(message.ok()) << message.status();
  EXPECT_EQ(*message, "attach 8192");
  ASSERT_GE(fd, 0);
  absl::StatusOr<SharedSegment> mapped = SharedSegment::Map(fd, 8192);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ(mapped->data()[100], 42);

  // Nothing more: a bounded wait, then the peer's close.
  EXPECT_EQ(ReceiveMessage(pair[1], absl::Milliseconds(20)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(PeerClosed(pair[1]));
  close(pair[0]);
  EXPECT_TRUE(PeerClosed(pair[1]));
  EXPECT_EQ(ReceiveMessage(pair[1], absl::Seconds(1)).status().code(),
            absl::StatusCode::kUnavailable);
  close(pair[1]);
}

TEST(SharedMemorySocketTest, AbstractNamesConnectOnlyWhereSomethingListens) {
  const std::string name = "shardopt-test-" + RandomHexToken(8);
  EXPECT_EQ(ConnectAbstract(name).status().code(), absl::StatusCode::kUnavailable);
  absl::StatusOr<int> listener = ListenAbstract(name);
  ASSERT_TRUE(listener.ok()) << listener.status();
  absl::StatusOr<int> connected = ConnectAbstract(name);
  ASSERT_TRUE(connected.ok()) << connected.status();
  EXPECT_EQ(ListenAbstract(name).status().code() == absl::StatusCode::kOk, false);
  close(*connected);
  close(*listener);
  EXPECT_EQ(RandomHexToken(16).size(), 32u);
  EXPECT_NE(RandomHexToken(16), RandomHexToken(16));
}

}  // namespace
}  // namespace shardopt
