#include "server/payload_socket_host.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/payload_socket.h"
#include "server/serve_poll.h"

namespace shardopt {
namespace {

// Bounds on what strangers can make the host hold: connections without a
// hello, and links no call has named yet.
constexpr size_t kMaxPending = 256;
constexpr size_t kMaxUnclaimed = 256;

// Links in all: a quarter of the descriptors this process may open, so that
// gRPC's connections and checkpoint files keep the rest.
size_t MaxLinks() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 4096;
  return std::max<size_t>(16, std::min<size_t>(4096, limit.rlim_cur / 4));
}

}  // namespace

struct PayloadSocketHost::Link {
  Link(int fd, std::string token) : fd(fd), token(std::move(token)), opened(absl::Now()) {}
  ~Link() { close(fd); }
  const int fd;
  const std::string token;
  const absl::Time opened;
  // Guarded by the host's mu_.
  bool busy = false;
  bool claimed = false;  // Some call named it.
};

absl::StatusOr<std::unique_ptr<PayloadSocketHost>> PayloadSocketHost::Start(const std::string& host,
                                                                            uint16_t port) {
  absl::StatusOr<TcpListener> listener = ListenTcp(host, port);
  if (!listener.ok()) return listener.status();
  const int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0) {
    close(listener->fd);
    return absl::InternalError("eventfd failed");
  }
  std::unique_ptr<PayloadSocketHost> served(
      new PayloadSocketHost(listener->fd, listener->port, wake_fd));
  served->thread_ = std::thread([h = served.get()] { h->Serve(); });
  return served;
}

PayloadSocketHost::~PayloadSocketHost() {
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) < 0) {
    // (Only fails when the counter is full: Serve() is waking anyway.)
  }
  if (thread_.joinable()) thread_.join();
  for (const auto& [connection, unused] : pending_) close(connection);
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [token, link] : links_) shutdown(link->fd, SHUT_RDWR);
    links_.clear();
  }
  close(listen_fd_);
  close(wake_fd_);
}

size_t PayloadSocketHost::links() const {
  absl::MutexLock lock(&mu_);
  return links_.size();
}

PayloadSocketHost::Lease::Lease(Lease&& other) noexcept
    : host_(other.host_), link_(std::move(other.link_)), finished_(other.finished_) {
  other.link_.reset();
}

PayloadSocketHost::Lease::~Lease() {
  if (link_ == nullptr) return;
  absl::MutexLock lock(&host_->mu_);
  link_->busy = false;
  if (!finished_) host_->Close(link_);
}

int PayloadSocketHost::Lease::socket() const { return link_->fd; }

absl::StatusOr<std::shared_ptr<PayloadSocketHost::Link>> PayloadSocketHost::Find(
    absl::string_view link) {
  auto it = links_.find(link);
  if (it == links_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("payload socket link '", link.substr(0, 64), "' ", kLinkNotOpen,
                     " (its trainer closed it, or the shard restarted since)"));
  }
  it->second->claimed = true;
  return it->second;
}

absl::StatusOr<PayloadSocketHost::Lease> PayloadSocketHost::Acquire(absl::string_view link) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::shared_ptr<Link>> found = Find(link);
  if (!found.ok()) return found.status();
  if ((*found)->busy) {
    return absl::FailedPreconditionError(
        absl::StrCat("payload socket link '", link.substr(0, 64),
                     "' carries another transfer now (one at a time per link)"));
  }
  (*found)->busy = true;
  return Lease(this, *std::move(found));
}

absl::Status PayloadSocketHost::Claim(absl::string_view link) {
  absl::MutexLock lock(&mu_);
  return Find(link).status();
}

void PayloadSocketHost::Close(const std::shared_ptr<Link>& link) {
  auto it = links_.find(link->token);
  if (it != links_.end() && it->second == link) links_.erase(it);
  // Now, not when the last holder lets go: a peer still sending learns at once.
  shutdown(link->fd, SHUT_RDWR);
}

void PayloadSocketHost::Serve() {
  ServePoll poller("payload socket", wake_fd_);
  for (;;) {
    std::vector<pollfd> watched = {{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    for (const auto& [connection, unused] : pending_) watched.push_back({connection, POLLIN, 0});
    const size_t first_link = watched.size();
    // Held while polled, so that no descriptor is closed (and reused) under
    // the poll.
    std::vector<std::shared_ptr<Link>> idle;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [token, link] : links_) {
        // Only a hang-up is watched: the bytes of a transfer about to be
        // acquired may already be waiting.
        idle.push_back(link);
        watched.push_back({link->fd, POLLRDHUP, 0});
      }
    }
    const ServePoll::Result polled = poller.Poll(watched, 1000);
    if (polled == ServePoll::Result::kStop) return;
    if (polled == ServePoll::Result::kAgain) {
      ExpireOverdue(absl::Now());
      continue;
    }
    if (watched[0].revents != 0) return;
    if (watched[1].revents & POLLIN) {
      for (;;) {
        const int connection = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (connection < 0) {
          if (errno == EMFILE || errno == ENFILE) absl::SleepFor(absl::Milliseconds(50));
          break;
        }
        ConfigureLinkSocket(connection);
        if (pending_.size() >= kMaxPending) {
          close(connection);
        } else {
          pending_[connection] = Pending{"", absl::Now() + kHelloTimeout};
        }
      }
    }
    for (size_t i = 2; i < first_link; ++i) {
      if (watched[i].revents != 0) ReadHello(watched[i].fd);
    }
    {
      absl::MutexLock lock(&mu_);
      for (size_t i = first_link; i < watched.size(); ++i) {
        // (A transfer holding it sees the end itself.)
        if (watched[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) Close(idle[i - first_link]);
      }
    }
    ExpireOverdue(absl::Now());
  }
}

void PayloadSocketHost::ExpireOverdue(absl::Time now) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.give_up < now) {
      close(it->first);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Link>> unclaimed;
  for (const auto& [token, link] : links_) {
    if (!link->claimed && now - link->opened > kUnclaimedTimeout) unclaimed.push_back(link);
  }
  for (const std::shared_ptr<Link>& link : unclaimed) Close(link);
}

void PayloadSocketHost::ReadHello(int connection) {
  Pending& pending = pending_[connection];
  char buffer[kHelloBytes];
  const size_t wanted = kHelloBytes - pending.hello.size();
  const ssize_t n = recv(connection, buffer, wanted, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) {
    close(connection);
    pending_.erase(connection);
    return;
  }
  pending.hello.append(buffer, static_cast<size_t>(n));
  if (pending.hello.size() < kHelloBytes) return;
  absl::StatusOr<std::string> token = DecodeHello(pending.hello);
  pending_.erase(connection);
  if (!token.ok()) {
    close(connection);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    size_t unclaimed = 0;
    for (const auto& [unused, link] : links_) unclaimed += link->claimed ? 0 : 1;
    if (links_.size() >= MaxLinks() || unclaimed >= kMaxUnclaimed || links_.count(*token)) {
      close(connection);
      return;
    }
    // Open before the trainer hears of it: its next call may name it at once.
    links_[*token] = std::make_shared<Link>(connection, *token);
  }
  const absl::string_view accepted = HelloAccepted();
  if (send(connection, accepted.data(), accepted.size(), MSG_NOSIGNAL | MSG_DONTWAIT) !=
      static_cast<ssize_t>(accepted.size())) {
    absl::MutexLock lock(&mu_);
    auto it = links_.find(*token);
    if (it != links_.end()) Close(it->second);
  }
}

}  // namespace shardopt
