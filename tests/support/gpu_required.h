// How a GPU test reacts to a machine without a usable GPU. On build and CI
// machines it skips, with the reason; tools/gpu/gpu_check.sh sets
// SHARDOPT_REQUIRE_GPU=1 on the lent GPU machine, where the same condition
// must fail the test: a GPU test that skips there has checked nothing.
//
//   if (!gpu.ok()) SHARDOPT_GPU_UNAVAILABLE("no usable GPU: " << gpu.status());
#ifndef SHARDOPT_TESTS_SUPPORT_GPU_REQUIRED_H_
#define SHARDOPT_TESTS_SUPPORT_GPU_REQUIRED_H_

#include <cstdlib>
#include <cstring>

#include "gtest/gtest.h"

namespace shardopt {
namespace testing {

inline bool GpuRequired() {
  const char* value = std::getenv("SHARDOPT_REQUIRE_GPU");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

}  // namespace testing
}  // namespace shardopt

// GTEST_SKIP() << message, or GTEST_FAIL() << message under
// SHARDOPT_REQUIRE_GPU=1; returns from the calling (void) function either way.
#define SHARDOPT_GPU_UNAVAILABLE(message)                           \
  do {                                                              \
    if (::shardopt::testing::GpuRequired()) {                       \
      GTEST_FAIL() << "GPU test without a usable GPU: " << message; \
    } else {                                                        \
      GTEST_SKIP() << message;                                      \
    }                                                               \
  } while (0)

#endif  // SHARDOPT_TESTS_SUPPORT_GPU_REQUIRED_H_
