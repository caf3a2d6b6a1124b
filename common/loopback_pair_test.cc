#include "common/loopback_pair.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/another_user_testing.h"
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

// A process of another user that finds the pair's name is closed, and the
// shard's end keeps waiting for its trainer instead of taking it.
TEST(LoopbackPairTest, APeerOfAnotherUserIsNotTakenForTheTrainer) {
  const DevicePairKind& kind = LoopbackPairKind();
  const std::string id = *kind.NewId();
  const AbstractSocketAddress address = AbstractSocketAddressOf("shardopt-pair-" + id);
  absl::StatusOr<std::unique_ptr<DevicePair>> shard;
  std::thread rank0(
      [&] { shard = kind.Connect(id, 0, 0, absl::Now() + absl::Seconds(20), "trainer 0"); });
  const AnotherUserRun run = RunAsAnotherUser(
      [&](const AnotherUserChannel& channel) {
        int s = -1;
        for (int attempt = 0; attempt < 500 && s < 0; ++attempt) {  // (Until rank 0 listens.)
          s = socket(AF_UNIX, SOCK_STREAM, 0);
          if (s >= 0 && connect(s, address.get(), address.length) != 0) {
            close(s);
            s = -1;
            usleep(10000);
          }
        }
        char byte = 0;
        pollfd closing{s, POLLIN, 0};
        if (s < 0 || poll(&closing, 1, 10000) != 1 || recv(s, &byte, 1, 0) != 0) return false;
        channel.Say("closed", 6);
        return true;
      },
      [] {});
  if (run.outcome == AnotherUserRun::kNotRoot || run.outcome == AnotherUserRun::kCannotSwitch) {
    absl::StatusOr<std::unique_ptr<DevicePair>> trainer =
        kind.Connect(id, 1, 0, absl::Now() + absl::Seconds(10), "shard 0");
    rank0.join();
    GTEST_SKIP() << run.skip_reason();
  }
  EXPECT_EQ(run.outcome, AnotherUserRun::kRan) << "the other user's connection stayed open";
  EXPECT_EQ(run.said, "closed");
  absl::StatusOr<std::unique_ptr<DevicePair>> trainer =
      kind.Connect(id, 1, 0, absl::Now() + absl::Seconds(10), "shard 0");
  rank0.join();
  ASSERT_TRUE(shard.ok()) << shard.status();
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const float sent = 2.5f;
  float got = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  std::thread sender([&] { EXPECT_TRUE((*trainer)->Send(&sent, 4, deadline, "push").ok()); });
  EXPECT_TRUE((*shard)->Recv(&got, 4, deadline, "push").ok());
  sender.join();
  EXPECT_EQ(got, sent);
}

// The shard's end compares effective users (the kernel's SO_PEERCRED gives
// the peer's): a shard whose real uid differs from its effective one (a
// setuid program) still takes its own trainer.
TEST(LoopbackPairTest, TheShardsEndComparesEffectiveUsers) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a process two uids";
  const DevicePairKind& kind = LoopbackPairKind();
  const std::string id = *kind.NewId();
  // Forked while this process runs one thread: the child may do anything.
  const pid_t child = fork();
  if (child == 0) {
    if (setresuid(65534, 0, 0) != 0) _exit(3);
    absl::StatusOr<std::unique_ptr<DevicePair>> shard =
        kind.Connect(id, 0, 0, absl::Now() + absl::Seconds(5), "trainer 0");
    float got = 0;
    _exit(shard.ok() && (*shard)->Recv(&got, 4, absl::Now() + absl::Seconds(5), "push").ok() &&
                  got == 2.5f
              ? 0
              : 1);
  }
  ASSERT_GT(child, 0);
  absl::StatusOr<std::unique_ptr<DevicePair>> trainer =
      kind.Connect(id, 1, 0, absl::Now() + absl::Seconds(10), "shard 0");
  const float sent = 2.5f;
  const bool pushed =
      trainer.ok() && (*trainer)->Send(&sent, 4, absl::Now() + absl::Seconds(10), "push").ok();
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  if (WEXITSTATUS(status) == 3) GTEST_SKIP() << "this sandbox cannot give a process two uids";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the shard's end (real uid 65534, effective uid 0) did "
                                       "not take its trainer (effective uid 0)";
  EXPECT_TRUE(pushed);
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
