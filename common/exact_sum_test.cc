// ExactSum: exact whatever the order, correctly rounded once, and its Parts()
// carry the exact value from one ExactSum to another.
#include "common/exact_sum.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace shardopt {
namespace {

TEST(ExactSumTest, ZeroAndBadInputs) {
  ExactSum s;
  EXPECT_TRUE(s.IsZero());
  EXPECT_EQ(s.Rounded(), 0.0);
  EXPECT_TRUE(s.Parts().empty());
  EXPECT_FALSE(s.Add(-1.0));
  EXPECT_FALSE(s.Add(-std::numeric_limits<double>::infinity()));
  EXPECT_TRUE(s.IsZero());
  const std::vector<double> bad = {1.0, -2.0};
  EXPECT_FALSE(s.AddParts(bad));
  EXPECT_TRUE(s.IsZero());  // Nothing of a refused list is added.
  EXPECT_TRUE(s.Add(0.0));
  EXPECT_TRUE(s.Add(-0.0));  // (Its sign bit is not an exponent.)
  const std::vector<double> zeros = {-0.0, 0.0};
  EXPECT_TRUE(s.AddParts(zeros));
  EXPECT_TRUE(s.IsZero());
  EXPECT_EQ(s.Rounded(), 0.0);
  // A NaN with its sign bit set (what x86 computes for inf - inf) is NaN.
  ExactSum nan;
  EXPECT_TRUE(nan.Add(-std::numeric_limits<double>::quiet_NaN()));
  EXPECT_TRUE(std::isnan(nan.Rounded()));
}

TEST(ExactSumTest, InfinityAndNaNStick) {
  const double inf = std::numeric_limits<double>::infinity();
  ExactSum s;
  s.Add(1.0);
  EXPECT_TRUE(s.Add(inf));
  s.Add(2.0);
  EXPECT_EQ(s.Rounded(), inf);
  EXPECT_EQ(s.Parts(), std::vector<double>{inf});
  EXPECT_FALSE(s.IsZero());
  EXPECT_TRUE(s.Add(std::nan("")));
  s.Add(inf);  // NaN wins over +inf, whatever the order.
  EXPECT_TRUE(std::isnan(s.Rounded()));
  ExactSum other;
  other.Add(inf);
  ExactSum nan_first;
  nan_first.Add(std::nan(""));
  other.Add(nan_first);
  EXPECT_TRUE(std::isnan(other.Rounded()));
  EXPECT_EQ(other, s);  // NaN sums compare equal to each other.
  // Parts of a non-finite sum travel and come back the same.
  ExactSum received;
  ASSERT_TRUE(received.AddParts(s.Parts()));
  EXPECT_EQ(received, s);
  ExactSum finite;
  finite.Add(1.0);
  EXPECT_NE(finite, s);
}

TEST(ExactSumTest, IntegersSumExactly) {
  // Integers below 2^53 and their sums in 128 bits are exact references.
  std::mt19937_64 rng(7);
  ExactSum s;
  unsigned __int128 reference = 0;
  for (int i = 0; i < 10000; ++i) {
    const uint64_t v = rng() >> 11;
    reference += v;
    ASSERT_TRUE(s.Add(static_cast<double>(v)));
  }
  // Rounded: the nearest double to the 128-bit reference.
  const long double want = static_cast<long double>(reference);
  EXPECT_EQ(s.Rounded(), static_cast<double>(want));
}

TEST(ExactSumTest, OrderDoesNotMatter) {
  std::mt19937_64 rng(11);
  std::vector<double> values;
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int i = 0; i < 5000; ++i) {
    // Magnitudes from 2^-1000 to 2^900: naive sums lose the small ones.
    values.push_back(std::ldexp(unit(rng), static_cast<int>(rng() % 1900) - 1000));
  }
  ExactSum forward;
  for (double v : values) forward.Add(v);
  std::shuffle(values.begin(), values.end(), rng);
  ExactSum shuffled;
  for (double v : values) shuffled.Add(v);
  EXPECT_EQ(forward, shuffled);
  EXPECT_EQ(forward.Rounded(), shuffled.Rounded());
  // Split into pieces at arbitrary points, each sent as Parts().
  ExactSum combined;
  for (size_t begin = 0; begin < values.size();) {
    const size_t end = std::min(values.size(), begin + 1 + rng() % 700);
    ExactSum piece;
    for (size_t i = begin; i < end; ++i) piece.Add(values[i]);
    ASSERT_TRUE(combined.AddParts(piece.Parts()));
    begin = end;
  }
  EXPECT_EQ(combined, forward);
}

TEST(ExactSumTest, RoundsToNearestEven) {
  // 1 + 2^-53 is a tie: rounds to 1 (even). 1 + 2^-53 + 2^-1000 rounds up.
  ExactSum tie;
  tie.Add(1.0);
  tie.Add(std::ldexp(1.0, -53));
  EXPECT_EQ(tie.Rounded(), 1.0);
  tie.Add(std::ldexp(1.0, -1000));
  EXPECT_EQ(tie.Rounded(), std::nextafter(1.0, 2.0));
  // (1 + 2^-52) + 2^-53: a tie on an odd significand rounds up.
  ExactSum odd;
  odd.Add(std::nextafter(1.0, 2.0));
  odd.Add(std::ldexp(1.0, -53));
  EXPECT_EQ(odd.Rounded(), std::nextafter(std::nextafter(1.0, 2.0), 2.0));
  // Below a tie: down.
  ExactSum below;
  below.Add(1.0);
  below.Add(std::ldexp(1.0, -54));
  EXPECT_EQ(below.Rounded(), 1.0);
}

TEST(ExactSumTest, SubnormalsAndHugeValues) {
  const double tiny = std::numeric_limits<double>::denorm_min();
  ExactSum s;
  for (int i = 0; i < 3; ++i) s.Add(tiny);
  EXPECT_EQ(s.Rounded(), 3 * tiny);
  const double big = std::numeric_limits<double>::max();
  ExactSum huge;
  huge.Add(big);
  EXPECT_EQ(huge.Rounded(), big);
  EXPECT_EQ(huge.Parts(), std::vector<double>{big});
  huge.Add(big);  // Past the largest double: +inf, and one +inf part.
  EXPECT_EQ(huge.Rounded(), std::numeric_limits<double>::infinity());
  EXPECT_EQ(huge.Parts().size(), 1u);
  EXPECT_TRUE(std::isinf(huge.Parts()[0]));
}

TEST(ExactSumTest, PartsAreExactAndDecreasing) {
  ExactSum s;
  s.Add(1.0);
  s.Add(std::ldexp(1.0, -60));
  s.Add(std::ldexp(1.0, -200));
  const std::vector<double> parts = s.Parts();
  ASSERT_GE(parts.size(), 2u);
  for (size_t i = 1; i < parts.size(); ++i) EXPECT_LT(parts[i], parts[i - 1]);
  ExactSum again;
  ASSERT_TRUE(again.AddParts(parts));
  EXPECT_EQ(again, s);
  EXPECT_EQ(s.Rounded(), 1.0);
}

// Many parts at once go through per-exponent bins: the same sum as adding
// them one by one, whatever their mix (subnormals, the largest doubles,
// zeros of either sign, one exponent's bin past 64 bits), and NaN / inf /
// a negative part handled as AddParts says.
TEST(ExactSumTest, ManyPartsAtOnceAreTheOneByOneSum) {
  std::mt19937_64 rng(3);
  std::vector<double> parts;
  for (int i = 0; i < 5000; ++i) {
    const uint64_t bits = rng() & ~(uint64_t{1} << 63);
    double x;
    std::memcpy(&x, &bits, sizeof(x));
    if (std::isfinite(x)) parts.push_back(x);
  }
  parts.push_back(std::numeric_limits<double>::denorm_min());
  parts.push_back(std::numeric_limits<double>::max());
  parts.push_back(0.0);
  parts.push_back(-0.0);
  // 2^12 copies of the largest mantissa at one exponent: 65 bits in its bin.
  for (int i = 0; i < 4096; ++i) parts.push_back(std::nextafter(2.0, 0.0));
  ExactSum one_by_one, at_once;
  for (double p : parts) ASSERT_TRUE(one_by_one.Add(p));
  ASSERT_TRUE(at_once.AddParts(parts));
  EXPECT_TRUE(at_once == one_by_one);
  EXPECT_EQ(at_once.Parts(), one_by_one.Parts());

  std::vector<double> with_inf = parts;
  with_inf[100] = std::numeric_limits<double>::infinity();
  ExactSum inf;
  ASSERT_TRUE(inf.AddParts(with_inf));
  EXPECT_EQ(inf.Rounded(), std::numeric_limits<double>::infinity());
  std::vector<double> with_nan = with_inf;
  with_nan[200] = -std::numeric_limits<double>::quiet_NaN();
  ExactSum nan;
  ASSERT_TRUE(nan.AddParts(with_nan));
  EXPECT_TRUE(std::isnan(nan.Rounded()));

  std::vector<double> with_negative = parts;
  with_negative[300] = -1.0;
  ExactSum untouched;
  EXPECT_FALSE(untouched.AddParts(with_negative));
  EXPECT_TRUE(untouched.IsZero());
}

}  // namespace
}  // namespace shardopt
