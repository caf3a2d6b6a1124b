// Test support shared by the GPU test (fused_optimizers_test.cc) and the host
// emulation test (fused_kernels_emulation_test.cc): random data, optimizer
// configurations, an independent bf16 reference and bit comparisons.
#ifndef SHARDOPT_SERVER_CUDA_FUSED_TEST_UTIL_H_
#define SHARDOPT_SERVER_CUDA_FUSED_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "common/optimizer_config.h"
#include "gtest/gtest.h"

namespace shardopt {
namespace gpu {
namespace testing {

uint32_t Bits(float x);
float FromBits(uint32_t u);

// Random fp32 values with varied magnitudes, exact zeros of both signs and
// (gradients) subnormal and large values, so that every rounding path is
// exercised; never all zeros. Deterministic in (seed, index) whatever the
// thread count (up to 16 threads for large vectors).
void FillRandom(std::vector<float>& v, uint64_t seed, bool gradient);

// Special fp32 bit patterns for the bf16 conversion (zeros, subnormals, ties,
// the largest finite values, infinities, NaNs) and random ones (a quarter of
// them on or next to a rounding tie).
std::vector<uint32_t> SpecialBits();
std::vector<uint32_t> RandomBits(size_t count, uint64_t seed);

// An independent fp32 -> bf16 reference: the nearer of the two bf16
// neighbours of x in exact (double) arithmetic, ties to the even pattern.
// For non-NaN x.
uint16_t ReferenceBf16(float x);
// got == ReferenceBf16(x), or for NaN x: the documented NaN (sign and top
// payload bits kept, quiet bit set).
::testing::AssertionResult Bf16Matches(float x, uint16_t got);
// Counts mismatches, reporting the first `report` of them.
size_t CountBf16Mismatches(const float* x, const uint16_t* got, size_t n, int report = 5);

// Bit-identical, except that any NaN matches any NaN.
::testing::AssertionResult SameFloats(const std::string& what, const float* want, const float* got,
                                      size_t n);

struct NamedConfig {
  std::string name;
  OptimizerConfig config;
};
// Every family and option: SGD (plain, weight decay + maximize, momentum,
// dampening, nesterov), Adam (L2, amsgrad, maximize, betas), AdamW (decay,
// amsgrad + maximize, no decay), Adagrad (lr_decay, weight decay, initial
// accumulator, maximize).
std::vector<NamedConfig> ParityConfigs();
// For GoogleTest's parameter names in failure messages.
void PrintTo(const NamedConfig& c, std::ostream* os);

}  // namespace testing
}  // namespace gpu
}  // namespace shardopt

#endif  // SHARDOPT_SERVER_CUDA_FUSED_TEST_UTIL_H_
