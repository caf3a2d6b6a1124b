#include "server/shared_memory_host.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "server/serve_poll.h"

namespace shardopt {
namespace {

// Connections that have not said what they attach yet.
constexpr size_t kMaxPending = 256;
// Far more than any model; a bound so that a bad announcement fails cleanly.
constexpr uint64_t kMaxSegmentBytes = uint64_t{1} << 42;

}  // namespace

absl::StatusOr<std::unique_ptr<SharedMemoryHost>> SharedMemoryHost::Start() {
  const std::string name = absl::StrCat("shardopt-shm-", RandomHexToken(16));
  absl::StatusOr<int> listen_fd = ListenAbstract(name);
  if (!listen_fd.ok()) return listen_fd.status();
  const int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0) {
    close(*listen_fd);
    return absl::InternalError("eventfd failed");
  }
  std::unique_ptr<SharedMemoryHost> host(new SharedMemoryHost(name, *listen_fd, wake_fd));
  host->thread_ = std::thread([h = host.get()] { h->Serve(); });
  return host;
}

SharedMemoryHost::SharedMemoryHost(std::string socket_name, int listen_fd, int wake_fd)
    : socket_name_(std::move(socket_name)), listen_fd_(listen_fd), wake_fd_(wake_fd) {}

SharedMemoryHost::~SharedMemoryHost() {
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) < 0) {
    // (Only fails when the counter is full: Serve() is waking anyway.)
  }
  if (thread_.joinable()) thread_.join();
  for (const auto& [connection, unused] : pending_) close(connection);
  absl::MutexLock lock(&mu_);
  for (const auto& [connection, unused] : attachment_of_) close(connection);
  close(listen_fd_);
  close(wake_fd_);
}

absl::StatusOr<std::shared_ptr<const SharedSegment>> SharedMemoryHost::Find(
    absl::string_view attachment) const {
  absl::MutexLock lock(&mu_);
  auto it = segments_.find(attachment);
  if (it == segments_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared-memory attachment '", attachment.substr(0, 64), "' ",
                     kAttachmentNotOpen, " (its trainer detached, or the shard restarted since)"));
  }
  return it->second;
}

size_t SharedMemoryHost::attachments() const {
  absl::MutexLock lock(&mu_);
  return segments_.size();
}

void SharedMemoryHost::Serve() {
  ServePoll poller("shared memory", wake_fd_);
  for (;;) {
    std::vector<pollfd> watched = {{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    for (const auto& [connection, unused] : pending_) watched.push_back({connection, POLLIN, 0});
    {
      absl::MutexLock lock(&mu_);
      // Attached connections stay silent: anything on them is the trainer
      // going away.
      for (const auto& [connection, unused] : attachment_of_) {
        watched.push_back({connection, POLLIN | POLLRDHUP, 0});
      }
    }
    const ServePoll::Result polled = poller.Poll(watched, 1000);
    if (polled == ServePoll::Result::kStop) return;
    if (polled == ServePoll::Result::kAgain) {
      ExpirePending(absl::Now());
      continue;
    }
    if (watched[0].revents != 0) return;
    if (watched[1].revents & POLLIN) {
      for (;;) {
        const int connection = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (connection < 0) {
          // Out of descriptors: the connection stays queued; do not spin on it.
          if (errno == EMFILE || errno == ENFILE) absl::SleepFor(absl::Milliseconds(50));
          break;
        }
        // Other users, and more would-be trainers than any job has at once,
        // are let go before they cost more than this descriptor.
        if (absl::Status same = CheckPeerIsSameUser(connection, "trainer", "shard"); !same.ok()) {
          Refuse(connection, same.message());
        } else if (pending_.size() >= kMaxPending) {
          Refuse(connection, "too many trainers are attaching at once; try again");
        } else {
          pending_[connection] = absl::Now() + kAttachMessageTimeout;
        }
      }
    }
    for (size_t i = 2; i < watched.size(); ++i) {
      if (watched[i].revents == 0) continue;
      const int connection = watched[i].fd;
      if (pending_.count(connection)) {
        Admit(connection);
      } else {
        Drop(connection);
      }
    }
    ExpirePending(absl::Now());
  }
}

void SharedMemoryHost::ExpirePending(absl::Time now) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second < now) {
      close(it->first);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
}

void SharedMemoryHost::Admit(int connection) {
  pending_.erase(connection);
  int fd = -1;
  absl::StatusOr<std::string> message = ReceiveMessage(connection, absl::ZeroDuration(), &fd);
  auto refuse = [&](absl::string_view why) {
    if (fd >= 0) close(fd);
    Refuse(connection, why);
  };
  if (!message.ok()) {
    refuse(message.status().message());
    return;
  }
  absl::string_view text = *message;
  uint64_t bytes = 0;
  if (!absl::ConsumePrefix(&text, "attach ") || !absl::SimpleAtoi(text, &bytes) || bytes == 0 ||
      bytes > kMaxSegmentBytes) {
    refuse("expected 'attach <bytes>'");
    return;
  }
  if (fd < 0) {
    refuse("the attach message carried no segment");
    return;
  }
  absl::StatusOr<SharedSegment> segment = SharedSegment::Map(fd, bytes);
  fd = -1;  // Map took it over.
  if (!segment.ok()) {
    refuse(segment.status().message());
    return;
  }
  // Open before the trainer hears of it: its next call may name it at once.
  const std::string attachment = RandomHexToken(16);
  {
    absl::MutexLock lock(&mu_);
    attachment_of_[connection] = attachment;
    segments_[attachment] = std::make_shared<const SharedSegment>(*std::move(segment));
  }
  if (!SendMessage(connection, absl::StrCat("ok ", attachment)).ok()) Drop(connection);
}

void SharedMemoryHost::Refuse(int connection, absl::string_view why) {
  SendMessage(connection, absl::StrCat("error ", why)).IgnoreError();
  close(connection);
}

void SharedMemoryHost::Drop(int connection) {
  absl::MutexLock lock(&mu_);
  auto it = attachment_of_.find(connection);
  if (it == attachment_of_.end()) return;
  segments_.erase(it->second);
  attachment_of_.erase(it);
  close(connection);
}

}  // namespace shardopt
