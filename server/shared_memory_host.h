// SharedMemoryHost: where trainers on this server's host attach their shared
// segments (common/shared_memory.h) to it.
//
// It listens on a Unix socket in the abstract namespace under a random name,
// which ServerInfo.shared_memory_socket tells trainers. A trainer connects
// and sends "attach <bytes>" with its segment's descriptor; the host checks
// that the peer runs as this server's user and that the segment is sealed and
// of that size, maps it, and answers "ok <attachment>" (a random id), else
// "error <why>". The connection then stays open and silent: when the trainer
// closes it, exits or is killed, the attachment is dropped (calls holding it
// keep their mapping until they end, then it is unmapped), and when this
// server exits the trainer sees its end close. Pushes and pulls name the
// attachment and a byte range in it (PushHeader.shared_memory). One
// background thread serves the socket; Find is thread-safe.
#ifndef SHARDOPT_SERVER_SHARED_MEMORY_HOST_H_
#define SHARDOPT_SERVER_SHARED_MEMORY_HOST_H_

#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/shared_memory.h"

namespace shardopt {

class SharedMemoryHost {
 public:
  // A trainer that connects but does not say what it attaches is let go
  // after this.
  static constexpr absl::Duration kAttachMessageTimeout = absl::Seconds(10);

  // Listens and starts serving attachments.
  static absl::StatusOr<std::unique_ptr<SharedMemoryHost>> Start();
  // Stops serving and drops every attachment.
  ~SharedMemoryHost();

  const std::string& socket_name() const { return socket_name_; }
  // The segment of `attachment`; FAILED_PRECONDITION naming it when it is
  // not open here (its trainer detached, or this server restarted since).
  absl::StatusOr<std::shared_ptr<const SharedSegment>> Find(absl::string_view attachment) const;
  // Attachments open now.
  size_t attachments() const;

 private:
  SharedMemoryHost(std::string socket_name, int listen_fd, int wake_fd);
  void Serve();
  // A trainer's first message: answered, and the connection either kept
  // (attached) or closed.
  void Admit(int connection);
  // Answers "error <why>" and closes the connection.
  void Refuse(int connection, absl::string_view why);
  void Drop(int connection);
  // Closes the connections whose attach message is overdue. Serve()'s
  // thread.
  void ExpirePending(absl::Time now);

  const std::string socket_name_;
  const int listen_fd_;
  const int wake_fd_;  // An eventfd that ends Serve().
  // Connections that have not sent their attach message yet, and when they
  // are given up.
  std::map<int, absl::Time> pending_;  // Serve()'s thread only.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, std::string> attachment_of_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<const SharedSegment>> segments_
      ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_SHARED_MEMORY_HOST_H_
