// Test support shared by the two files of //server/cuda:fused_optimizers_test
// (fused_optimizers_test.cc, device_test.cc): whether this machine has a
// usable GPU (decided once), GpuTest (a fixture that skips without one, or
// fails under SHARDOPT_REQUIRE_GPU=1), ASSERT_OK and ValueOrDie.
#ifndef SHARDOPT_SERVER_CUDA_GPU_TEST_UTIL_H_
#define SHARDOPT_SERVER_CUDA_GPU_TEST_UTIL_H_

#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace shardopt {
namespace gpu {
namespace testing {

// SelectDevice("auto")'s verdict, from its first call (which also makes that
// GPU current and prints it).
const absl::Status& GpuStatus();

// Tests that need a GPU: they skip, saying why, where GpuStatus() is not OK
// (and fail instead under SHARDOPT_REQUIRE_GPU=1: tests/support/gpu_required.h).
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override;
};

// The value, or a test failure and abort().
template <typename T>
T ValueOrDie(absl::StatusOr<T> v) {
  if (!v.ok()) {
    ADD_FAILURE() << v.status();
    std::abort();
  }
  return *std::move(v);
}

}  // namespace testing
}  // namespace gpu
}  // namespace shardopt

#define ASSERT_OK(expr)                                       \
  do {                                                        \
    const absl::Status assert_ok_status_ = (expr);            \
    ASSERT_TRUE(assert_ok_status_.ok()) << assert_ok_status_; \
  } while (0)

#endif  // SHARDOPT_SERVER_CUDA_GPU_TEST_UTIL_H_
