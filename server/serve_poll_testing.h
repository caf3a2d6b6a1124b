// Test support for ServePoll's users (server/serve_poll.h): while a
// StarvedDescriptors lives, this process's descriptor limit (RLIMIT_NOFILE's
// soft limit) is 1, so that every poll of more than one descriptor fails
// with EINVAL (and no descriptor can be opened); it is restored when the
// object goes. For tests whose other threads only poll meanwhile.
#ifndef SHARDOPT_SERVER_SERVE_POLL_TESTING_H_
#define SHARDOPT_SERVER_SERVE_POLL_TESTING_H_

#include <sys/resource.h>

#include "gtest/gtest.h"

namespace shardopt::testing {

class StarvedDescriptors {
 public:
  StarvedDescriptors() {
    EXPECT_EQ(getrlimit(RLIMIT_NOFILE, &saved_), 0);
    rlimit starved = saved_;
    starved.rlim_cur = 1;
    EXPECT_EQ(setrlimit(RLIMIT_NOFILE, &starved), 0);
  }
  ~StarvedDescriptors() { EXPECT_EQ(setrlimit(RLIMIT_NOFILE, &saved_), 0); }
  StarvedDescriptors(const StarvedDescriptors&) = delete;
  StarvedDescriptors& operator=(const StarvedDescriptors&) = delete;

 private:
  rlimit saved_{};
};

}  // namespace shardopt::testing

#endif  // SHARDOPT_SERVER_SERVE_POLL_TESTING_H_
