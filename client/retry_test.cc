#include "client/retry.h"

#include "absl/status/status.h"
#include "absl/time/clock.h"
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

TEST(RetryTest, BudgetCountsFromTheEndOfTheFirstAttempt) {
  // The first attempt takes longer than the whole budget (a pull that waited
  // its full deadline); it is still retried.
  int calls = 0;
  RetryPolicy policy{absl::Milliseconds(50), absl::Milliseconds(1), absl::Milliseconds(2)};
  absl::Status s = RetryWithBackoff(policy, [&] {
    if (++calls == 1) {
      absl::SleepFor(absl::Milliseconds(80));
      return absl::DeadlineExceededError("slow");
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(calls, 2);
}

TEST(RetryTest, ZeroBackoffDoesNotSpin) {
  int calls = 0;
  RetryPolicy policy{absl::Milliseconds(20), absl::ZeroDuration(), absl::ZeroDuration()};
  RetryWithBackoff(policy, [&] {
    ++calls;
    return absl::UnavailableError("down");
  }).IgnoreError();  // (What is counted is the attempts.)
  EXPECT_LE(calls, 40);  // At most one attempt per ~1 ms of the 20 ms budget.
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

TEST(RetryTest, AWaitReportIsADeadlineExceededWithTimeLeft) {
  const absl::Status timeout = absl::DeadlineExceededError("version 2 did not come");
  EXPECT_TRUE(IsWaitReport(timeout, absl::Now() + absl::Seconds(10)));
  EXPECT_FALSE(IsWaitReport(timeout, absl::Now() - absl::Milliseconds(1)));
  EXPECT_FALSE(IsWaitReport(absl::UnavailableError("x"), absl::Now() + absl::Seconds(10)));
}

TEST(RetryTest, DoubledBackoffStartsAtTheFirstWaitAndStopsAtTheCap) {
  const absl::Duration first = absl::Milliseconds(250), cap = absl::Seconds(1);
  EXPECT_EQ(DoubledBackoff(absl::ZeroDuration(), first, cap), first);
  EXPECT_EQ(DoubledBackoff(first, first, cap), absl::Milliseconds(500));
  EXPECT_EQ(DoubledBackoff(absl::Milliseconds(500), first, cap), cap);
  EXPECT_EQ(DoubledBackoff(cap, first, cap), cap);
}

}  // namespace
}  // namespace shardopt
