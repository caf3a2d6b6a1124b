// ExactSum: the exact sum of non-negative finite doubles, independent of the
// order they are added in, rounded to a double only when asked.
//
// Why: LAMB's per-tensor norms must come out the same whether one shard
// holds a tensor or several shards each hold a piece of it (issue 16). Sums
// of doubles depend on how they are grouped; an exact sum does not. Each
// shard adds its pieces' block sums here, sends Parts() (a few doubles whose
// exact sum is its partial), and whoever combines them adds those parts into
// another ExactSum: the result, rounded once, is the same bits as one shard
// adding every block itself.
//
// Representation: a fixed-point integer in 64-bit limbs whose lowest bit is
// worth 2^-1074 (the smallest double), with 64 bits of headroom above the
// largest double so that any realistic number of additions cannot wrap.
// Add() is a shift and a carry into two limbs.
#ifndef SHARDOPT_COMMON_EXACT_SUM_H_
#define SHARDOPT_COMMON_EXACT_SUM_H_

#include <array>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace shardopt {

class ExactSum {
 public:
  // Adds `x` exactly; false (nothing added) when x is negative. A NaN or
  // +inf makes the sum NaN or +inf from then on (NaN wins), as a double sum
  // would: a diverged tensor's norms stay visibly diverged.
  bool Add(double x);
  void Add(const ExactSum& other);
  // Adds every part (as Add); false, with nothing added, when one is bad.
  // Many parts at once (LAMB's block sums on the GPU backend: two per 64
  // elements) are summed per exponent first, about an integer add each.
  bool AddParts(absl::Span<const double> parts);

  // The sum rounded to the nearest double (ties to even); +inf when it is
  // beyond the largest double.
  double Rounded() const;
  // Non-negative doubles, largest first, each holding the next 53 bits of
  // the sum (at most 42): their exact sum is this sum. Empty for zero; a
  // single +inf when the sum is beyond the largest double, a single NaN or
  // +inf when one was added.
  std::vector<double> Parts() const;

  bool IsZero() const;
  bool operator==(const ExactSum& other) const;
  bool operator!=(const ExactSum& other) const { return !(*this == other); }

 private:
  // 1074 bits below 1, 1024 above, 64 of headroom: 2162 bits.
  static constexpr int kLimbs = 34;
  static constexpr int kFractionBits = 1074;
  // Index of the highest set bit, or -1 for zero.
  int HighestBit() const;
  // Bits [low, low + count) of the integer (count <= 64; bits below 0 are 0).
  uint64_t Bits(int low, int count) const;
  // Whether any bit below `bit` is set.
  bool AnyBelow(int bit) const;
  // Adds `value` << `shift` (bits) into the limbs, with carries.
  void AddShifted(uint64_t value, int shift);
  void AddNotFinite(double x);
  // AddParts of acceptable parts, through one integer bin per exponent.
  void AddBinned(absl::Span<const double> parts);
  // Not negative: +0, -0, positive, +inf or NaN.
  static bool Acceptable(double x);

  std::array<uint64_t, kLimbs> limbs_{};
  double not_finite_ = 0;  // 0, or the +inf or NaN the sum has become.
};

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_EXACT_SUM_H_
