#include "common/dtype_convert.h"

#include <algorithm>
#include <cstring>

#include "common/finite.h"
#include "common/float_bits.h"

namespace shardopt {
namespace {

uint32_t Bits(float value) { return FloatToBits(value); }
float FromBits(uint32_t bits) { return BitsToFloat(bits); }

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % alignof(uint16_t) == 0; }

uint16_t Load16(const char* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

}  // namespace

uint16_t FloatToBFloat16Bits(float value) {
  const uint32_t bits = Bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0xffff;  // NaN, as PyTorch writes it.
  // Round to nearest even on the 16 bits dropped; overflow carries into the
  // exponent and yields inf, as IEEE rounding says.
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

float BFloat16BitsToFloat(uint16_t bits) { return FromBits(static_cast<uint32_t>(bits) << 16); }

uint16_t FloatToHalfBits(float value) {
  const uint32_t bits = Bits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7e00u;   // NaN, as PyTorch writes it.
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520: rounds to inf.
  if (magnitude < 0x38800000u) {
    // Below 2^-14: a half subnormal (or zero). Adding 0.5 makes the FPU do
    // the round-to-nearest-even at 2^-24 granularity.
    const float rounded = FromBits(magnitude) + 0.5f;
    return sign | static_cast<uint16_t>(Bits(rounded) - Bits(0.5f));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits.
  const uint32_t rebiased = magnitude - 0x38000000u;
  const uint32_t rounding_bias = 0xfffu + ((rebiased >> 13) & 1u);
  return sign | static_cast<uint16_t>((rebiased + rounding_bias) >> 13);
}

float HalfBitsToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) {
    // inf; a NaN comes out quiet, as PyTorch's (and the CPU's) conversion
    // makes it.
    return FromBits(sign | 0x7f800000u | (mantissa << 13) | (mantissa != 0 ? 0x400000u : 0u));
  }
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in fp32.
    const float magnitude = static_cast<float>(mantissa) * FromBits(0x33800000u);
    return FromBits(sign | Bits(magnitude));
  }
  return FromBits(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

namespace {

// Branch-free bodies over typed pointers so that GCC vectorises them (a
// ternary on a float-derived value becomes a branch, so selects are masks);
// the callers fall back to the scalar functions above for misaligned 16-bit
// buffers. Every body gives the scalar function's bits for every input (the
// narrowing ones checked over all 2^32 floats when written; the tests check
// the special classes and a spread of values). On x86-64 each also gets an
// AVX2 clone picked at load time: the fp16 ones are compute-bound at SSE2
// width.
// (GCC on glibc only: the clones are picked by an ifunc resolver.
// //common:dtype_convert_baseline_test builds the file without them, so the
// default code is tested on AVX2 machines too.)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__GLIBC__) && \
    !defined(SHARDOPT_NO_VECTOR_CLONES)
#define SHARDOPT_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SHARDOPT_VECTOR_CLONES
#endif

// All ones where `condition` holds, else zero.
inline uint32_t Mask(bool condition) { return 0u - static_cast<uint32_t>(condition); }

inline uint32_t Select(uint32_t mask, uint32_t if_set, uint32_t if_clear) {
  return (if_set & mask) | (if_clear & ~mask);
}

SHARDOPT_VECTOR_CLONES
void NarrowToBFloat16(const float* __restrict src, size_t count, uint16_t* __restrict dst) {
  for (size_t i = 0; i < count; ++i) {
    const uint32_t bits = Bits(src[i]);
    const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const uint32_t nan = Mask((bits & 0x7fffffffu) > 0x7f800000u);
    dst[i] = static_cast<uint16_t>(Select(nan, 0xffffu, rounded));
  }
}

SHARDOPT_VECTOR_CLONES
void WidenBFloat16(const uint16_t* __restrict src, size_t count, float* __restrict dst) {
  for (size_t i = 0; i < count; ++i) dst[i] = FromBits(static_cast<uint32_t>(src[i]) << 16);
}

// FloatToHalfBits with all three cases computed and selected. The masks are
// spelled out: through Select() GCC 12 picks a vectorisation that runs about
// 1.5x slower.
SHARDOPT_VECTOR_CLONES
void NarrowToHalf(const float* __restrict src, size_t count, uint16_t* __restrict dst) {
  for (size_t i = 0; i < count; ++i) {
    const uint32_t bits = FloatToBits(src[i]);
    const uint32_t sign = (bits >> 16) & 0x8000u;
    const uint32_t magnitude = bits & 0x7fffffffu;
    const uint32_t rebiased = magnitude - 0x38000000u;
    const uint32_t normal = (rebiased + 0xfffu + ((rebiased >> 13) & 1u)) >> 13;
    const uint32_t subnormal = FloatToBits(BitsToFloat(magnitude) + 0.5f) - 0x3f000000u;
    const uint32_t is_subnormal = Mask(magnitude < 0x38800000u);
    const uint32_t is_overflow = Mask(magnitude >= 0x477ff000u);
    const uint32_t is_nan = Mask(magnitude > 0x7f800000u);
    uint32_t half = (subnormal & is_subnormal) | (normal & ~is_subnormal);
    half = (0x7c00u & is_overflow) | (half & ~is_overflow);
    half = (0x7e00u & is_nan) | (half & ~is_nan);
    dst[i] = static_cast<uint16_t>(sign | half);
  }
}

// HalfBitsToFloat with all three cases computed and selected.
SHARDOPT_VECTOR_CLONES
void WidenHalf(const uint16_t* __restrict src, size_t count, float* __restrict dst) {
  for (size_t i = 0; i < count; ++i) {
    const uint32_t half = src[i];
    const uint32_t sign = (half & 0x8000u) << 16;
    const uint32_t exponent = (half >> 10) & 0x1fu;
    const uint32_t mantissa = half & 0x3ffu;
    const uint32_t normal = ((exponent + 112) << 23) | (mantissa << 13);
    const uint32_t inf_or_nan = 0x7f800000u | (mantissa << 13) | (Mask(mantissa != 0) & 0x400000u);
    const uint32_t subnormal =
        Bits(static_cast<float>(static_cast<int32_t>(mantissa)) * FromBits(0x33800000u));
    uint32_t wide = Select(Mask(exponent == 0), subnormal, normal);
    wide = Select(Mask(exponent == 0x1f), inf_or_nan, wide);
    dst[i] = FromBits(sign | wide);
  }
}

}  // namespace

void ConvertFromFloat(const float* src, size_t count, DType dtype, void* dst) {
  char* out = static_cast<char*>(dst);
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(out, src, count * sizeof(float));
      return;
    case DType::kBFloat16:
      if (Aligned16(dst)) {
        NarrowToBFloat16(src, count, static_cast<uint16_t*>(dst));
        return;
      }
      for (size_t i = 0; i < count; ++i) {
        const uint16_t v = FloatToBFloat16Bits(src[i]);
        std::memcpy(out + 2 * i, &v, 2);
      }
      return;
    case DType::kFloat16:
      if (Aligned16(dst)) {
        NarrowToHalf(src, count, static_cast<uint16_t*>(dst));
        return;
      }
      for (size_t i = 0; i < count; ++i) {
        const uint16_t v = FloatToHalfBits(src[i]);
        std::memcpy(out + 2 * i, &v, 2);
      }
      return;
  }
}

size_t FindNonFiniteOfType(const void* data, size_t count, DType dtype) {
  const char* in = static_cast<const char*>(data);
  if (dtype == DType::kFloat32) {
    if (reinterpret_cast<uintptr_t>(data) % alignof(float) == 0) {
      return FindNonFinite(static_cast<const float*>(data), count);
    }
    for (size_t i = 0; i < count; ++i) {
      uint32_t bits;
      std::memcpy(&bits, in + 4 * i, sizeof(bits));  // Misaligned: no float* access.
      if ((bits & 0x7f800000u) == 0x7f800000u) return i;
    }
    return count;
  }
  // All-ones exponent: bf16 0x7f80, fp16 0x7c00.
  const uint16_t exponent = dtype == DType::kBFloat16 ? 0x7f80 : 0x7c00;
  if (Aligned16(data)) {
    // Blocks of branch-free (vectorisable) tests; the exact index only for a
    // block that has a hit.
    const uint16_t* values = static_cast<const uint16_t*>(data);
    constexpr size_t kBlock = 1024;
    for (size_t start = 0; start < count; start += kBlock) {
      const size_t end = std::min(count, start + kBlock);
      uint32_t hits = 0;
      for (size_t i = start; i < end; ++i) hits |= (values[i] & exponent) == exponent;
      if (hits == 0) continue;
      for (size_t i = start; i < end; ++i) {
        if ((values[i] & exponent) == exponent) return i;
      }
    }
    return count;
  }
  for (size_t i = 0; i < count; ++i) {
    if ((Load16(in + 2 * i) & exponent) == exponent) return i;
  }
  return count;
}

size_t ConvertFromFloatAndFindNonFinite(const float* src, size_t count, DType dtype, void* dst) {
  // 16 KiB of fp32 in, 8 KiB of 16-bit out: both stay in L1 for the check.
  constexpr size_t kBlock = 4096;
  char* out = static_cast<char*>(dst);
  const size_t element = DTypeSize(dtype);
  size_t first_bad = count;
  for (size_t start = 0; start < count; start += kBlock) {
    const size_t n = std::min(kBlock, count - start);
    ConvertFromFloat(src + start, n, dtype, out + start * element);
    if (first_bad == count) {
      if (size_t bad = FindNonFiniteOfType(out + start * element, n, dtype); bad != n) {
        first_bad = start + bad;
      }
    }
  }
  return first_bad;
}

size_t ConvertToFloatAndFindNonFinite(const void* src, size_t count, DType dtype, float* dst) {
  if (dtype == DType::kFloat32) return CopyAndFindNonFinite(dst, src, count);
  // Widened and checked block by block, the check on the widened block
  // while it is in cache (NaN and inf widen to NaN and inf): never on the
  // input again, which may be memory the sender still writes (a trainer's
  // shared segment), so what is checked is what was written.
  constexpr size_t kBlock = 4096;
  const char* in = static_cast<const char*>(src);
  size_t first_bad = count;
  for (size_t start = 0; start < count; start += kBlock) {
    const size_t n = std::min(kBlock, count - start);
    const char* block = in + 2 * start;
    float* out = dst + start;
    if (!Aligned16(block)) {
      for (size_t i = 0; i < n; ++i) {
        const uint16_t bits = Load16(block + 2 * i);
        out[i] = dtype == DType::kBFloat16 ? BFloat16BitsToFloat(bits) : HalfBitsToFloat(bits);
      }
    } else if (dtype == DType::kBFloat16) {
      WidenBFloat16(reinterpret_cast<const uint16_t*>(block), n, out);
    } else {
      WidenHalf(reinterpret_cast<const uint16_t*>(block), n, out);
    }
    if (first_bad == count) {
      if (size_t bad = FindNonFinite(out, n); bad != n) first_bad = start + bad;
    }
  }
  return first_bad;
}

}  // namespace shardopt
