// ServePoll: the poll of the shard's socket hosts' serving loops
// (server/shared_memory_host.h, server/payload_socket_host.h), which must
// not stop serving for good over one failed poll.
//
// A failed poll (ENOMEM; EINVAL when more descriptors are watched than
// RLIMIT_NOFILE allows, after the limit was lowered at run time) is logged
// once per run of failures, in `what`'s name, and the loop naps 100 ms and
// goes round again, so that it serves once the cause clears. Its wake
// descriptor (a non-blocking eventfd, the owner's way to stop it) is read
// during a run of failures too, so that the owner can still stop it then.
// Serving thread only.
#ifndef SHARDOPT_SERVER_SERVE_POLL_H_
#define SHARDOPT_SERVER_SERVE_POLL_H_

#include <poll.h>

#include <vector>

namespace shardopt {

class ServePoll {
 public:
  enum class Result {
    kReady,  // The revents of `watched` are set.
    // Nothing to read (a failed or interrupted poll): run the loop's
    // timeouts (what they close may be what brings the watched set back
    // under the limit), then go round again.
    kAgain,
    kStop,   // The wake descriptor fired during a run of failures.
  };

  // `what`: the host's name in the log ("shared memory", "payload socket").
  ServePoll(const char* what, int wake_fd) : what_(what), wake_fd_(wake_fd) {}

  Result Poll(std::vector<pollfd>& watched, int timeout_ms);

 private:
  const char* const what_;
  const int wake_fd_;
  bool failing_ = false;
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_SERVE_POLL_H_
