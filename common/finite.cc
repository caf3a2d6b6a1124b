#include "common/finite.h"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace shardopt {

namespace {

constexpr size_t kBlock = 1024;
constexpr uint32_t kExponentMask = 0x7f800000u;

// A float is non-finite exactly when its exponent bits are all ones.
size_t FirstNonFiniteInBlock(const float* data, size_t start, size_t end) {
  for (size_t i = start; i < end; ++i) {
    if (!std::isfinite(data[i])) return i;
  }
  return end;
}

}  // namespace

size_t FindNonFinite(const float* data, size_t n) {
  for (size_t start = 0; start < n; start += kBlock) {
    const size_t end = start + kBlock < n ? start + kBlock : n;
    uint32_t any_bad = 0;
    for (size_t i = start; i < end; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &data[i], sizeof(bits));
      any_bad |= static_cast<uint32_t>((bits & kExponentMask) == kExponentMask);
    }
    if (any_bad) return FirstNonFiniteInBlock(data, start, end);
  }
  return n;
}

size_t CopyAndFindNonFinite(float* dst, const void* src, size_t n) {
  const char* bytes = static_cast<const char*>(src);
  uint32_t* __restrict out = reinterpret_cast<uint32_t*>(dst);
  size_t first_bad = n;
  for (size_t start = 0; start < n; start += kBlock) {
    const size_t end = start + kBlock < n ? start + kBlock : n;
    uint32_t any_bad = 0;
    for (size_t i = start; i < end; ++i) {
      uint32_t bits;
      std::memcpy(&bits, bytes + i * sizeof(float), sizeof(bits));
      out[i] = bits;
      any_bad |= static_cast<uint32_t>((bits & kExponentMask) == kExponentMask);
    }
    if (any_bad && first_bad == n) first_bad = FirstNonFiniteInBlock(dst, start, end);
  }
  return first_bad;
}

}  // namespace shardopt
