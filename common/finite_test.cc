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

}  // namespace
}  // namespace shardopt
