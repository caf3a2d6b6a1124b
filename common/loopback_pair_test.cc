#include "common/loopback_pair.h"

#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace shardopt {
namespace {

struct Joined {
  std::unique_ptr<DevicePair> shard, trainer;
};

Joined Join() {
  const DevicePairKind& kind = LoopbackPairKind();
  const std::string id = *kind.NewId();
  absl::StatusOr<std::unique_ptr<DevicePair>> shard;
  std::thread rank0(
      [&] { shard = kind.Connect(id, 0, 0, absl::Now() + absl::Seconds(10), "trainer 0"); });
  absl::StatusOr<std::unique_ptr<DevicePair>> trainer =
      kind.Connect(id, 1, 0, absl::Now() + absl::Seconds(10), "shard 0");
  rank0.join();
  EXPECT_TRUE(shard.ok()) << shard.status();
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  return {shard.ok() ? *std::move(shard) : nullptr, trainer.ok() ? *std::move(trainer) : nullptr};
}

TEST(LoopbackPairTest, MovesBytesBothWays) {
  Joined pair = Join();
  ASSERT_NE(pair.shard, nullptr);
  std::vector<float> sent(3 << 20), got(sent.size());
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = 0.5f * static_cast<float>(i);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  std::thread sender([&] {
    EXPECT_TRUE(pair.trainer->Send(sent.data(), sent.size() * 4, deadline, "push").ok());
  });
  ASSERT_TRUE(pair.shard->Recv(got.data(), got.size() * 4, deadline, "push").ok());
  sender.join();
  EXPECT_EQ(got, sent);
  got.assign(got.size(), 0);
  std::thread back(
      [&] { EXPECT_TRUE(pair.shard->Send(sent.data(), sent.size() * 4, deadline, "pull").ok()); });
  ASSERT_TRUE(pair.trainer->Recv(got.data(), got.size() * 4, deadline, "pull").ok());
  back.join();
  EXPECT_EQ(got, sent);
}

TEST(LoopbackPairTest, ASilentPeerFailsAtTheDeadlineAndBreaksThePair) {
  Joined pair = Join();
  ASSERT_NE(pair.shard, nullptr);
  std::vector<char> buffer(1024);
  const absl::Time start = absl::Now();
  const absl::Status s =
      pair.shard->Recv(buffer.data(), buffer.size(), start + absl::Milliseconds(200), "push 7");
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_NE(s.message().find("push 7"), absl::string_view::npos) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_FALSE(pair.shard->broken().ok());
  // Broken: fails at once, also with time left.
  EXPECT_FALSE(pair.shard->Recv(buffer.data(), 1, absl::Now() + absl::Seconds(10), "x").ok());
  // The peer hears of it instead of waiting for its own deadline.
  const absl::Status peer =
      pair.trainer->Recv(buffer.data(), 1, absl::Now() + absl::Seconds(10), "y");
  EXPECT_TRUE(absl::IsUnavailable(peer)) << peer;
}

TEST(LoopbackPairTest, APeerGoneIsUnavailable) {
  Joined pair = Join();
  ASSERT_NE(pair.shard, nullptr);
  pair.trainer.reset();
  std::vector<char> buffer(1 << 20);
  const absl::Status s =
      pair.shard->Recv(buffer.data(), buffer.size(), absl::Now() + absl::Seconds(10), "push");
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
}

TEST(LoopbackPairTest, NobodyJoiningIsADeadlineNamingThePeer) {
  const DevicePairKind& kind = LoopbackPairKind();
  absl::StatusOr<std::unique_ptr<DevicePair>> alone =
      kind.Connect(*kind.NewId(), 0, 0, absl::Now() + absl::Milliseconds(100), "trainer 3");
  EXPECT_TRUE(absl::IsDeadlineExceeded(alone.status())) << alone.status();
  EXPECT_NE(alone.status().message().find("trainer 3"), absl::string_view::npos);
  alone = kind.Connect(*kind.NewId(), 1, 0, absl::Now() + absl::Milliseconds(100), "shard 1");
  EXPECT_TRUE(absl::IsDeadlineExceeded(alone.status())) << alone.status();
  EXPECT_TRUE(absl::IsInvalidArgument(kind.Connect("zz", 0, 0, absl::Now(), "x").status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(kind.Connect(*kind.NewId(), 2, 0, absl::Now(), "x").status()));
}

TEST(DevicePairKindsTest, FindsLoopbackAndNamesTheUnknown) {
  EXPECT_EQ(std::string((*FindDevicePairKind("loopback"))->name()), "loopback");
  EXPECT_TRUE(absl::IsNotFound(FindDevicePairKind("carrier pigeon").status()));
}

}  // namespace
}  // namespace shardopt
