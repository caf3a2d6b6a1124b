// PayloadSocketHost: where trainers that reach this server over plaintext
// open their payload sockets (common/payload_socket.h has the wire format).
//
// It listens on a TCP port of the gRPC listener's host, which
// ServerInfo.payload_socket_port tells trainers. A connection's hello names
// a link token the trainer drew; the host answers and keeps the connection
// as that link, until the trainer closes it (or exits, or is killed) or a
// transfer on it broke off half way. A push or a pull whose gRPC call names
// the link takes it for its transfer (Acquire): one transfer at a time, so
// that the bytes on the socket are always the transfer's. The gRPC call is
// authorised as any other; the socket itself proves nothing but knowledge
// of the random token, which only the trainer and its authorised calls
// carry; so that strangers cannot hold the server's descriptors, a link no
// call has named within kUnclaimedTimeout is closed, and links no call has
// named yet are capped like pending hellos. One background thread accepts,
// reads hellos and watches idle links; Acquire is thread-safe.
#ifndef SHARDOPT_SERVER_PAYLOAD_SOCKET_HOST_H_
#define SHARDOPT_SERVER_PAYLOAD_SOCKET_HOST_H_

#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shardopt {

class PayloadSocketHost {
 public:
  static constexpr absl::Duration kUnclaimedTimeout = absl::Seconds(10);
  // A connection that does not say which link it is within this is let go.
  static constexpr absl::Duration kHelloTimeout = absl::Seconds(10);

  // Listens on `host` (an address; empty: every interface) at `port` (0: a
  // free one) and starts serving links.
  static absl::StatusOr<std::unique_ptr<PayloadSocketHost>> Start(const std::string& host,
                                                                  uint16_t port = 0);
  // Stops serving and closes every link (transfers holding one end with it).
  ~PayloadSocketHost();

  uint16_t port() const { return port_; }
  size_t links() const;

  struct Link;
  // One transfer's hold on a link. Ending it without Finished() (a transfer
  // that failed or broke off half way) closes the link: what is left on the
  // socket is not the next transfer's. Must end before the host does (calls
  // hold leases; the service outlives its calls).
  class Lease {
   public:
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&&) = delete;
    ~Lease();
    int socket() const;
    // The transfer ended cleanly: the link serves the next one.
    void Finished() { finished_ = true; }

   private:
    friend class PayloadSocketHost;
    Lease(PayloadSocketHost* host, std::shared_ptr<Link> link)
        : host_(host), link_(std::move(link)) {}
    PayloadSocketHost* host_;
    std::shared_ptr<Link> link_;
    bool finished_ = false;
  };
  // The link named `link` for one transfer: FAILED_PRECONDITION when it is
  // not open here (saying kLinkNotOpen) or another transfer holds it.
  absl::StatusOr<Lease> Acquire(absl::string_view link);
  // Marks `link` as named by a call that will acquire it later (a pull that
  // waits for its version first), so that it is not closed as unclaimed;
  // FAILED_PRECONDITION (kLinkNotOpen) when it is not open here.
  absl::Status Claim(absl::string_view link);

 private:
  PayloadSocketHost(int listen_fd, uint16_t port, int wake_fd)
      : listen_fd_(listen_fd), port_(port), wake_fd_(wake_fd) {}
  void Serve();
  // The open link named `link`, marked claimed (a call named it);
  // FAILED_PRECONDITION saying kLinkNotOpen when there is none.
  absl::StatusOr<std::shared_ptr<Link>> Find(absl::string_view link)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads what came of a pending connection's hello; admits or closes it.
  void ReadHello(int connection);
  // Closes the pending connections whose hello is overdue and the links no
  // call named within kUnclaimedTimeout. Serve()'s thread.
  void ExpireOverdue(absl::Time now);
  // Ends `link`: out of the map, its socket shut down (closed once the
  // last holder lets go).
  void Close(const std::shared_ptr<Link>& link) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int listen_fd_;
  const uint16_t port_;
  const int wake_fd_;  // An eventfd that ends Serve().
  struct Pending {
    std::string hello;
    absl::Time give_up;
  };
  std::map<int, Pending> pending_;  // Serve()'s thread only.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Link>> links_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_PAYLOAD_SOCKET_HOST_H_
