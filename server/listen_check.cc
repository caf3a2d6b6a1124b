#include "server/listen_check.h"

#include <errno.h>
#include <netdb.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/payload_socket.h"

namespace shardopt {

absl::Status CheckListenAddressFree(const std::string& listen_address) {
  if (absl::StartsWith(listen_address, "unix")) return absl::OkStatus();
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
  if (port == 0) return absl::OkStatus();
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
  int tried = 0, bound = 0;
  for (addrinfo* a = found; a != nullptr && in_use.ok(); a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    ++tried;
    // As the real listeners set it: a closed connection's TIME_WAIT does not
    // count, only a socket that holds the port.
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0) {
      ++bound;
    } else if (errno == EADDRINUSE) {
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
  if (tried > 0 && bound == 0) return last_failure;
  return absl::OkStatus();
}

bool OnlyThisMachineReaches(const std::string& listen_address) {
  if (absl::StartsWith(listen_address, "unix")) return true;
  const std::string host = HostOfTarget(listen_address);
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

}  // namespace shardopt
