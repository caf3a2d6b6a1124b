#include "client/retry.h"

#include "gtest/gtest.h"

namespace shardopt {
namespace {

RetryPolicy FastPolicy() {
  return RetryPolicy{absl::Seconds(5), absl::Milliseconds(1), absl::Milliseconds(4)};
}

TEST(RetryTest, RetriesRetryableFailuresUntilSuccess) {
  int calls = 0;
  absl::Status s = RetryWithBackoff(FastPolicy(), [&] {
    ++calls;
    return calls < 4 ? absl::UnavailableError("down") : absl::OkStatus();
  });
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(calls, 4);
}

TEST(RetryTest, DoesNotRetryPermanentErrors) {
  int calls = 0;
  absl::Status s = RetryWithBackoff(FastPolicy(), [&] {
    ++calls;
    return absl::InvalidArgumentError("bad size");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(calls, 1);
}

TEST(RetryTest, GivesUpWhenTheBudgetIsSpentWithTheLastStatus) {
  int calls = 0;
  RetryPolicy policy{absl::Milliseconds(30), absl::Milliseconds(5), absl::Milliseconds(5)};
  absl::Status s = RetryWithBackoff(policy, [&] {
    ++calls;
    return absl::AbortedError("busy");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_GE(calls, 2);
  EXPECT_LE(calls, 10);
}

TEST(RetryTest, CustomPredicate) {
  int calls = 0;
  absl::Status s = RetryWithBackoff(
      FastPolicy(),
      [&] {
        ++calls;
        return calls < 3 ? absl::NotFoundError("not yet") : absl::OkStatus();
      },
      [](const absl::Status& st) { return absl::IsNotFound(st); });
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(calls, 3);
}

}  // namespace
}  // namespace shardopt
