#include "common/finite.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace shardopt {

namespace {

constexpr size_t kBlock = 1024;
// A float is non-finite exactly when its exponent bits are all ones, that is
// when its magnitude's bits exceed the largest finite float's.
constexpr uint32_t kMagnitudeMask = 0x7fffffffu;
constexpr uint32_t kLargestFinite = 0x7f7fffffu;

size_t FirstNonFiniteInBlock(const float* data, size_t start, size_t end) {
  for (size_t i = start; i < end; ++i) {
    if (!std::isfinite(data[i])) return i;
  }
  return end;
}

// Whether any of the `count` floats at `in` (any alignment) is NaN or inf;
// with kCopy, also copies them to `out`. Spelled out in SSE2 (every x86-64
// has it) because GCC's vectorisation of the scalar loop ran at half a
// memcpy's speed, and this check sits in every push's one copy.
template <bool kCopy>
bool HasNonFinite(const char* in, char* out, size_t count) {
  size_t i = 0;
  uint32_t any_bad = 0;
#if defined(__SSE2__)
  const __m128i magnitude_mask = _mm_set1_epi32(static_cast<int>(kMagnitudeMask));
  const __m128i largest_finite = _mm_set1_epi32(static_cast<int>(kLargestFinite));
  __m128i bad = _mm_setzero_si128();
  // Four vectors per round keep four loads in flight. The magnitudes are
  // non-negative as int32, so the signed compare orders them right.
  for (; i + 16 <= count; i += 16) {
    const char* from = in + i * sizeof(float);
    const __m128i v0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from));
    const __m128i v1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + 16));
    const __m128i v2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + 32));
    const __m128i v3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + 48));
    if (kCopy) {
      char* to = out + i * sizeof(float);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(to), v0);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(to + 16), v1);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(to + 32), v2);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(to + 48), v3);
    }
    bad = _mm_or_si128(bad, _mm_cmpgt_epi32(_mm_and_si128(v0, magnitude_mask), largest_finite));
    bad = _mm_or_si128(bad, _mm_cmpgt_epi32(_mm_and_si128(v1, magnitude_mask), largest_finite));
    bad = _mm_or_si128(bad, _mm_cmpgt_epi32(_mm_and_si128(v2, magnitude_mask), largest_finite));
    bad = _mm_or_si128(bad, _mm_cmpgt_epi32(_mm_and_si128(v3, magnitude_mask), largest_finite));
  }
  any_bad = static_cast<uint32_t>(_mm_movemask_epi8(bad));
#endif
  for (; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, in + i * sizeof(float), sizeof(bits));
    if (kCopy) std::memcpy(out + i * sizeof(float), &bits, sizeof(bits));
    any_bad |= static_cast<uint32_t>((bits & kMagnitudeMask) > kLargestFinite);
  }
  return any_bad != 0;
}

}  // namespace

size_t FindNonFinite(const float* data, size_t n) {
  const char* bytes = reinterpret_cast<const char*>(data);
  for (size_t start = 0; start < n; start += kBlock) {
    const size_t end = start + kBlock < n ? start + kBlock : n;
    if (HasNonFinite<false>(bytes + start * sizeof(float), nullptr, end - start)) {
      return FirstNonFiniteInBlock(data, start, end);
    }
  }
  return n;
}

size_t CopyAndFindNonFinite(float* dst, const void* src, size_t n) {
  const char* bytes = static_cast<const char*>(src);
  char* out = reinterpret_cast<char*>(dst);
  size_t first_bad = n;
  for (size_t start = 0; start < n; start += kBlock) {
    const size_t end = start + kBlock < n ? start + kBlock : n;
    const bool bad =
        HasNonFinite<true>(bytes + start * sizeof(float), out + start * sizeof(float), end - start);
    if (bad && first_bad == n) first_bad = FirstNonFiniteInBlock(dst, start, end);
  }
  return first_bad;
}

size_t FindNonFiniteOnTwoThreads(const float* data, size_t n) {
  if (n < kParallelScanElements) return FindNonFinite(data, n);
  const size_t half = n / 2;
  size_t first_bad = half;
  std::thread first([&] { first_bad = FindNonFinite(data, half); });
  const size_t second_bad = half + FindNonFinite(data + half, n - half);
  first.join();
  return first_bad != half ? first_bad : second_bad;
}

}  // namespace shardopt
