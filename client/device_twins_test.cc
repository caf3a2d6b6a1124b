#include "client/device_twins.h"

#include <vector>

#include "gtest/gtest.h"

namespace shardopt {
namespace {

TEST(DeviceTwinsTest, TwinsOnlyInsideTheMirrorsAndOnlyDuringAStep) {
  std::vector<float> host_grads(100), device_grads(100), host_params(100), device_params(100);
  DeviceTwins twins;
  EXPECT_EQ(twins.GradientTwin(host_grads.data(), 40), nullptr);  // No step yet.
  twins.Set(host_grads.data(), device_grads.data(), host_params.data(), device_params.data(), 100);
  EXPECT_EQ(twins.GradientTwin(host_grads.data() + 10, 40 * sizeof(float)),
            device_grads.data() + 10);
  EXPECT_EQ(twins.ParameterTwin(host_params.data() + 60, 40 * sizeof(float)),
            device_params.data() + 60);
  // Past the end, before the start, another buffer: none.
  EXPECT_EQ(twins.GradientTwin(host_grads.data() + 61, 40 * sizeof(float)), nullptr);
  EXPECT_EQ(twins.ParameterTwin(host_params.data() - 1, sizeof(float)), nullptr);
  std::vector<float> other(10);
  EXPECT_EQ(twins.GradientTwin(other.data(), sizeof(float)), nullptr);
  EXPECT_EQ(twins.GradientTwin(host_params.data(), sizeof(float)), nullptr);
  twins.Clear();
  EXPECT_EQ(twins.GradientTwin(host_grads.data(), sizeof(float)), nullptr);
  EXPECT_EQ(twins.ParameterTwin(host_params.data(), sizeof(float)), nullptr);
}

TEST(DeviceTwinsTest, TheLastPullOfARangeDecidesWhereItsNewestValuesAre) {
  std::vector<float> host_grads(100), device_grads(100), host_params(100), device_params(100);
  DeviceTwins twins;
  twins.Set(host_grads.data(), device_grads.data(), host_params.data(), device_params.data(), 100);
  // Shard ranges [0, 50) and [50, 100): the first written on the device.
  twins.Unwritten(host_params.data(), 50 * sizeof(float));
  twins.Written(host_params.data(), 50 * sizeof(float));
  twins.Unwritten(host_params.data() + 50, 50 * sizeof(float));
  // A second pull of [0, 50) (another round) that lands in the mirror.
  twins.Unwritten(host_params.data(), 50 * sizeof(float));
  std::vector<FlatRange> written = twins.Clear();
  EXPECT_TRUE(written.empty());
  twins.Set(host_grads.data(), device_grads.data(), host_params.data(), device_params.data(), 100);
  twins.Unwritten(host_params.data() + 50, 50 * sizeof(float));
  twins.Written(host_params.data() + 50, 50 * sizeof(float));
  written = twins.Clear();
  ASSERT_EQ(written.size(), 1u);
  EXPECT_EQ(written[0].begin, 50u);
  EXPECT_EQ(written[0].end, 100u);
}

}  // namespace
}  // namespace shardopt
