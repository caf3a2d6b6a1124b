#include "common/shared_memory.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace shardopt {
namespace {

constexpr int kRequiredSeals = F_SEAL_SHRINK | F_SEAL_GROW;
constexpr size_t kMaxMessage = 4096;

absl::Status ErrnoError(absl::string_view what, int error) {
  const std::string message = absl::StrCat(what, ": ", strerror(error));
  if (error == ENOMEM || error == ENOSPC) return absl::ResourceExhaustedError(message);
  if (error == ECONNREFUSED || error == ENOENT) return absl::UnavailableError(message);
  return absl::InternalError(message);
}

absl::StatusOr<sockaddr_un> AbstractAddress(absl::string_view name, socklen_t* length) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (name.empty() || name.size() + 1 > sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("abstract socket name of ", name.size(), " bytes"));
  }
  // sun_path[0] stays NUL: the abstract namespace.
  std::memcpy(address.sun_path + 1, name.data(), name.size());
  *length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return address;
}

// What this process may still allocate: MemAvailable of /proc/meminfo, or
// less when its cgroup (v2) has a memory.max; 0 when unknown.
uint64_t AvailableMemoryBytes() {
  uint64_t available = 0;
  {
    std::ifstream meminfo("/proc/meminfo");
    std::string key, unit;
    uint64_t kib = 0;
    while (meminfo >> key >> kib >> unit) {
      if (key == "MemAvailable:") {
        available = kib << 10;
        break;
      }
    }
  }
  std::ifstream cgroup_of("/proc/self/cgroup");
  std::string line;
  while (std::getline(cgroup_of, line)) {
    if (!absl::StartsWith(line, "0::")) continue;  // The v2 hierarchy.
    const std::string dir = absl::StrCat("/sys/fs/cgroup", line.substr(3));
    std::ifstream max_file(dir + "/memory.max"), current_file(dir + "/memory.current");
    uint64_t max = 0, current = 0;
    if (max_file >> max && current_file >> current) {  // ("max" does not parse: no limit.)
      const uint64_t left = max > current ? max - current : 0;
      available = available == 0 ? left : std::min(available, left);
    }
  }
  return available;
}

}  // namespace

absl::StatusOr<SharedSegment> SharedSegment::MapDescriptor(int fd, size_t bytes,
                                                           const struct stat& info) {
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    const int error = errno;
    close(fd);
    return ErrnoError("mapping a shared segment", error);
  }
  return SharedSegment(
      fd, static_cast<char*>(data), bytes,
      FileId{static_cast<uint64_t>(info.st_dev), static_cast<uint64_t>(info.st_ino)});
}

absl::StatusOr<SharedSegment> SharedSegment::Create(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("a shared segment of 0 bytes");
  // Checked first: allocating the pages of a segment the host cannot hold
  // would push everything else out (the kernel fails the allocation only
  // once memory is gone, and may kill a bystander first).
  if (const uint64_t available = AvailableMemoryBytes(); available != 0 && bytes > available) {
    return absl::ResourceExhaustedError(absl::StrCat("a shared segment of ", bytes,
                                                     " bytes is more than the host's ", available,
                                                     " bytes of available memory"));
  }
  const int fd = memfd_create("shardopt", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return ErrnoError("memfd_create", errno);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int error = errno;
    close(fd);
    return ErrnoError(absl::StrCat("sizing a shared segment to ", bytes, " bytes"), error);
  }
  // Every page now: a host out of memory says so here, not with a SIGBUS
  // in the middle of a step.
  if (const int error = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); error != 0) {
    close(fd);
    return ErrnoError(absl::StrCat("allocating a shared segment of ", bytes, " bytes"), error);
  }
  if (fcntl(fd, F_ADD_SEALS, kRequiredSeals | F_SEAL_SEAL) != 0) {
    const int error = errno;
    close(fd);
    return ErrnoError("sealing a shared segment", error);
  }
  struct stat info;
  if (fstat(fd, &info) != 0) {
    const int error = errno;
    close(fd);
    return ErrnoError("fstat of a shared segment", error);
  }
  return MapDescriptor(fd, bytes, info);
}

absl::StatusOr<SharedSegment> SharedSegment::Map(int fd, size_t expected_bytes) {
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & kRequiredSeals) != kRequiredSeals) {
    close(fd);
    return absl::FailedPreconditionError(
        "the shared segment is not sealed against resizing (it could shrink under its mapping)");
  }
  // Plain shared memory only: a hugetlbfs memfd takes seals too, but a hole
  // punched in it (which F_SEAL_SHRINK allows) gives its pages back, and
  // the next read of them here would be a SIGBUS instead of zeros.
  struct statfs filesystem;
  if (fstatfs(fd, &filesystem) != 0 || filesystem.f_type != TMPFS_MAGIC) {
    close(fd);
    return absl::FailedPreconditionError(
        "the shared segment is not plain shared memory (a memfd without MFD_HUGETLB)");
  }
  struct stat info;
  if (fstat(fd, &info) != 0) {
    const int error = errno;
    close(fd);
    return ErrnoError("fstat of a shared segment", error);
  }
  if (expected_bytes == 0 || static_cast<uint64_t>(info.st_size) != expected_bytes) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat("the shared segment holds ", info.st_size,
                                                      " bytes, not the ", expected_bytes,
                                                      " announced"));
  }
  return MapDescriptor(fd, expected_bytes, info);
}

SharedSegment::SharedSegment(SharedSegment&& other) noexcept
    : fd_(other.fd_), data_(other.data_), size_(other.size_), file_id_(other.file_id_) {
  other.fd_ = -1;
  other.data_ = nullptr;
  other.size_ = 0;
  other.file_id_ = FileId();
}

SharedSegment& SharedSegment::operator=(SharedSegment&& other) noexcept {
  if (this != &other) {
    Reset();
    std::swap(fd_, other.fd_);
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    std::swap(file_id_, other.file_id_);
  }
  return *this;
}

SharedSegment::~SharedSegment() { Reset(); }

void SharedSegment::Reset() {
  if (data_ != nullptr) munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  data_ = nullptr;
  size_ = 0;
  file_id_ = FileId();
}

std::string RandomHexToken(int bytes) {
  std::string raw(static_cast<size_t>(bytes), '\0');
  size_t filled = 0;
  while (filled < raw.size()) {
    const ssize_t n = getrandom(raw.data() + filled, raw.size() - filled, 0);
    if (n > 0) filled += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(raw);
}

absl::StatusOr<int> ListenAbstract(absl::string_view name) {
  socklen_t length = 0;
  absl::StatusOr<sockaddr_un> address = AbstractAddress(name, &length);
  if (!address.ok()) return address.status();
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return ErrnoError("socket", errno);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&*address), length) != 0 || listen(fd, 64) != 0) {
    const int error = errno;
    close(fd);
    return ErrnoError(absl::StrCat("listening on abstract socket '", name, "'"), error);
  }
  return fd;
}

absl::StatusOr<int> ConnectAbstract(absl::string_view name) {
  socklen_t length = 0;
  absl::StatusOr<sockaddr_un> address = AbstractAddress(name, &length);
  if (!address.ok()) return address.status();
  // Non-blocking: a Unix socket's connect completes at once or fails with
  // EAGAIN (the listener's backlog is full); it never waits.
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return ErrnoError("socket", errno);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&*address), length) != 0) {
    const int error = errno == EAGAIN ? ECONNREFUSED : errno;
    close(fd);
    return ErrnoError(absl::StrCat("connecting to abstract socket '", name, "'"), error);
  }
  if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
    const int error = errno;
    close(fd);
    return ErrnoError("fcntl", error);
  }
  return fd;
}

namespace {

// The effective uid of the process at the other end of `socket`.
absl::StatusOr<uid_t> PeerUid(int socket) {
  ucred credentials{};
  socklen_t length = sizeof(credentials);
  if (getsockopt(socket, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) {
    return ErrnoError("SO_PEERCRED", errno);
  }
  return credentials.uid;
}

}  // namespace

absl::Status CheckPeerIsSameUser(int socket, absl::string_view peer, absl::string_view self) {
  absl::StatusOr<uid_t> uid = PeerUid(socket);
  if (uid.ok() && *uid == geteuid()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("the ", peer, " runs as another user (uid ",
                   uid.ok() ? static_cast<int64_t>(*uid) : int64_t{-1}, "; this ", self,
                   " runs as ", geteuid(), ")"));
}

absl::Status SendMessage(int socket, absl::string_view message, int fd) {
  if (message.size() > kMaxMessage) return absl::InvalidArgumentError("message too long");
  iovec part{const_cast<char*>(message.data()), message.size()};
  msghdr header{};
  header.msg_iov = &part;
  header.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    header.msg_control = control;
    header.msg_controllen = sizeof(control);
    cmsghdr* attached = CMSG_FIRSTHDR(&header);
    attached->cmsg_level = SOL_SOCKET;
    attached->cmsg_type = SCM_RIGHTS;
    attached->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(attached), &fd, sizeof(int));
  }
  for (;;) {
    const ssize_t n = sendmsg(socket, &header, MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(message.size())) return absl::OkStatus();
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
      return absl::UnavailableError("the peer closed the socket");
    }
    return ErrnoError("sendmsg", n < 0 ? errno : EIO);
  }
}

absl::StatusOr<std::string> ReceiveMessage(int socket, absl::Duration timeout, int* fd) {
  if (fd != nullptr) *fd = -1;
  pollfd waiting{socket, POLLIN, 0};
  const int ms = static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(timeout)));
  int ready;
  do {
    ready = poll(&waiting, 1, ms);
  } while (ready < 0 && errno == EINTR);
  if (ready < 0) return ErrnoError("poll", errno);
  if (ready == 0) {
    return absl::DeadlineExceededError(absl::StrCat(
        "no message on the shared-memory socket within ", absl::FormatDuration(timeout)));
  }
  std::string message(kMaxMessage, '\0');
  iovec part{message.data(), message.size()};
  msghdr header{};
  header.msg_iov = &part;
  header.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
  header.msg_control = control;
  header.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(socket, &header, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoError("recvmsg", errno);
  // Every descriptor that came is ours to close, wanted or not.
  for (cmsghdr* c = CMSG_FIRSTHDR(&header); c != nullptr; c = CMSG_NXTHDR(&header, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int received;
      std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (fd != nullptr && *fd < 0) {
        *fd = received;
      } else {
        close(received);
      }
    }
  }
  if (n == 0) return absl::UnavailableError("the peer closed the shared-memory socket");
  if (header.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
    if (fd != nullptr && *fd >= 0) {
      close(*fd);
      *fd = -1;
    }
    return absl::InvalidArgumentError("a shared-memory message (or its descriptors) was too long");
  }
  message.resize(static_cast<size_t>(n));
  return message;
}

bool PeerClosed(int socket) {
  pollfd waiting{socket, POLLRDHUP, 0};
  const int ready = poll(&waiting, 1, 0);
  if (ready < 0) return errno != EINTR;
  return (waiting.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace shardopt
