#include "common/loopback_pair.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/payload_socket.h"
#include "common/shared_memory.h"

namespace shardopt {
namespace {

constexpr int kIdBytes = 16;
constexpr char kNamePrefix[] = "shardopt-pair-";

absl::Status Errno(absl::string_view what, int error) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(error)));
}

absl::StatusOr<sockaddr_un> AddressOf(absl::string_view id, socklen_t* length) {
  if (id.size() != 2 * kIdBytes ||
      !std::all_of(id.begin(), id.end(), [](char c) { return absl::ascii_isxdigit(c); })) {
    return absl::InvalidArgumentError(
        absl::StrCat("a loopback pair id is ", 2 * kIdBytes, " hex digits"));
  }
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string name = absl::StrCat(kNamePrefix, id);
  std::memcpy(address.sun_path + 1, name.data(), name.size());  // (Leading NUL: abstract.)
  *length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return address;
}

class LoopbackPair final : public DevicePair {
 public:
  LoopbackPair(int socket, std::string peer) : socket_(socket), peer_(std::move(peer)) {}
  ~LoopbackPair() override { close(socket_); }

  absl::Status Send(const void* data, size_t bytes, absl::Time deadline, absl::string_view what,
                    const std::function<bool()>& cancelled) override {
    if (!broken_.ok()) return broken_;
    return Check(
        SendAll(socket_, static_cast<const char*>(data), bytes, WaitUntil(deadline, cancelled)),
        what);
  }
  absl::Status Recv(void* data, size_t bytes, absl::Time deadline, absl::string_view what,
                    const std::function<bool()>& cancelled) override {
    if (!broken_.ok()) return broken_;
    return Check(
        ReceiveAll(socket_, static_cast<char*>(data), bytes, WaitUntil(deadline, cancelled)), what);
  }
  absl::StatusOr<void*> Scratch(size_t bytes) override {
    if (scratch_.size() * sizeof(float) < bytes) scratch_.resize((bytes + 3) / 4);
    return static_cast<void*>(scratch_.data());
  }
  absl::Status CopyIn(void* pair_memory, const void* host, size_t bytes) override {
    std::memcpy(pair_memory, host, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyOut(void* host, const void* pair_memory, size_t bytes) override {
    std::memcpy(host, pair_memory, bytes);
    return absl::OkStatus();
  }
  const absl::Status& broken() const override { return broken_; }

 private:
  static SocketWait WaitUntil(absl::Time deadline, const std::function<bool()>& cancelled) {
    SocketWait wait;
    wait.deadline = deadline;
    wait.stall = absl::InfiniteDuration();
    wait.cancelled = cancelled;
    return wait;
  }
  // A failure breaks the pair: its stream holds part of a transfer. Closed
  // at once, so that the peer's call ends too instead of at its deadline.
  absl::Status Check(absl::Status s, absl::string_view what) {
    if (s.ok()) return s;
    const absl::StatusCode code =
        absl::IsDeadlineExceeded(s) ? s.code() : absl::StatusCode::kUnavailable;
    broken_ =
        absl::Status(code, absl::StrCat(what, " (loopback pair with ", peer_, "): ", s.message()));
    shutdown(socket_, SHUT_RDWR);
    return broken_;
  }

  const int socket_;
  const std::string peer_;
  std::vector<float> scratch_;
  absl::Status broken_;
};

absl::StatusOr<int> Listen(absl::string_view id) {
  socklen_t length = 0;
  absl::StatusOr<sockaddr_un> address = AddressOf(id, &length);
  if (!address.ok()) return address.status();
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Errno("socket", errno);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&*address), length) != 0 || listen(fd, 1) != 0) {
    const int error = errno;
    close(fd);
    return Errno("listening for a loopback pair", error);
  }
  return fd;
}

// Accepts the peer (of this user) until `deadline`.
absl::StatusOr<int> AcceptPeer(int listener, absl::Time deadline, const std::string& peer) {
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("waiting for ", peer, " to join the loopback pair"));
    }
    pollfd p{listener, POLLIN, 0};
    const int ready =
        poll(&p, 1, static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1000)));
    if (ready < 0 && errno != EINTR) return Errno("poll", errno);
    if (ready <= 0) continue;
    const int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      return Errno("accept", errno);
    }
    // The same rule as every other same-host link: the peer's effective uid.
    if (CheckPeerIsSameUser(fd, peer, "shard").ok()) return fd;
    close(fd);  // Not our trainer: keep waiting for it.
  }
}

absl::StatusOr<int> ConnectPeer(absl::string_view id, absl::Time deadline,
                                const std::string& peer) {
  socklen_t length = 0;
  absl::StatusOr<sockaddr_un> address = AddressOf(id, &length);
  if (!address.ok()) return address.status();
  for (;;) {
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Errno("socket", errno);
    if (connect(fd, reinterpret_cast<const sockaddr*>(&*address), length) == 0) return fd;
    const int error = errno;
    close(fd);
    if (error != ECONNREFUSED && error != ENOENT && error != EAGAIN) {
      return Errno(absl::StrCat("joining the loopback pair of ", peer), error);
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("joining the loopback pair of ", peer, ": it does not listen"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

class LoopbackKind final : public DevicePairKind {
 public:
  const char* name() const override { return "loopback"; }
  PairMemory memory() const override { return PairMemory::kHost; }
  absl::StatusOr<std::string> NewId() const override { return RandomHexToken(kIdBytes); }
  absl::StatusOr<std::unique_ptr<DevicePair>> Connect(absl::string_view id, int rank, int device,
                                                      absl::Time deadline,
                                                      std::string peer) const override {
    (void)device;
    if (rank != 0 && rank != 1) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of a pair (0 or 1)"));
    }
    absl::StatusOr<int> fd;
    if (rank == 0) {
      absl::StatusOr<int> listener = Listen(id);
      if (!listener.ok()) return listener.status();
      fd = AcceptPeer(*listener, deadline, peer);
      close(*listener);  // (One peer per pair: the name is free again.)
    } else {
      fd = ConnectPeer(id, deadline, peer);
    }
    if (!fd.ok()) return fd.status();
    return std::unique_ptr<DevicePair>(new LoopbackPair(*fd, std::move(peer)));
  }
  absl::StatusOr<std::shared_ptr<void>> Allocate(int device, size_t bytes) const override {
    (void)device;
    void* memory = std::malloc(std::max<size_t>(bytes, 1));
    if (memory == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
    }
    return std::shared_ptr<void>(memory, [](void* p) { std::free(p); });
  }
  absl::Status CopyToHost(int device, void* host, const void* memory, size_t bytes) const override {
    (void)device;
    std::memcpy(host, memory, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyFromHost(int device, void* memory, const void* host,
                            size_t bytes) const override {
    (void)device;
    std::memcpy(memory, host, bytes);
    return absl::OkStatus();
  }
};

}  // namespace

const DevicePairKind& LoopbackPairKind() {
  static const LoopbackKind* const kind = new LoopbackKind;
  return *kind;
}

}  // namespace shardopt
