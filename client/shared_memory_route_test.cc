// SharedMemoryRoute's choices: attach once, fall back to gRPC (and say why)
// when the shard cannot take the segment, re-attach after the shard's end
// closed. Against a stand-in for the shard's socket made of
// common/shared_memory.h alone (the client never links server code).
#include "client/shared_memory_route.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
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
      TrainerSegment::Create(1000, DType::kBFloat16, DType::kFloat16);
  EXPECT_TRUE(s.ok()) << s.status();
  return std::shared_ptr<const TrainerSegment>(std::move(*s));
}

TEST(TrainerSegmentTest, RegionsDoNotOverlap) {
  auto segment = NewSegment();
  // Gradients, parameters, a bf16 staging region, the fp16 pull region.
  EXPECT_EQ(segment->segment().size(), 1000u * (4 + 4 + 2 + 2));
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
      TrainerSegment::Create(1000, DType::kFloat32, DType::kFloat32);
  ASSERT_TRUE(fp32.ok());
  EXPECT_EQ((*fp32)->segment().size(), 12000u);
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
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  auto segment = NewSegment();
  // Everything the child needs is made before fork (the child of a threaded
  // process should only make system calls).
  const std::string name = "route-test-" + RandomHexToken(8);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path + 1, name.data(), name.size());
  const socklen_t length =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  int ready_pipe[2], answer_pipe[2];
  ASSERT_EQ(pipe(ready_pipe), 0);
  ASSERT_EQ(pipe(answer_pipe), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Listens as uid 65534, takes one connection and says whether a
    // descriptor came with anything it received ("fd"), or not ("none").
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
    const int listener = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    if (listener < 0 || bind(listener, reinterpret_cast<const sockaddr*>(&address), length) != 0 ||
        listen(listener, 4) != 0) {
      _exit(4);
    }
    if (write(ready_pipe[1], "r", 1) != 1) _exit(5);
    pollfd waiting{listener, POLLIN, 0};
    if (poll(&waiting, 1, 10000) != 1) _exit(6);
    const int c = accept(listener, nullptr, nullptr);
    if (c < 0) _exit(7);
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
    const char* said = got_fd ? "fd" : "none";
    if (write(answer_pipe[1], said, std::strlen(said)) < 0) _exit(2);
    _exit(0);
  }
  close(ready_pipe[1]);
  close(answer_pipe[1]);
  char ready = 0;
  const bool listening = read(ready_pipe[0], &ready, 1) == 1;
  close(ready_pipe[0]);
  absl::StatusOr<std::unique_ptr<SharedMemoryLink>> link;
  if (listening) link = SharedMemoryLink::Attach(name, segment->segment());
  char buffer[16] = {};
  const ssize_t n = read(answer_pipe[0], buffer, sizeof(buffer) - 1);
  close(answer_pipe[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 3) {
    GTEST_SKIP() << "this sandbox cannot switch a process to uid 65534";
  }
  ASSERT_TRUE(listening && WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the child did not listen and answer (status " << status << ")";
  EXPECT_EQ(std::string(buffer, n > 0 ? static_cast<size_t>(n) : 0), "none");
  ASSERT_FALSE(link.ok());
  EXPECT_EQ(link.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(link.status().message(), "runs as another user (uid 65534"))
      << link.status();
}

}  // namespace
}  // namespace shardopt
