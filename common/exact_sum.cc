#include "common/exact_sum.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

namespace shardopt {
namespace {

constexpr int kMantissaBits = 52;

uint64_t BitsOf(double x) {
  uint64_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
}

}  // namespace

void ExactSum::AddNotFinite(double x) {
  if (std::isnan(not_finite_)) return;
  not_finite_ = x;
}

bool ExactSum::Acceptable(double x) {
  // (NaNs come with either sign bit; -0.0 is zero.)
  return std::isnan(x) || !std::signbit(x) || x == 0;
}

bool ExactSum::Add(double x) {
  if (!Acceptable(x)) return false;
  if (x == 0) return true;
  if (std::isnan(x)) {
    AddNotFinite(std::numeric_limits<double>::quiet_NaN());
    return true;
  }
  if (std::isinf(x)) {
    AddNotFinite(x);
    return true;
  }
  const uint64_t bits = BitsOf(x);
  const int biased = static_cast<int>(bits >> kMantissaBits);  // (Sign is 0.)
  uint64_t mantissa = bits & ((uint64_t{1} << kMantissaBits) - 1);
  // x = mantissa * 2^(shift - 1074): subnormals have shift 0.
  int shift = 0;
  if (biased != 0) {
    mantissa |= uint64_t{1} << kMantissaBits;
    shift = biased - 1;
  }
  if (mantissa != 0) AddShifted(mantissa, shift);
  return true;
}

void ExactSum::AddShifted(uint64_t value, int shift) {
  int limb = shift / 64;
  const int within = shift % 64;
  unsigned __int128 wide = static_cast<unsigned __int128>(value) << within;
  unsigned __int128 carry = 0;
  for (; limb < kLimbs && (wide != 0 || carry != 0); ++limb) {
    const unsigned __int128 sum =
        static_cast<unsigned __int128>(limbs_[limb]) + static_cast<uint64_t>(wide) + carry;
    limbs_[limb] = static_cast<uint64_t>(sum);
    carry = sum >> 64;
    wide >>= 64;
  }
}

void ExactSum::Add(const ExactSum& other) {
  if (other.not_finite_ != 0) AddNotFinite(other.not_finite_);
  unsigned __int128 carry = 0;
  for (int i = 0; i < kLimbs; ++i) {
    const unsigned __int128 sum =
        static_cast<unsigned __int128>(limbs_[i]) + other.limbs_[i] + carry;
    limbs_[i] = static_cast<uint64_t>(sum);
    carry = sum >> 64;
  }
}

bool ExactSum::AddParts(absl::Span<const double> parts) {
  for (double p : parts) {
    if (!Acceptable(p)) return false;
  }
  // (Below this many, zeroing the bins costs more than it saves.)
  constexpr size_t kBinnedFrom = 4096;
  if (parts.size() >= kBinnedFrom) {
    AddBinned(parts);
    return true;
  }
  for (double p : parts) Add(p);
  return true;
}

void ExactSum::AddBinned(absl::Span<const double> parts) {
  // Every finite part is mantissa * 2^(shift - 1074) with shift fixed by its
  // biased exponent: the mantissas of one exponent add up exactly in 128
  // bits (2^75 parts before they could overflow), and each bin is then
  // added once. The same integer as Add one part after another. Four sets
  // of bins, taken in turn, keep neighbouring parts of one exponent from
  // waiting on each other's add.
  constexpr int kExponents = 2047;  // Biased exponents of finite doubles.
  constexpr int kSets = 4;
  std::vector<unsigned __int128> bins(kSets * kExponents);
  uint64_t not_finite_seen = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const uint64_t bits = BitsOf(parts[i]) & ~(uint64_t{1} << 63);  // (-0.0 is zero.)
    const uint64_t biased = bits >> kMantissaBits;
    const uint64_t finite = biased != kExponents;
    not_finite_seen |= finite ^ 1;
    const uint64_t mantissa = (bits & ((uint64_t{1} << kMantissaBits) - 1)) |
                              (static_cast<uint64_t>(biased != 0) << kMantissaBits);
    // (An inf or NaN adds nothing here: its bin index is kept in range and
    // its mantissa masked off.)
    bins[(i % kSets) * kExponents + (finite ? biased : 0)] += finite ? mantissa : 0;
  }
  if (not_finite_seen) {
    for (double x : parts) {
      if (!std::isfinite(x)) {
        AddNotFinite(std::isnan(x) ? std::numeric_limits<double>::quiet_NaN() : x);
      }
    }
  }
  for (int biased = 0; biased < kExponents; ++biased) {
    unsigned __int128 bin = 0;
    uint64_t carries = 0;  // (Four bins of under 2^128 each.)
    for (int set = 0; set < kSets; ++set) {
      const unsigned __int128 next = bin + bins[set * kExponents + biased];
      carries += next < bin;
      bin = next;
    }
    if (bin == 0 && carries == 0) continue;
    const int shift = biased == 0 ? 0 : biased - 1;
    AddShifted(static_cast<uint64_t>(bin), shift);
    if (const uint64_t high = static_cast<uint64_t>(bin >> 64); high != 0) {
      AddShifted(high, shift + 64);
    }
    if (carries != 0) AddShifted(carries, shift + 128);
  }
}

bool ExactSum::IsZero() const { return not_finite_ == 0 && HighestBit() < 0; }

bool ExactSum::operator==(const ExactSum& other) const {
  // (A sum that became NaN or +inf is that value, whatever finite parts it had.)
  if (not_finite_ != 0 || other.not_finite_ != 0) {
    return std::isnan(not_finite_) ? std::isnan(other.not_finite_)
                                   : not_finite_ == other.not_finite_;
  }
  return limbs_ == other.limbs_;
}

int ExactSum::HighestBit() const {
  for (int i = kLimbs - 1; i >= 0; --i) {
    if (limbs_[i] != 0) return i * 64 + 63 - __builtin_clzll(limbs_[i]);
  }
  return -1;
}

uint64_t ExactSum::Bits(int low, int count) const {
  uint64_t out = 0;
  for (int k = 0; k < count; ++k) {
    const int bit = low + k;
    if (bit < 0 || bit >= kLimbs * 64) continue;
    out |= ((limbs_[bit / 64] >> (bit % 64)) & 1) << k;
  }
  return out;
}

bool ExactSum::AnyBelow(int bit) const {
  if (bit <= 0) return false;
  const int full = bit / 64;
  for (int i = 0; i < full; ++i) {
    if (limbs_[i] != 0) return true;
  }
  const int rest = bit % 64;
  return rest != 0 && (limbs_[full] & ((uint64_t{1} << rest) - 1)) != 0;
}

double ExactSum::Rounded() const {
  if (not_finite_ != 0) return not_finite_;
  const int high = HighestBit();
  if (high < 0) return 0.0;
  // The 53 bits from the highest down, then round to nearest even on the rest.
  const int low = high - kMantissaBits;
  if (low <= 0) {
    // Every bit fits in the significand: exact.
    return std::ldexp(static_cast<double>(Bits(0, high + 1)), -kFractionBits);
  }
  uint64_t mantissa = Bits(low, kMantissaBits + 1);
  const bool half = Bits(low - 1, 1) != 0;
  const bool sticky = AnyBelow(low - 1);
  if (half && (sticky || (mantissa & 1) != 0)) ++mantissa;  // (2^53 still converts exactly.)
  const double value = std::ldexp(static_cast<double>(mantissa), low - kFractionBits);
  return std::isfinite(value) ? value : std::numeric_limits<double>::infinity();
}

std::vector<double> ExactSum::Parts() const {
  if (not_finite_ != 0) return {not_finite_};
  std::vector<double> parts;
  const int high = HighestBit();
  if (high < 0) return parts;
  if (high - kFractionBits >= 1024) return {std::numeric_limits<double>::infinity()};
  for (int top = high; top >= 0; top -= kMantissaBits + 1) {
    const int low = std::max(0, top - kMantissaBits);
    const uint64_t chunk = Bits(low, top - low + 1);
    if (chunk != 0) parts.push_back(std::ldexp(static_cast<double>(chunk), low - kFractionBits));
  }
  return parts;
}

}  // namespace shardopt
