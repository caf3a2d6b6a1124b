// Conversions between fp32 and the 16-bit wire types, bit-exact with
// PyTorch 1.13 on the CPU: `.to(torch.bfloat16)` and `.half()` round to
// nearest, ties to even; values beyond the type's range become +-inf; NaN
// becomes PyTorch's NaN pattern (bf16: 0xFFFF; fp16: 0x7E00 with the sign
// kept). The widening conversions are exact.
#ifndef SHARDOPT_COMMON_DTYPE_CONVERT_H_
#define SHARDOPT_COMMON_DTYPE_CONVERT_H_

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace shardopt {

uint16_t FloatToBFloat16Bits(float value);
float BFloat16BitsToFloat(uint16_t bits);
uint16_t FloatToHalfBits(float value);
float HalfBitsToFloat(uint16_t bits);

// dst (`count` elements of `dtype`, any alignment) from fp32 `src`.
void ConvertFromFloat(const float* src, size_t count, DType dtype, void* dst);

// Index of the first NaN or infinity among `count` elements of `dtype` at
// `data` (any alignment), or `count`.
size_t FindNonFiniteOfType(const void* data, size_t count, DType dtype);

// ConvertFromFloat, then FindNonFiniteOfType on what was written (a finite
// fp32 value can overflow fp16), block by block so that the check reads the
// output while it is still in cache. All of `dst` is written either way.
size_t ConvertFromFloatAndFindNonFinite(const float* src, size_t count, DType dtype, void* dst);

// fp32 `dst` from `count` elements of `dtype` at `src` (any alignment).
// Returns the index of the first NaN or infinity in what it wrote to `dst`,
// or `count` when all are finite: `src` is read once, so a source another
// process may write meanwhile (shared memory) cannot pass a NaN unseen.
// (Checked block by block while the block is in cache.)
size_t ConvertToFloatAndFindNonFinite(const void* src, size_t count, DType dtype, float* dst);

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_DTYPE_CONVERT_H_
