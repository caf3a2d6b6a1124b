#include "common/finite.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace shardopt {
namespace {

TEST(FindNonFiniteTest, AllFiniteReturnsSize) {
  std::vector<float> v(5000, 1.5f);
  v[17] = std::numeric_limits<float>::max();
  v[18] = -std::numeric_limits<float>::max();
  v[19] = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(FindNonFinite(v.data(), v.size()), v.size());
  EXPECT_EQ(FindNonFinite(v.data(), 0), 0u);
}

TEST(FindNonFiniteTest, FindsFirstNanOrInfAnywhere) {
  const float bad[] = {
      std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
      -std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::quiet_NaN()};
  for (float b : bad) {
    for (size_t pos : {size_t{0}, size_t{1023}, size_t{1024}, size_t{3001}, size_t{4999}}) {
      std::vector<float> v(5000, -2.0f);
      v[pos] = b;
      if (pos + 7 < v.size()) v[pos + 7] = b;  // A later one must not be reported.
      EXPECT_EQ(FindNonFinite(v.data(), v.size()), pos) << b << " at " << pos;
    }
  }
}

TEST(FindNonFiniteOnTwoThreadsTest, AnswersAsTheOneThreadScanOnBothSidesOfTheSplit) {
  const size_t n = kParallelScanElements + 4097;  // Split unevenly in two.
  std::vector<float> v(n, 0.5f);
  EXPECT_EQ(FindNonFiniteOnTwoThreads(v.data(), n), n);
  const size_t half = n / 2;
  for (size_t pos : {size_t{0}, half - 1, half, half + 1, n - 1}) {
    std::fill(v.begin(), v.end(), 0.5f);
    v[pos] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_EQ(FindNonFiniteOnTwoThreads(v.data(), n), pos) << pos;
    // The first one is reported when both halves hold one.
    if (pos < half) {
      v[n - 2] = std::numeric_limits<float>::infinity();
      EXPECT_EQ(FindNonFiniteOnTwoThreads(v.data(), n), pos) << pos;
    }
  }
  // Below the split size: one scan, the same answer.
  std::vector<float> small(1000, 1.0f);
  small[999] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(FindNonFiniteOnTwoThreads(small.data(), small.size()), 999u);
}

TEST(CopyAndFindNonFiniteTest, CopiesEverythingAndFindsTheFirstNonFinite) {
  std::vector<float> src(5000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = 0.25f * static_cast<float>(i) - 7.0f;
  // Unaligned source, as a payload inside a protobuf string may be.
  std::vector<char> raw(src.size() * sizeof(float) + 1);
  std::memcpy(raw.data() + 1, src.data(), src.size() * sizeof(float));
  std::vector<float> dst(src.size(), -1.0f);
  EXPECT_EQ(CopyAndFindNonFinite(dst.data(), raw.data() + 1, src.size()), src.size());
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), src.size() * sizeof(float)), 0);

  src[3333] = std::numeric_limits<float>::infinity();
  std::memcpy(raw.data() + 1, src.data(), src.size() * sizeof(float));
  std::fill(dst.begin(), dst.end(), -1.0f);
  EXPECT_EQ(CopyAndFindNonFinite(dst.data(), raw.data() + 1, src.size()), 3333u);
  // Everything is copied, also past the first infinity.
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), src.size() * sizeof(float)), 0);
  EXPECT_EQ(CopyAndFindNonFinite(dst.data(), raw.data() + 1, 0), 0u);
}

// Bit patterns at the edges of the non-finite classes, signs included.
constexpr uint32_t kNonFiniteBits[] = {0x7f800000u, 0xff800000u, 0x7f800001u, 0xff800001u,
                                       0x7fc00000u, 0xffffffffu, 0x7fbfffffu, 0x7fffffffu};
constexpr uint32_t kFiniteEdgeBits[] = {0x7f7fffffu, 0xff7fffffu, 0x00000001u, 0x80000000u,
                                        0x00800000u, 0x7f000000u, 0x807fffffu, 0x3f800000u};

float FromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Every length around the 16-float rounds and the 1024-float blocks, every
// position in it, and every class: the vector rounds, the scalar tail and
// the block boundaries all report the first one and copy every bit.
TEST(CopyAndFindNonFiniteTest, EveryLengthPositionAndClass) {
  for (size_t n : {size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{33}, size_t{63},
                   size_t{1023}, size_t{1024}, size_t{1025}, size_t{2063}}) {
    std::vector<float> clean(n);
    for (size_t i = 0; i < n; ++i) {
      clean[i] = FromBits(kFiniteEdgeBits[i % (sizeof(kFiniteEdgeBits) / sizeof(uint32_t))]);
    }
    EXPECT_EQ(FindNonFinite(clean.data(), n), n) << n;
    for (uint32_t bad : kNonFiniteBits) {
      for (size_t pos = 0; pos < n; pos += (n > 80 ? 13 : 1)) {
        std::vector<char> raw(n * sizeof(float) + 3);
        std::vector<float> src = clean;
        src[pos] = FromBits(bad);
        if (pos + 1 < n) src[n - 1] = FromBits(bad);  // A later one is not reported.
        std::memcpy(raw.data() + 3, src.data(), n * sizeof(float));
        std::vector<float> dst(n, 9.0f);
        ASSERT_EQ(CopyAndFindNonFinite(dst.data(), raw.data() + 3, n), pos)
            << std::hex << bad << std::dec << " at " << pos << " of " << n;
        ASSERT_EQ(std::memcmp(dst.data(), src.data(), n * sizeof(float)), 0) << pos << " of " << n;
        ASSERT_EQ(FindNonFinite(src.data(), n), pos)
            << std::hex << bad << std::dec << " at " << pos << " of " << n;
      }
    }
  }
}

}  // namespace
}  // namespace shardopt
