#include "common/finite.h"

#include <cmath>
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
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::quiet_NaN()};
  for (float b : bad) {
    for (size_t pos : {size_t{0}, size_t{1023}, size_t{1024}, size_t{3001}, size_t{4999}}) {
      std::vector<float> v(5000, -2.0f);
      v[pos] = b;
      if (pos + 7 < v.size()) v[pos + 7] = b;  // A later one must not be reported.
      EXPECT_EQ(FindNonFinite(v.data(), v.size()), pos) << b << " at " << pos;
    }
  }
}

}  // namespace
}  // namespace shardopt
