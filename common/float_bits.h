// The bit pattern of an fp32 value and back (a memcpy, so no aliasing UB).
#ifndef SHARDOPT_COMMON_FLOAT_BITS_H_
#define SHARDOPT_COMMON_FLOAT_BITS_H_

#include <cstdint>
#include <cstring>

namespace shardopt {

inline uint32_t FloatToBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

inline float BitsToFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_FLOAT_BITS_H_
