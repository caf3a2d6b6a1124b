#include "server/device_pair_host.h"

#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "common/loopback_pair.h"
#include "gtest/gtest.h"

namespace shardopt {
namespace {

constexpr absl::Duration kShortJoin = absl::Milliseconds(300);

// A pair opened on `host` and joined by the trainer's end (returned).
std::unique_ptr<DevicePair> OpenAndJoin(DevicePairHost& host, std::string* name) {
  absl::StatusOr<DevicePairHost::Opened> opened = host.Open("trainer 0");
  EXPECT_TRUE(opened.ok()) << opened.status();
  if (!opened.ok()) return nullptr;
  *name = opened->pair;
  absl::StatusOr<std::unique_ptr<DevicePair>> trainer =
      LoopbackPairKind().Connect(opened->id, 1, 0, absl::Now() + absl::Seconds(10), "shard 0");
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (host.pairs() != 1 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(host.pairs(), 1u);
  return trainer.ok() ? *std::move(trainer) : nullptr;
}

// A call that waits for a pair another transfer holds past the join bound
// is told UNAVAILABLE (its trainer retries another way), not
// DEADLINE_EXCEEDED, which before its call's deadline would read as the
// shard's "still waiting" report.
TEST(DevicePairHostTest, ABusyPairIsUnavailableOnceTheWaitRunsOut) {
  DevicePairHost host(LoopbackPairKind(), 0, kShortJoin);
  std::string name;
  std::unique_ptr<DevicePair> trainer = OpenAndJoin(host, &name);
  ASSERT_NE(trainer, nullptr);
  absl::StatusOr<DevicePairHost::Lease> first = host.Acquire(name, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(host.busy(), 1u);
  const absl::Time start = absl::Now();
  absl::StatusOr<DevicePairHost::Lease> second =
      host.Acquire(name, absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(absl::IsUnavailable(second.status())) << second.status();
  EXPECT_TRUE(absl::StrContains(second.status().message(), "busy with another transfer"))
      << second.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// A lease of a call that was cancelled drops the pair even after its
// transfer finished cleanly: the trainer dropped its end.
TEST(DevicePairHostTest, AnAbandonedLeaseDropsThePair) {
  DevicePairHost host(LoopbackPairKind(), 0, kShortJoin);
  std::string name;
  std::unique_ptr<DevicePair> trainer = OpenAndJoin(host, &name);
  ASSERT_NE(trainer, nullptr);
  {
    absl::StatusOr<DevicePairHost::Lease> lease =
        host.Acquire(name, absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(lease.ok()) << lease.status();
    lease->Started();
    lease->Finished();
  }
  EXPECT_EQ(host.pairs(), 1u) << "a finished transfer keeps its pair";
  EXPECT_EQ(host.busy(), 0u);
  {
    absl::StatusOr<DevicePairHost::Lease> lease =
        host.Acquire(name, absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(lease.ok()) << lease.status();
    lease->Finished();
    lease->Abandoned();
  }
  EXPECT_EQ(host.pairs(), 0u) << "the shard kept the pair of a cancelled call";
  absl::StatusOr<DevicePairHost::Lease> again = host.Acquire(name, absl::Now());
  EXPECT_TRUE(absl::IsFailedPrecondition(again.status())) << again.status();
  EXPECT_TRUE(absl::StrContains(again.status().message(), kDevicePairNotOpen));
}

}  // namespace
}  // namespace shardopt
