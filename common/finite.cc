#include "common/finite.h"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace shardopt {

size_t FindNonFinite(const float* data, size_t n) {
  constexpr size_t kBlock = 1024;
  for (size_t start = 0; start < n; start += kBlock) {
    const size_t end = start + kBlock < n ? start + kBlock : n;
    // A float is non-finite exactly when its exponent bits are all ones.
    uint32_t any_bad = 0;
    for (size_t i = start; i < end; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &data[i], sizeof(bits));
      any_bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
    }
    if (any_bad) {
      for (size_t i = start; i < end; ++i) {
        if (!std::isfinite(data[i])) return i;
      }
    }
  }
  return n;
}

}  // namespace shardopt
