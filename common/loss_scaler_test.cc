#include "common/loss_scaler.h"

#include "gtest/gtest.h"

namespace shardopt {
namespace {

TEST(LossScalerTest, HysteresisBackoffAndGrowthAsMegatron) {
  LossScalerOptions options;
  options.initial_scale = 1024;
  options.growth_interval = 3;
  options.hysteresis = 2;
  options.min_scale = 256;
  LossScaler scaler(options);
  scaler.Update(true);  // First overflow: hysteresis 2 -> 1, no backoff yet.
  EXPECT_EQ(scaler.scale(), 1024);
  scaler.Update(true);  // Second: backoff.
  EXPECT_EQ(scaler.scale(), 512);
  scaler.Update(true);  // Hysteresis stays spent: backoff again.
  EXPECT_EQ(scaler.scale(), 256);
  scaler.Update(true);  // Never below min_scale.
  EXPECT_EQ(scaler.scale(), 256);
  scaler.Update(false);
  scaler.Update(false);
  EXPECT_EQ(scaler.scale(), 256);
  scaler.Update(false);  // 3 clean steps in a row: grow, refill hysteresis.
  EXPECT_EQ(scaler.scale(), 512);
  scaler.Update(true);  // Hysteresis again absorbs one overflow.
  EXPECT_EQ(scaler.scale(), 512);
  scaler.Update(false);
  scaler.Update(false);
  scaler.Update(true);             // The overflow reset the growth count...
  EXPECT_EQ(scaler.scale(), 256);  // ...and hysteresis was spent: backoff.
}

TEST(LossScalerTest, Validation) {
  EXPECT_TRUE(LossScalerOptions().Validate().ok());
  LossScalerOptions bad;
  bad.backoff_factor = 1.0;
  EXPECT_EQ(bad.Validate().code(), absl::StatusCode::kInvalidArgument);
  bad = LossScalerOptions();
  bad.growth_interval = 0;
  EXPECT_EQ(bad.Validate().code(), absl::StatusCode::kInvalidArgument);
  bad = LossScalerOptions();
  bad.initial_scale = 1000;  // Not a power of two.
  EXPECT_EQ(bad.Validate().code(), absl::StatusCode::kInvalidArgument);
  bad = LossScalerOptions();
  bad.min_scale = bad.initial_scale * 2;
  EXPECT_EQ(bad.Validate().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardopt
