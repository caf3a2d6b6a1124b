#include "client/chunk_digest.h"

#include <cstring>

namespace shardopt {
namespace {

constexpr uint64_t kOdd = 0xff51afd7ed558ccdULL;  // MurmurHash3's fmix64 constant.

// Both steps are bijections of the state for a fixed word (an odd multiplier
// mod 2^64, a right xorshift), so two different words from one state always
// leave different states. The multiply carries a difference upwards only;
// the shift brings high bits back down, so that differences in the top bits
// of two words (sign flips) do not cancel.
inline uint64_t Mix(uint64_t state, uint64_t word) {
  state = (state ^ word) * kOdd;
  return state ^ (state >> 32);
}

}  // namespace

uint64_t DigestBytes(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  uint64_t lane[4] = {0xcbf29ce484222325ULL, 0x84222325cbf29ce4ULL, 0x9ce484222325cbf2ULL,
                      0x2325cbf29ce48422ULL};
  size_t i = 0;
  for (; i + 32 <= bytes; i += 32) {
    uint64_t w[4];
    std::memcpy(w, p + i, sizeof(w));  // (Any alignment.)
    for (int k = 0; k < 4; ++k) lane[k] = Mix(lane[k], w[k]);
  }
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, sizeof(w));
    lane[0] = Mix(lane[0], w);
  }
  if (i < bytes) {
    uint64_t w = 0;
    std::memcpy(&w, p + i, bytes - i);
    lane[1] = Mix(lane[1], w);
  }
  // The length too, so that chunks that differ only in trailing zeros differ.
  uint64_t digest = Mix(0x9e3779b97f4a7c15ULL, bytes);
  for (int k = 0; k < 4; ++k) digest = Mix(digest ^ (digest >> 29), lane[k]);
  return digest;
}

}  // namespace shardopt
