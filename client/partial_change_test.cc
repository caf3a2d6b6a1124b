// Which partly applied hyperparameter changes the trainer records.
#include "client/partial_change.h"

#include "gtest/gtest.h"

namespace shardopt {
namespace {

TEST(PartialChangeTest, RecordedWhenTheOthersWereNotReached) {
  EXPECT_EQ(ShardsThatTookARecordedChange({absl::OkStatus(), absl::UnavailableError("down")}),
            (std::vector<uint32_t>{0}));
  EXPECT_EQ(ShardsThatTookARecordedChange({absl::DeadlineExceededError("slow"), absl::OkStatus(),
                                           absl::CancelledError("another failed"),
                                           absl::OkStatus(), absl::UnknownError("not asked")}),
            (std::vector<uint32_t>{1, 3}));
}

TEST(PartialChangeTest, NotRecordedWhenNoneTookItOrOneRefusedIt) {
  EXPECT_EQ(ShardsThatTookARecordedChange({absl::UnavailableError("down")}), std::nullopt);
  EXPECT_EQ(ShardsThatTookARecordedChange(
                {absl::OkStatus(), absl::ResourceExhaustedError("1024 scheduled")}),
            std::nullopt);
  EXPECT_EQ(ShardsThatTookARecordedChange(
                {absl::FailedPreconditionError("another kind"), absl::OkStatus()}),
            std::nullopt);
}

}  // namespace
}  // namespace shardopt
