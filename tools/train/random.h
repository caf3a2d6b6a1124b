// SplitMix64: a tiny seeded generator. Every trainer must derive the same
// data and batches from the same seed; <random>'s distributions are not
// specified bit-for-bit (they differ between standard libraries), so the
// integer stream here is fixed by this code and the real-valued draws only
// by it and libm.
#ifndef SHARDOPT_TOOLS_TRAIN_RANDOM_H_
#define SHARDOPT_TOOLS_TRAIN_RANDOM_H_

#include <cmath>
#include <cstdint>

namespace shardopt::train {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t Next() {
    uint64_t x = (state_ += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }

  // Uniform in [0, 1), 53 random bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }

  // Uniform in [0, n); the modulo bias is negligible for the small n used here.
  uint64_t Below(uint64_t n) { return Next() % n; }

  // Standard normal (Box-Muller; the second value is dropped for simplicity).
  double Normal() {
    const double u1 = 1.0 - Uniform();  // (0, 1]: log stays finite.
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t state_;
};

}  // namespace shardopt::train

#endif  // SHARDOPT_TOOLS_TRAIN_RANDOM_H_
