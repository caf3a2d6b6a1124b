// ReadyRanges: intervals merge in any order; waits end when covered, at
// AllowCommit, or with false at Fail.
#include "client/ready_ranges.h"

#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace shardopt {
namespace {

TEST(ReadyRangesTest, RangesMergeInAnyOrderAndWaitsEndWhenCovered) {
  ReadyRanges ready;
  ready.MarkReady(100, 200);
  ready.MarkReady(0, 50);
  std::thread waiter([&] { EXPECT_TRUE(ready.WaitReady(10, 150)); });
  ready.MarkReady(40, 100);  // Bridges the two: [0, 200).
  waiter.join();
  EXPECT_TRUE(ready.WaitReady(0, 200));
  EXPECT_TRUE(ready.WaitReady(5, 5));
  ready.MarkReady(300, 250);  // Empty: ignored.
  ready.MarkReady(200, 201);  // Adjacent: merged.
  EXPECT_TRUE(ready.WaitReady(199, 201));
}

TEST(ReadyRangesTest, FailEndsEveryWaitAndCommitWaitsForAllowCommit) {
  ReadyRanges ready;
  ready.MarkReady(0, 10);
  absl::Notification started;
  std::thread commit([&] {
    started.Notify();
    EXPECT_TRUE(ready.WaitCommit());
  });
  started.WaitForNotification();
  ready.AllowCommit();
  commit.join();
  std::thread gap([&] { EXPECT_FALSE(ready.WaitReady(0, 20)); });
  ready.Fail();
  gap.join();
  EXPECT_TRUE(ready.failed());
  EXPECT_FALSE(ready.WaitCommit());
}

}  // namespace
}  // namespace shardopt
