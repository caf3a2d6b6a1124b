#include "common/fork_private.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace shardopt {
namespace {

// True when `fd` is open on the character device `path` names.
bool IsDevice(int fd, const char* path) {
  struct stat of_fd, of_path;
  return fstat(fd, &of_fd) == 0 && stat(path, &of_path) == 0 && S_ISCHR(of_fd.st_mode) &&
         of_fd.st_rdev == of_path.st_rdev;
}

bool IsSocket(int fd) {
  struct stat of_fd;
  return fstat(fd, &of_fd) == 0 && S_ISSOCK(of_fd.st_mode);
}

// True when `fd`'s peer closed within `timeout_ms` (it sends nothing).
bool PeerClosedWithin(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, timeout_ms) <= 0) return false;
  char byte;
  return recv(fd, &byte, 1, MSG_DONTWAIT) == 0;
}

// A child forked while the trainer holds its links: the marked socket is
// /dev/null there, so the trainer's close is the last one and the peer
// hears of it while the child lives on; the unmarked one the child keeps.
TEST(ForkPrivateTest, AForkedChildDoesNotKeepAMarkedSocketOpen) {
  int marked[2], kept[2], ready[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, marked), 0);
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, kept), 0);
  ASSERT_EQ(pipe2(ready, O_CLOEXEC), 0);
  MarkForkPrivate(marked[0]);
  MarkForkPrivate(marked[0]);  // (Twice is once.)

  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const char verdict = (IsDevice(marked[0], "/dev/null") ? 1 : 0) | (IsSocket(kept[0]) ? 2 : 0);
    if (write(ready[1], &verdict, 1) != 1) _exit(1);
    sleep(30);  // Outlives the parent's close; killed by the test.
    _exit(0);
  }
  char verdict = 0;
  ASSERT_EQ(read(ready[0], &verdict, 1), 1);
  EXPECT_TRUE(verdict & 1) << "the child's copy of the marked socket is not /dev/null";
  EXPECT_TRUE(verdict & 2) << "the child lost the unmarked socket";
  EXPECT_TRUE(IsSocket(marked[0])) << "the parent's own descriptor changed";

  CloseForkPrivate(marked[0]);
  close(kept[0]);
  EXPECT_TRUE(PeerClosedWithin(marked[1], 5000)) << "the child kept the marked socket open";
  EXPECT_FALSE(PeerClosedWithin(kept[1], 200)) << "the child should still hold the unmarked one";

  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(PeerClosedWithin(kept[1], 5000));
  for (int fd : {marked[1], kept[1], ready[0], ready[1]}) close(fd);
}

// A number forgotten and closed may be reused by anything: the child keeps
// what opened there next.
TEST(ForkPrivateTest, AClosedNumberIsForgotten) {
  const int first = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(first, 0);
  MarkForkPrivate(first);
  CloseForkPrivate(first);
  const int reused = open("/dev/zero", O_RDONLY | O_CLOEXEC);
  ASSERT_EQ(reused, first) << "the lowest free number is reused (nothing else opens here)";

  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(IsDevice(reused, "/dev/zero") ? 0 : 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child lost what reused a forgotten number";
  close(reused);
}

}  // namespace
}  // namespace shardopt
