// Test helper: a TCP socket listening on 127.0.0.1 at a port the kernel
// picked, closed on destruction. It accepts no connections itself, so a
// client that connects is queued and never answered (a silent peer), and
// while it lives its port is taken (for tests of servers refusing a port in
// use). After it is gone, port() names a port that was free.
#ifndef SHARDOPT_COMMON_LOOPBACK_LISTENER_TESTING_H_
#define SHARDOPT_COMMON_LOOPBACK_LISTENER_TESTING_H_

#include <string>

namespace shardopt {

class LoopbackListener {
 public:
  // A test failure when no socket can listen.
  LoopbackListener();
  ~LoopbackListener();
  LoopbackListener(const LoopbackListener&) = delete;
  LoopbackListener& operator=(const LoopbackListener&) = delete;

  int port() const { return port_; }
  // "127.0.0.1:PORT".
  std::string address() const;

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_LOOPBACK_LISTENER_TESTING_H_
