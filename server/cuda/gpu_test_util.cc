// GPU availability for the GPU tests, decided once (gpu_test_util.h).
#include "server/cuda/gpu_test_util.h"

#include <cstdio>

#include "server/cuda/device.h"
#include "tests/support/gpu_required.h"

namespace shardopt {
namespace gpu {
namespace testing {

const absl::Status& GpuStatus() {
  static const absl::Status* status = [] {
    absl::StatusOr<GpuInfo> gpu = SelectDevice("auto");
    if (gpu.ok()) {
      std::fprintf(stderr, "[gpu] using %s\n", gpu->DebugString().c_str());
      return new absl::Status();
    }
    return new absl::Status(gpu.status());
  }();
  return *status;
}

void GpuTest::SetUp() {
  if (!GpuStatus().ok()) SHARDOPT_GPU_UNAVAILABLE("no usable CUDA GPU here: " << GpuStatus());
}

}  // namespace testing
}  // namespace gpu
}  // namespace shardopt
