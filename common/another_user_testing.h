// Test support: a piece of a test run in a child process as another user
// (uid and gid 65534), for the rule that same-host links (shared memory,
// loopback device pairs) only join processes of one user
// (common/shared_memory.h, CheckPeerIsSameUser).
// Needs root and a kernel that lets it switch users: Bazel's sandbox maps
// root alone, so such tests are tagged no-sandbox, and the run says why it
// could not happen so that the test can skip.
#ifndef SHARDOPT_COMMON_ANOTHER_USER_TESTING_H_
#define SHARDOPT_COMMON_ANOTHER_USER_TESTING_H_

#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <string>

namespace shardopt {

// Abstract socket name `name` as an address; made before fork (the child of
// a threaded process should only make system calls).
struct AbstractSocketAddress {
  sockaddr_un address{};
  socklen_t length = 0;
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&address); }
};
inline AbstractSocketAddress AbstractSocketAddressOf(const std::string& name) {
  AbstractSocketAddress a;
  a.address.sun_family = AF_UNIX;
  std::memcpy(a.address.sun_path + 1, name.data(), name.size());
  a.length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

// The child's way back to the test: Ready() lets the parent's step run;
// Say() is what the run reports (at most 511 bytes in all).
struct AnotherUserChannel {
  int ready_fd;
  int said_fd;
  void Ready() const {
    if (write(ready_fd, "r", 1) != 1) _exit(5);
  }
  void Say(const char* data, size_t bytes) const {
    if (write(said_fd, data, bytes) < 0) _exit(2);
  }
};

struct AnotherUserRun {
  enum Outcome { kRan, kNotRoot, kCannotSwitch, kChildFailed } outcome = kRan;
  std::string said;  // What the child said.
  int status = 0;    // The child's wait status.
  // Why a test skips, for kNotRoot and kCannotSwitch.
  const char* skip_reason() const {
    return outcome == kNotRoot ? "needs root to run a child as another user"
                               : "this sandbox cannot switch a process to uid 65534";
  }
};

// Forks; the child becomes uid and gid 65534 and runs `child(channel)`
// (system calls only; it returns whether it did its part), while the parent
// runs `parent()` once the child called Ready() (not at all if it never
// did), then collects what the child said.
template <typename Child, typename Parent>
AnotherUserRun RunAsAnotherUser(Child child, Parent parent) {
  AnotherUserRun run;
  if (geteuid() != 0) {
    run.outcome = AnotherUserRun::kNotRoot;
    return run;
  }
  int ready[2], said[2];
  if (pipe(ready) != 0 || pipe(said) != 0) {
    run.outcome = AnotherUserRun::kChildFailed;
    return run;
  }
  const pid_t pid = fork();
  if (pid == 0) {
    close(ready[0]);
    close(said[0]);
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
    _exit(child(AnotherUserChannel{ready[1], said[1]}) ? 0 : 1);
  }
  close(ready[1]);
  close(said[1]);
  char signal = 0;
  if (pid > 0 && read(ready[0], &signal, 1) == 1) parent();
  close(ready[0]);
  char buffer[512];
  ssize_t n = 0;
  while (pid > 0 && run.said.size() < sizeof(buffer) &&
         (n = read(said[0], buffer, sizeof(buffer))) > 0) {
    run.said.append(buffer, static_cast<size_t>(n));
  }
  close(said[0]);
  if (pid < 0 || waitpid(pid, &run.status, 0) != pid) {
    run.outcome = AnotherUserRun::kChildFailed;
  } else if (WIFEXITED(run.status) && WEXITSTATUS(run.status) == 3) {
    run.outcome = AnotherUserRun::kCannotSwitch;
  } else if (!WIFEXITED(run.status) || WEXITSTATUS(run.status) != 0) {
    run.outcome = AnotherUserRun::kChildFailed;
  }
  return run;
}

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_ANOTHER_USER_TESTING_H_
