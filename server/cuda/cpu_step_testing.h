// Internal to //server/cuda's emulation tests: one step of CpuBackend (the
// reference) on one trainer's gradient, as ModelShard drives it, and the
// bit-for-bit comparison of two fp32 arrays.
#ifndef SHARDOPT_SERVER_CUDA_CPU_STEP_TESTING_H_
#define SHARDOPT_SERVER_CUDA_CPU_STEP_TESTING_H_

#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "common/optimizer_config.h"
#include "gtest/gtest.h"
#include "server/cpu_backend.h"

namespace shardopt {
namespace testing {

// Stages `grad` as trainer 0's and applies step `step`: Apply with a
// multiplier of 1, else Reduce and Update (the gradient-control path).
inline absl::Status CpuStep(CpuBackend& cpu, const OptimizerConfig& config, int64_t step,
                            float multiplier, const std::vector<float>& grad) {
  absl::StatusOr<size_t> staged = cpu.Stage(0, 0, grad.data(), DType::kFloat32, grad.size());
  if (!staged.ok()) return staged.status();
  if (absl::Status s = cpu.FinishStaging(0); !s.ok()) return s;
  if (multiplier == 1.0f) return cpu.Apply(step, /*mean=*/false, config);
  if (absl::Status s = cpu.Reduce(/*mean=*/false); !s.ok()) return s;
  return cpu.Update(step, config, multiplier);
}

inline void ExpectSameBits(const std::vector<float>& expected, const std::vector<float>& actual,
                           const char* what, int64_t step) {
  ASSERT_EQ(expected.size(), actual.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(std::memcmp(&expected[i], &actual[i], sizeof(float)), 0)
        << what << "[" << i << "] after step " << step << ": " << expected[i] << " vs "
        << actual[i];
  }
}

}  // namespace testing
}  // namespace shardopt

#endif  // SHARDOPT_SERVER_CUDA_CPU_STEP_TESTING_H_
