// SharedMemoryRoute's choices: attach once, fall back to gRPC (and say why)
// when the shard cannot take the segment, re-attach after the shard's end
// closed. Against a stand-in for the shard's socket made of
// common/shared_memory.h alone (the client never links server code).
#include "client/shared_memory_route.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/another_user_testing.h"
#include "gtest/gtest.h"

namespace shardopt {
namespace {

// Accepts attachments on an abstract socket: maps each segment, answers
// "ok <n>" (or `refusal`), and keeps the connections until destroyed.
class StandInShard {
 public:
  explicit StandInShard(std::string refusal = "")
      : name_("route-test-" + RandomHexToken(8)), refusal_(std::move(refusal)) {
    listener_ = *ListenAbstract(name_);
    thread_ = std::thread([this] { Serve(); });
  }
  ~StandInShard() {
    stop_ = true;
    thread_.join();
    for (int c : connections_) close(c);
    close(listener_);
  }
  const std::string& name() const { return name_; }
  int attached() const { return attached_.load(); }
  char* last_mapping() {
    absl::MutexLock lock(&mu_);
    return last_.data();
  }

 private:
  void Serve() {
    while (!stop_) {
      pollfd p{listener_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const int c = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      int fd = -1;
      absl::StatusOr<std::string> m = ReceiveMessage(c, absl::Seconds(5), &fd);
      uint64_t bytes = 0;
      if (!refusal_.empty() || !m.ok() ||
          !absl::SimpleAtoi(absl::StripPrefix(*m, "attach "), &bytes)) {
        if (fd >= 0) close(fd);
        SendMessage(c, "error " + refusal_).IgnoreError();
        close(c);
        continue;
      }
      absl::StatusOr<SharedSegment> s = SharedSegment::Map(fd, bytes);
      if (!s.ok()) {
        SendMessage(c, "error " + std::string(s.status().message())).IgnoreError();
        close(c);
        continue;
      }
      {
        absl::MutexLock lock(&mu_);
        last_ = *std::move(s);
      }
      SendMessage(c, absl::StrCat("ok a", attached_.fetch_add(1))).IgnoreError();
      connections_.push_back(c);
    }
  }

  const std::string name_;
  const std::string refusal_;
  int listener_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int> attached_{0};
  std::vector<int> connections_;
  absl::Mutex mu_;
  SharedSegment last_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

std::shared_ptr<const TrainerSegment> NewSegment() {
  absl::StatusOr<std::unique_ptr<TrainerSegment>> s =
      TrainerSegment::Create(1000, DType::kBFloat16, DType::kFloat16, 3);
  EXPECT_TRUE(s.ok()) << s.status();
  return std::shared_ptr<const TrainerSegment>(std::move(*s));
}

TEST(TrainerSegmentTest, RegionsDoNotOverlap) {
  auto segment = NewSegment();
  // Gradients, parameters, a bf16 staging region, the fp16 pull region,
  // then (from the next 64-byte line) a fence line per shard and use.
  EXPECT_EQ(segment->segment().size(), 12032u + 3 * 2 * 64);
  EXPECT_EQ(segment->FenceOffset(0, TrainerSegment::FenceUse::kPush), 12032);
  EXPECT_EQ(segment->FenceOffset(0, TrainerSegment::FenceUse::kPull), 12032 + 64);
  EXPECT_EQ(segment->FenceOffset(2, TrainerSegment::FenceUse::kPull), 12032 + 5 * 64);
  EXPECT_EQ(segment->FenceOffset(3, TrainerSegment::FenceUse::kPush), -1);
  EXPECT_EQ(reinterpret_cast<char*>(segment->parameters()), segment->segment().data() + 4000);
  // In place only for an fp32 payload that is the shared gradients there.
  auto in_place =
      segment->PlacePush(10, reinterpret_cast<const char*>(segment->gradients() + 10), 4);
  ASSERT_TRUE(in_place.has_value());
  EXPECT_EQ(in_place->offset, 40);
  EXPECT_FALSE(in_place->copy);
  const char other[8] = {};
  auto staged = segment->PlacePush(10, other, 2);
  ASSERT_TRUE(staged.has_value());
  EXPECT_EQ(staged->offset, 8000 + 20);
  EXPECT_TRUE(staged->copy);
  // An fp32 payload from elsewhere has no room when the staging is 16-bit.
  EXPECT_FALSE(segment->PlacePush(10, other, 4).has_value());
  EXPECT_EQ(segment->PullOffset(10, DType::kFloat32), 4000 + 40);
  EXPECT_EQ(segment->PullOffset(10, DType::kFloat16), 10000 + 20);
  EXPECT_EQ(segment->PullOffset(10, DType::kBFloat16), 10000 + 20);

  absl::StatusOr<std::unique_ptr<TrainerSegment>> fp32 =
      TrainerSegment::Create(1000, DType::kFloat32, DType::kFloat32, 1);
  ASSERT_TRUE(fp32.ok());
  EXPECT_EQ((*fp32)->segment().size(), 12032u + 2 * 64);
  EXPECT_EQ((*fp32)->PullOffset(0, DType::kBFloat16), -1);
}

TEST(SharedMemoryRouteTest, AttachesOnceAndReattachesAfterTheShardWent) {
  auto segment = NewSegment();
  SharedMemoryRoute route(segment, 0);
  int lookups = 0;
  auto shard = std::make_unique<StandInShard>();
  std::string name = shard->name();
  const auto lookup = [&]() -> absl::StatusOr<std::string> {
    ++lookups;
    return name;
  };
  std::shared_ptr<SharedMemoryLink> link = route.Link(lookup);
  ASSERT_NE(link, nullptr);
  EXPECT_EQ(link->attachment(), "a0");
  EXPECT_EQ(route.Link(lookup), link);
  EXPECT_EQ(lookups, 1);
  // Both sides see one memory.
  segment->gradients()[3] = 2.5f;
  float seen;
  std::memcpy(&seen, shard->last_mapping() + 12, 4);
  EXPECT_EQ(seen, 2.5f);

  // The shard goes (its end closes): the next call attaches to its new
  // process at once.
  shard.reset();
  EXPECT_FALSE(link->alive());
  EXPECT_TRUE(route.DropIfDead(link));
  shard = std::make_unique<StandInShard>();
  name = shard->name();
  std::shared_ptr<SharedMemoryLink> again = route.Link(lookup);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(lookups, 2);
  EXPECT_TRUE(again->alive());
  EXPECT_FALSE(route.DropIfDead(again));
}

TEST(SharedMemoryRouteTest, FallsBackWhenTheShardCannotTakeIt) {
  auto segment = NewSegment();
  // A shard without shared memory: asked once, then not before the retry
  // interval.
  {
    SharedMemoryRoute route(segment, 1);
    int lookups = 0;
    const auto off = [&]() -> absl::StatusOr<std::string> {
      ++lookups;
      return std::string();
    };
    EXPECT_EQ(route.Link(off), nullptr);
    EXPECT_EQ(route.Link(off), nullptr);
    EXPECT_EQ(lookups, 1);
  }
  // A socket this host does not have (the shard is elsewhere).
  {
    SharedMemoryRoute route(segment, 2);
    int lookups = 0;
    const auto elsewhere = [&]() -> absl::StatusOr<std::string> {
      ++lookups;
      return "shardopt-shm-" + RandomHexToken(16);
    };
    EXPECT_EQ(route.Link(elsewhere), nullptr);
    EXPECT_EQ(route.Link(elsewhere), nullptr);
    EXPECT_EQ(lookups, 1);
  }
  // A shard that refuses the segment.
  {
    StandInShard refusing("another user");
    SharedMemoryRoute route(segment, 3);
    const auto lookup = [&]() -> absl::StatusOr<std::string> { return refusing.name(); };
    EXPECT_EQ(route.Link(lookup), nullptr);
  }
  // A shard whose shared memory is not to be used (an older server, without
  // fences): asked once, then not before the retry interval.
  {
    SharedMemoryRoute route(segment, 5);
    int lookups = 0;
    const auto unfenced = [&]() -> absl::StatusOr<std::string> {
      ++lookups;
      return absl::FailedPreconditionError("no fences");
    };
    EXPECT_EQ(route.Link(unfenced), nullptr);
    absl::SleepFor(absl::Milliseconds(300));
    EXPECT_EQ(route.Link(unfenced), nullptr);
    EXPECT_EQ(lookups, 1);
  }
  // An unreachable shard (its ServerInfo failed) is asked again soon.
  {
    SharedMemoryRoute route(segment, 4);
    int lookups = 0;
    const auto down = [&]() -> absl::StatusOr<std::string> {
      ++lookups;
      return absl::UnavailableError("connection refused");
    };
    EXPECT_EQ(route.Link(down), nullptr);
    EXPECT_EQ(route.Link(down), nullptr);  // (Not asked again at once.)
    EXPECT_EQ(lookups, 1);
    absl::SleepFor(absl::Milliseconds(300));
    EXPECT_EQ(route.Link(down), nullptr);
    EXPECT_EQ(lookups, 2);
  }
}

// Whatever answers at the name a shard gave, a process of another user
// (root's child after setuid) never gets the segment's descriptor: the
// trainer checks its peer before it sends anything.
TEST(SharedMemoryLinkTest, NeverHandsTheSegmentToAnotherUsersProcess) {
  auto segment = NewSegment();
  const std::string name = "route-test-" + RandomHexToken(8);
  const AbstractSocketAddress address = AbstractSocketAddressOf(name);
  absl::StatusOr<std::unique_ptr<SharedMemoryLink>> link =
      absl::UnknownError("the child never listened");
  // The child listens, takes one connection and says whether a descriptor
  // came with anything it received ("fd") or not ("none").
  const AnotherUserRun run = RunAsAnotherUser(
      [&](const AnotherUserChannel& channel) {
        const int listener = socket(AF_UNIX, SOCK_SEQPACKET, 0);
        if (listener < 0 || bind(listener, address.get(), address.length) != 0 ||
            listen(listener, 4) != 0) {
          return false;
        }
        channel.Ready();
        pollfd waiting{listener, POLLIN, 0};
        if (poll(&waiting, 1, 10000) != 1) return false;
        const int c = accept(listener, nullptr, nullptr);
        if (c < 0) return false;
        char data[512];
        char control[CMSG_SPACE(sizeof(int))] = {};
        iovec part{data, sizeof(data)};
        msghdr header{};
        header.msg_iov = &part;
        header.msg_iovlen = 1;
        header.msg_control = control;
        header.msg_controllen = sizeof(control);
        pollfd message{c, POLLIN, 0};
        bool got_fd = false;
        if (poll(&message, 1, 5000) == 1 && recvmsg(c, &header, 0) > 0) {
          got_fd = CMSG_FIRSTHDR(&header) != nullptr;
        }
        channel.Say(got_fd ? "fd" : "none", got_fd ? 2 : 4);
        return true;
      },
      [&] { link = SharedMemoryLink::Attach(name, segment->segment()); });
  if (run.outcome == AnotherUserRun::kNotRoot || run.outcome == AnotherUserRun::kCannotSwitch) {
    GTEST_SKIP() << run.skip_reason();
  }
  ASSERT_EQ(run.outcome, AnotherUserRun::kRan) << "the child did not listen and answer";
  EXPECT_EQ(run.said, "none");
  ASSERT_FALSE(link.ok());
  EXPECT_EQ(link.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(link.status().message(), "runs as another user (uid 65534"))
      << link.status();
}

}  // namespace
}  // namespace shardopt
