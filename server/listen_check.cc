#include "server/listen_check.h"

#include <errno.h>
#include <netdb.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/payload_socket.h"

namespace shardopt {

namespace {

// A Unix socket address (unix:PATH, unix://PATH, unix-abstract:NAME): gRPC
// unlinks a socket file at PATH and binds anew, so a live server there would
// lose its name to this one without a word. In use when a connect succeeds
// (a stale file, refused, is fine: gRPC replaces it).
absl::Status CheckUnixAddressFree(const std::string& listen_address) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::string name;
  bool abstract = false;
  if (absl::StartsWith(listen_address, "unix-abstract:")) {
    name = listen_address.substr(strlen("unix-abstract:"));
    abstract = true;
  } else if (absl::StartsWith(listen_address, "unix://")) {
    name = listen_address.substr(strlen("unix://"));
  } else if (absl::StartsWith(listen_address, "unix:")) {
    name = listen_address.substr(strlen("unix:"));
  } else {
    return absl::InvalidArgumentError(absl::StrCat("cannot listen on '", listen_address,
                                                   "': give unix:PATH or unix-abstract:NAME"));
  }
  // (A path's terminating NUL, or an abstract name's leading one.)
  const size_t room = sizeof(address.sun_path) - 1;
  if (name.empty() || name.size() > room) {
    return absl::InvalidArgumentError(absl::StrCat("cannot listen on '", listen_address,
                                                   "': the socket name must have 1 to ", room,
                                                   " bytes"));
  }
  memcpy(address.sun_path + (abstract ? 1 : 0), name.data(), name.size());
  const socklen_t length =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + (abstract ? 1 : 0) + name.size());
  // Non-blocking: a hung server's full backlog answers EAGAIN at once
  // instead of holding this start forever; it is live too.
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::OkStatus();  // (gRPC will say what is wrong.)
  const bool live = connect(fd, reinterpret_cast<const sockaddr*>(&address), length) == 0 ||
                    errno == EAGAIN || errno == EINPROGRESS;
  close(fd);
  if (live) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen_address,
                     ": a server is listening there (another shard server, or an old one still "
                     "running?)"));
  }
  return absl::OkStatus();
}

}  // namespace

ListenAddressHold::~ListenAddressHold() { Close(); }

ListenAddressHold::ListenAddressHold(ListenAddressHold&& other) noexcept
    : sockets_(std::move(other.sockets_)) {
  other.sockets_.clear();
}

ListenAddressHold& ListenAddressHold::operator=(ListenAddressHold&& other) noexcept {
  if (this != &other) {
    Close();
    sockets_ = std::move(other.sockets_);
    other.sockets_.clear();
  }
  return *this;
}

void ListenAddressHold::Close() {
  for (const int fd : sockets_) close(fd);
  sockets_.clear();
}

absl::StatusOr<ListenAddressHold> HoldListenAddress(const std::string& listen_address) {
  if (IsUnixSocketAddress(listen_address)) {
    if (absl::Status s = CheckUnixAddressFree(listen_address); !s.ok()) return s;
    return ListenAddressHold();
  }
  const size_t colon = listen_address.rfind(':');
  const size_t bracket = listen_address.rfind(']');
  int port = -1;
  if (colon == std::string::npos || (bracket != std::string::npos && colon < bracket) ||
      !absl::SimpleAtoi(absl::string_view(listen_address).substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    // (gRPC would take a default port, or a service name, and fail, if at
    // all, only after the restore.)
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot listen on '", listen_address,
        "': give HOST:PORT, [IPV6]:PORT, :PORT or unix:PATH (port 0 picks a free one)"));
  }
  if (port == 0) return ListenAddressHold();
  const std::string host = HostOfTarget(listen_address);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  if (const int e =
          getaddrinfo(host.empty() || host == "0.0.0.0" || host == "::" ? nullptr : host.c_str(),
                      service.c_str(), &hints, &found);
      e != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen_address, ": ", gai_strerror(e)));
  }
  // Refused when any address's port is taken, or when no address binds at
  // all (one not on this host, a privileged port): gRPC would not listen
  // either. An address family the machine lacks is not tried.
  absl::Status in_use, last_failure;
  int tried = 0;
  ListenAddressHold hold;
  for (addrinfo* a = found; a != nullptr && in_use.ok(); a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    ++tried;
    // As the real listeners set it: a closed connection's TIME_WAIT does not
    // count, only a socket that holds the port; and gRPC's listener binds
    // beside the ones held, which do not listen.
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0) {
      hold.sockets_.push_back(fd);
      continue;
    }
    if (errno == EADDRINUSE) {
      in_use = absl::UnavailableError(
          absl::StrCat("cannot listen on ", listen_address, ": port ", port,
                       " is in use (another shard server, or an old one still running?)"));
    } else {
      last_failure = absl::UnavailableError(
          absl::StrCat("cannot listen on ", listen_address, ": ", strerror(errno)));
    }
    close(fd);
  }
  freeaddrinfo(found);
  if (!in_use.ok()) return in_use;
  if (tried > 0 && hold.sockets() == 0) return last_failure;
  return hold;
}

bool OnlyThisMachineReaches(const std::string& listen_address) {
  if (IsUnixSocketAddress(listen_address)) return true;
  const std::string host = HostOfTarget(listen_address);
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

}  // namespace shardopt
