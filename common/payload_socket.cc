#include "common/payload_socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/fork_private.h"

namespace shardopt {
namespace {

constexpr char kHelloMagic[] = "SOLINK02";
constexpr char kAcceptedMagic[] = "SOLINKOK";
constexpr uint32_t kFrameMagic = 0x52464f53;  // "SOFR" in little-endian bytes.

void PutLittle(uint64_t value, int bytes, char* out) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}
uint64_t GetLittle(const char* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) {
    value |= static_cast<uint64_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  }
  return value;
}

// Waits until `socket` is ready for `events` within `wait` (measured from
// `last_progress` for the stall bound).
absl::Status AwaitReady(int socket, short events, const SocketWait& wait, absl::Time last_progress,
                        const char* what, size_t done, size_t total) {
  for (;;) {
    if (wait.cancelled && wait.cancelled()) {
      return absl::CancelledError(absl::StrCat(what, " on the payload socket: cancelled after ",
                                               done, " of ", total, " bytes"));
    }
    const absl::Time now = absl::Now();
    const absl::Time stall_end = last_progress + wait.stall;
    const absl::Time until = std::min(wait.deadline, stall_end);
    if (now >= until) {
      return absl::DeadlineExceededError(absl::StrCat(
          what, " on the payload socket: ", done, " of ", total, " bytes moved, then ",
          until == wait.deadline ? "the call's deadline passed"
                                 : absl::StrCat("nothing for ", absl::FormatDuration(wait.stall),
                                                " (the peer froze?)")));
    }
    pollfd p{socket, events, 0};
    const int64_t ms = std::clamp<int64_t>(absl::ToInt64Milliseconds(until - now) + 1, 1, 1000);
    const int n = poll(&p, 1, static_cast<int>(ms));
    if (n > 0) return absl::OkStatus();  // (Errors show in the next call.)
    if (n < 0 && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("poll on the payload socket: ", strerror(errno)));
    }
  }
}

}  // namespace

std::string EncodeHello(absl::string_view link) { return absl::StrCat(kHelloMagic, link); }

absl::StatusOr<std::string> DecodeHello(absl::string_view hello) {
  if (hello.size() != kHelloBytes || !absl::ConsumePrefix(&hello, kHelloMagic)) {
    return absl::InvalidArgumentError("not a payload socket hello");
  }
  for (char c : hello) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError("the hello's link token is not hex");
    }
  }
  return std::string(hello);
}

absl::string_view HelloAccepted() { return kAcceptedMagic; }

void EncodeFrameHeader(const PayloadFrame& frame, char out[kFrameHeaderBytes]) {
  PutLittle(kFrameMagic, 4, out);
  PutLittle(frame.flags, 4, out + 4);
  PutLittle(frame.transfer, 8, out + 8);
  PutLittle(frame.offset, 8, out + 16);
  PutLittle(frame.bytes, 8, out + 24);
}

absl::StatusOr<PayloadFrame> DecodeFrameHeader(const char in[kFrameHeaderBytes]) {
  if (GetLittle(in, 4) != kFrameMagic) {
    return absl::InvalidArgumentError("the payload socket sent something that is not a frame");
  }
  PayloadFrame frame;
  frame.flags = static_cast<uint32_t>(GetLittle(in + 4, 4));
  if (frame.flags != PayloadFrame::kData && frame.flags != PayloadFrame::kEnded) {
    return absl::InvalidArgumentError(
        absl::StrCat("a payload frame with unknown flags ", frame.flags));
  }
  frame.transfer = GetLittle(in + 8, 8);
  frame.offset = GetLittle(in + 16, 8);
  frame.bytes = GetLittle(in + 24, 8);
  // (Bytes after an end would be left on a link that is then reused.)
  if (frame.flags == PayloadFrame::kEnded && frame.bytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a payload end frame that announces ", frame.bytes, " bytes"));
  }
  return frame;
}

absl::Status SendAll(int socket, const char* data, size_t bytes, const SocketWait& wait,
                     bool more) {
  size_t sent = 0;
  absl::Time last_progress = absl::Now();
  while (sent < bytes) {
    const ssize_t n = send(socket, data + sent, bytes - sent,
                           MSG_NOSIGNAL | MSG_DONTWAIT | (more ? MSG_MORE : 0));
    if (n > 0) {
      sent += static_cast<size_t>(n);
      last_progress = absl::Now();
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (absl::Status s = AwaitReady(socket, POLLOUT, wait, last_progress, "sending", sent, bytes);
          !s.ok()) {
        return s;
      }
      continue;
    }
    return absl::UnavailableError(absl::StrCat("the payload socket's peer went away after ", sent,
                                               " of ", bytes, " bytes: ", strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status ReceiveAll(int socket, char* data, size_t bytes, const SocketWait& wait) {
  size_t received = 0;
  absl::Time last_progress = absl::Now();
  while (received < bytes) {
    const ssize_t n = recv(socket, data + received, bytes - received, MSG_DONTWAIT);
    if (n > 0) {
      received += static_cast<size_t>(n);
      last_progress = absl::Now();
      continue;
    }
    if (n == 0) {
      return absl::UnavailableError(absl::StrCat("the payload socket's peer closed it after ",
                                                 received, " of ", bytes, " bytes"));
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (absl::Status s =
              AwaitReady(socket, POLLIN, wait, last_progress, "receiving", received, bytes);
          !s.ok()) {
        return s;
      }
      continue;
    }
    return absl::UnavailableError(absl::StrCat("the payload socket failed after ", received, " of ",
                                               bytes, " bytes: ", strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status SendFrame(int socket, const PayloadFrame& frame, const char* data,
                       const SocketWait& wait) {
  char head[kFrameHeaderBytes];
  EncodeFrameHeader(frame, head);
  absl::Status s = SendAll(socket, head, sizeof(head), wait, /*more=*/frame.bytes > 0);
  if (s.ok() && frame.bytes > 0) s = SendAll(socket, data, frame.bytes, wait);
  return s;
}

absl::StatusOr<PayloadFrame> ReceiveFrameHeader(int socket, const SocketWait& wait) {
  char head[kFrameHeaderBytes];
  if (absl::Status s = ReceiveAll(socket, head, sizeof(head), wait); !s.ok()) return s;
  return DecodeFrameHeader(head);
}

absl::StatusOr<TcpListener> ListenTcp(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  if (const int e =
          getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
      e != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload socket: cannot listen on '", host, "': ", gai_strerror(e)));
  }
  absl::Status last = absl::UnavailableError("no address");
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_storage bound{};
    socklen_t length = sizeof(bound);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) == 0) {
      const uint16_t bound_port =
          ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
      freeaddrinfo(found);
      return TcpListener{fd, bound_port};
    }
    last = absl::UnavailableError(absl::StrCat("payload socket: cannot listen on '", host,
                                               "' port ", port, ": ", strerror(errno)));
    close(fd);
  }
  freeaddrinfo(found);
  return last;
}

void ConfigureLinkSocket(int socket) {
  const int one = 1;
  setsockopt(socket, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(socket, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  setsockopt(socket, IPPROTO_TCP, TCP_KEEPIDLE, &kLinkKeepaliveIdleSeconds,
             sizeof(kLinkKeepaliveIdleSeconds));
  setsockopt(socket, IPPROTO_TCP, TCP_KEEPINTVL, &kLinkKeepaliveIntervalSeconds,
             sizeof(kLinkKeepaliveIntervalSeconds));
  const unsigned int unanswered_ms =
      static_cast<unsigned int>(absl::ToInt64Milliseconds(kLinkUnansweredTimeout));
  setsockopt(socket, IPPROTO_TCP, TCP_USER_TIMEOUT, &unanswered_ms, sizeof(unanswered_ms));
}

bool ReadableOrClosed(int socket) {
  pollfd p{socket, POLLIN | POLLRDHUP, 0};
  return poll(&p, 1, 0) != 0;
}

absl::StatusOr<int> ConnectTcp(const std::string& host, uint16_t port, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  if (const int e = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); e != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve '", host, "': ", gai_strerror(e)));
  }
  absl::Status last = absl::UnavailableError("no address");
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int error = 0;
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      error = errno;
      if (error == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        const int64_t ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
        socklen_t length = sizeof(error);
        if (poll(&p, 1, static_cast<int>(ms)) <= 0) {
          error = ETIMEDOUT;
        } else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0) {
          error = errno;
        }
      }
    }
    if (error == 0) {
      freeaddrinfo(found);
      const int flags = fcntl(fd, F_GETFL);
      fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
      ConfigureLinkSocket(fd);
      return fd;
    }
    last = absl::UnavailableError(
        absl::StrCat("cannot connect to ", host, ":", port, ": ", strerror(error)));
    close(fd);
  }
  freeaddrinfo(found);
  return last;
}

absl::StatusOr<int> OpenLink(const std::string& host, uint16_t port, absl::string_view token,
                             absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<int> socket = ConnectTcp(host, port, timeout);
  if (!socket.ok()) return socket.status();
  // At once, not after the hello: a child forked during the handshake must
  // not keep the link either.
  MarkForkPrivate(*socket);
  const std::string hello = EncodeHello(token);
  SocketWait wait;
  wait.deadline = deadline;
  char answer[kHelloAnswerBytes];
  absl::Status s = SendAll(*socket, hello.data(), hello.size(), wait);
  if (s.ok()) s = ReceiveAll(*socket, answer, sizeof(answer), wait);
  if (s.ok() && absl::string_view(answer, sizeof(answer)) != HelloAccepted()) {
    s = absl::UnavailableError("the shard's payload socket did not accept the link");
  }
  if (!s.ok()) {
    CloseForkPrivate(*socket);
    return s;
  }
  return *socket;
}

bool IsUnixSocketAddress(absl::string_view target) {
  return absl::StartsWith(target, "unix:") || absl::StartsWith(target, "unix-abstract:");
}

std::string HostOfTarget(absl::string_view target) {
  if (IsUnixSocketAddress(target)) return "";
  for (absl::string_view scheme : {"dns:///", "dns:", "ipv4:", "ipv6:"}) {
    if (absl::ConsumePrefix(&target, scheme)) break;
  }
  if (absl::ConsumePrefix(&target, "[")) {
    const size_t end = target.find(']');
    return end == absl::string_view::npos ? "" : std::string(target.substr(0, end));
  }
  const size_t colon = target.rfind(':');
  if (colon == absl::string_view::npos) return std::string(target);
  return std::string(target.substr(0, colon));
}

}  // namespace shardopt
