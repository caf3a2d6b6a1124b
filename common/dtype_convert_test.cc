#include "common/dtype_convert.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "common/finite.h"
#include "common/float_bits.h"
#include "gtest/gtest.h"

namespace shardopt {
namespace {

float F(uint32_t bits) { return BitsToFloat(bits); }

uint32_t B(float f) { return FloatToBits(f); }

TEST(BFloat16Test, ExactBitPatterns) {
  struct Case {
    uint32_t in;
    uint16_t out;
  };
  const Case cases[] = {
      {0x3f800000, 0x3f80},  // 1
      {0x3f808000, 0x3f80},  // tie, lower is even: down
      {0x3f818000, 0x3f82},  // tie, upper is even: up
      {0x3f808001, 0x3f81},  // just above the tie: up
      {0x3f807fff, 0x3f80},  // just below the tie: down
      {0x80000000, 0x8000},  // -0
      {0x00000001, 0x0000},  // smallest fp32 subnormal rounds to +0
      {0x00018000, 0x0002},  // subnormal tie to even (up)
      {0x00008000, 0x0000},  // subnormal tie to even (down)
      {0x7f7fffff, 0x7f80},  // fp32 max rounds past bf16 max: inf
      {0x7f7f7fff, 0x7f7f},  // bf16 max
      {0x7f800000, 0x7f80},  // inf
      {0xff800000, 0xff80},  // -inf
      {0x7fc00000, 0xffff},  // NaN: PyTorch's pattern
      {0xffc00001, 0xffff},  // -NaN with payload
      {0x7f800001, 0xffff},  // signalling NaN
  };
  for (const Case& c : cases) {
    EXPECT_EQ(FloatToBFloat16Bits(F(c.in)), c.out) << std::hex << c.in;
  }
  EXPECT_EQ(B(BFloat16BitsToFloat(0x3f82)), 0x3f820000u);
  EXPECT_EQ(B(BFloat16BitsToFloat(0x0001)), 0x00010000u);  // subnormal, exact
  EXPECT_TRUE(std::isnan(BFloat16BitsToFloat(0xffff)));
  EXPECT_EQ(BFloat16BitsToFloat(0xff80), -std::numeric_limits<float>::infinity());
}

TEST(HalfTest, ExactBitPatterns) {
  struct Case {
    float in;
    uint16_t out;
  };
  const Case cases[] = {
      {1.0f, 0x3c00},
      {-2.0f, 0xc000},
      {65504.0f, 0x7bff},                      // max
      {65519.0f, 0x7bff},                      // below the tie with 65536: down
      {65520.0f, 0x7c00},                      // tie, 0x7bff is odd: up to inf
      {1e10f, 0x7c00},                         // overflow
      {std::ldexp(1.0f, -14), 0x0400},         // smallest normal
      {std::ldexp(1.0f, -24), 0x0001},         // smallest subnormal
      {std::ldexp(1.0f, -25), 0x0000},         // tie with 0, 0 is even: down
      {std::ldexp(3.0f, -26), 0x0001},         // above the tie: up
      {std::ldexp(3.0f, -25), 0x0002},         // 1.5 units, tie: to even 2
      {std::ldexp(5.0f, -25), 0x0002},         // 2.5 units, tie: to even 2
      {std::ldexp(1023.5f, -24), 0x0400},      // rounds up into the normals
      {1.0f + std::ldexp(1.0f, -11), 0x3c00},  // tie, even down
      {1.0f + std::ldexp(3.0f, -11), 0x3c02},  // tie, even up
      {-0.0f, 0x8000},
      {std::numeric_limits<float>::infinity(), 0x7c00},
      {-std::numeric_limits<float>::infinity(), 0xfc00},
      {std::numeric_limits<float>::quiet_NaN(), 0x7e00},
      {-std::numeric_limits<float>::quiet_NaN(), 0xfe00},
      {std::numeric_limits<float>::denorm_min(), 0x0000},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(FloatToHalfBits(c.in), c.out) << c.in;
  }
  EXPECT_EQ(HalfBitsToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfBitsToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfBitsToFloat(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(HalfBitsToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(B(HalfBitsToFloat(0x8000)), 0x80000000u);
  EXPECT_EQ(HalfBitsToFloat(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(HalfBitsToFloat(0x7e00)));
  // A signalling fp16 NaN widens to a quiet one, payload kept (torch 1.13's
  // .float() gives these bits).
  EXPECT_EQ(B(HalfBitsToFloat(0x7c01)), 0x7fc02000u);
  EXPECT_EQ(B(HalfBitsToFloat(0xfd00)), 0xffe00000u);
}

TEST(DTypeConvertTest, EveryHalfAndBFloat16RoundTripsExactly) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t b = static_cast<uint16_t>(bits);
    const float h = HalfBitsToFloat(b);
    if (!std::isnan(h)) ASSERT_EQ(FloatToHalfBits(h), b) << std::hex << bits;
    const float bf = BFloat16BitsToFloat(b);
    if (!std::isnan(bf)) ASSERT_EQ(FloatToBFloat16Bits(bf), b) << std::hex << bits;
  }
}

TEST(DTypeConvertTest, BulkConversionsAndTheNonFiniteScan) {
  std::vector<float> src = {1.0f, -3.5f, 65504.0f, 1e-6f, 0.0f};
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    std::vector<char> wire(src.size() * DTypeSize(dtype) + 1);
    ConvertFromFloat(src.data(), src.size(), dtype, wire.data() + 1);  // misaligned
    std::vector<float> back(src.size());
    EXPECT_EQ(ConvertToFloatAndFindNonFinite(wire.data() + 1, src.size(), dtype, back.data()),
              src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      const float expected = dtype == DType::kFloat32 ? src[i]
                             : dtype == DType::kBFloat16
                                 ? BFloat16BitsToFloat(FloatToBFloat16Bits(src[i]))
                                 : HalfBitsToFloat(FloatToHalfBits(src[i]));
      EXPECT_EQ(back[i], expected) << DTypeName(dtype) << " " << i;
    }
  }
  // 1e5 overflows fp16: the converted value is inf and is found.
  std::vector<float> big = {1.0f, 1e5f};
  std::vector<uint16_t> half(2);
  ConvertFromFloat(big.data(), 2, DType::kFloat16, half.data());
  std::vector<float> back(2);
  EXPECT_EQ(ConvertToFloatAndFindNonFinite(half.data(), 2, DType::kFloat16, back.data()), 1u);
  EXPECT_EQ(FindNonFiniteOfType(half.data(), 2, DType::kFloat16), 1u);
  EXPECT_EQ(FindNonFiniteOfType(half.data(), 1, DType::kFloat16), 1u);
  // Converted and checked block by block: the first bad index is found in a
  // later block, past a second one, and every element is still written.
  std::vector<float> many(10000, 2.0f);
  many[9000] = 1e5f;  // overflows fp16 only
  many[9500] = std::numeric_limits<float>::infinity();
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    std::vector<char> out(many.size() * DTypeSize(dtype), 0);
    const size_t expected = dtype == DType::kFloat16 ? 9000u : 9500u;
    EXPECT_EQ(ConvertFromFloatAndFindNonFinite(many.data(), many.size(), dtype, out.data()),
              expected)
        << DTypeName(dtype);
    std::vector<float> back(many.size());
    // Widening finds the first non-finite value in a later block as well.
    EXPECT_EQ(ConvertToFloatAndFindNonFinite(out.data(), many.size(), dtype, back.data()),
              expected);
    EXPECT_EQ(back.front(), 2.0f);
    EXPECT_EQ(back.back(), 2.0f) << DTypeName(dtype);
  }
  std::vector<uint16_t> bf = {0x3f80, 0x7fc0, 0xff80};
  EXPECT_EQ(FindNonFiniteOfType(bf.data(), 3, DType::kBFloat16), 1u);
  EXPECT_EQ(FindNonFiniteOfType(big.data(), 2, DType::kFloat32), 2u);
}

// A 16-bit source that another process writes meanwhile (a trainer's
// shared segment): the answer is about what was written to dst, never about
// a second read of the source. One element flips between NaN and 1 while
// widening runs over and over; every answer must match dst.
TEST(DTypeConvertTest, ReportsTheNonFiniteItWroteWhileTheSourceChanges) {
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    const uint16_t one = dtype == DType::kBFloat16 ? 0x3f80 : 0x3c00;
    const uint16_t nan = dtype == DType::kBFloat16 ? 0x7fc0 : 0x7e00;
    constexpr size_t kCount = 3 * 4096 + 5;
    constexpr size_t kFlipping = 4096 + 100;
    std::vector<uint16_t> src(kCount, one);
    std::vector<float> dst(kCount);
    std::atomic<bool> stop{false};
    // (Relaxed atomic stores; the conversion's plain loads of the flipping
    // element are the race under test.)
    std::thread writer([&] {
      for (uint32_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
        __atomic_store_n(&src[kFlipping], (i & 1) ? nan : one, __ATOMIC_RELAXED);
      }
    });
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(150);
    int runs = 0, saw_nan = 0;
    bool consistent = true;
    while ((runs < 2000 || std::chrono::steady_clock::now() < end) && runs < 200000) {
      const size_t bad = ConvertToFloatAndFindNonFinite(src.data(), kCount, dtype, dst.data());
      const size_t written_bad = FindNonFinite(dst.data(), kCount);
      ++runs;
      saw_nan += written_bad != kCount;
      if (bad != written_bad) {
        consistent = false;
        break;
      }
    }
    stop = true;
    writer.join();
    EXPECT_TRUE(consistent) << DTypeName(dtype) << ": run " << runs
                            << " answered other than what it wrote";
    EXPECT_GT(saw_nan, 0) << DTypeName(dtype) << ": the flipping NaN was never read in " << runs
                          << " runs";
  }
}

// The bulk (vectorised) loops against the scalar functions, bit for bit: every
// 16-bit value widened, and narrowing of every sign/exponent/high-mantissa
// combination with low bits at each rounding boundary of both formats (ties,
// just below and above, the sticky bits), at an odd count so the vector
// loops' remainders run too.
TEST(DTypeConvertTest, BulkLoopsMatchTheScalarConversionsBitForBit) {
  std::vector<uint16_t> every16(0x10000 + 3);
  for (size_t i = 0; i < every16.size(); ++i) every16[i] = static_cast<uint16_t>(i * 40503u);
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    std::vector<float> wide(every16.size());
    ConvertToFloatAndFindNonFinite(every16.data(), every16.size(), dtype, wide.data());
    for (size_t i = 0; i < every16.size(); ++i) {
      const float expected =
          dtype == DType::kBFloat16 ? BFloat16BitsToFloat(every16[i]) : HalfBitsToFloat(every16[i]);
      ASSERT_EQ(B(wide[i]), B(expected)) << DTypeName(dtype) << std::hex << " " << every16[i];
    }
  }
  const uint32_t low_bits[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x17ff, 0x1800,
                               0x1fff, 0x2000, 0x2001, 0x3000, 0x7fff, 0x8000, 0x8001,
                               0x9000, 0xbfff, 0xc000, 0xefff, 0xf000, 0xffff};
  std::vector<float> src;
  for (uint32_t high = 0; high <= 0xffff; ++high) {
    for (uint32_t low : low_bits) src.push_back(F((high << 16) | low));
  }
  src.resize(src.size() - 5);
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    std::vector<uint16_t> narrow(src.size());
    ConvertFromFloat(src.data(), src.size(), dtype, narrow.data());
    for (size_t i = 0; i < src.size(); ++i) {
      const uint16_t expected =
          dtype == DType::kBFloat16 ? FloatToBFloat16Bits(src[i]) : FloatToHalfBits(src[i]);
      ASSERT_EQ(narrow[i], expected) << DTypeName(dtype) << std::hex << " " << B(src[i]);
    }
  }
}

}  // namespace
}  // namespace shardopt
