// fp32 -> bf16 bit conversion shared by the host (tests, Fp32ToBf16Bits) and
// the kernels. Internal to //server/cuda.
#ifndef SHARDOPT_SERVER_CUDA_BF16_BITS_H_
#define SHARDOPT_SERVER_CUDA_BF16_BITS_H_

#include <cstdint>

#if defined(__CUDACC__)
#define SHARDOPT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SHARDOPT_HOST_DEVICE inline
#endif

namespace shardopt {
namespace gpu {
namespace internal {

// Round to nearest, ties to even, on the bit pattern: add 0x7fff plus the
// lowest kept bit and truncate. A carry out of the mantissa bumps the
// exponent, which is exactly the rounding up to the next binade or, from the
// largest finite values, to infinity. NaN (exponent all ones, mantissa not
// zero) would round to infinity that way, so it is handled first: sign and
// top payload bits kept, quiet bit set.
SHARDOPT_HOST_DEVICE uint16_t Fp32BitsToBf16Bits(uint32_t u) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16);
}

}  // namespace internal
}  // namespace gpu
}  // namespace shardopt

#endif  // SHARDOPT_SERVER_CUDA_BF16_BITS_H_
