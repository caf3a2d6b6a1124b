// SocketPayloadTransport: the payload-socket PayloadTransport of one shard
// (the README's "Data plane"): the bytes of a push or a pull go over a plain
// TCP connection to the shard's payload socket (common/payload_socket.h,
// server/payload_socket_host.h) instead of HTTP/2 frames in the gRPC
// stream; the call itself, its answer and every rule stay on gRPC.
//
// It keeps a small pool of links to the shard (a push and the overlapped
// pull of a step each take one: separate TCP connections). A link is opened
// by asking the shard's ServerInfo for its port and connecting to the host
// the shard's gRPC address names; a shard without a payload socket (TLS,
// --nopayload_socket) is asked again at most every kRetryInterval, one that
// could not be reached after 250 ms, then doubling up to kRetryInterval,
// and meanwhile it declines (payloads go over the stream).
// A link whose transfer failed is closed (its bytes are the failed
// transfer's); the call then fails UNAVAILABLE so that it is retried. When
// the link itself failed (it stalled, the call's deadline passed on it, the
// peer closed it: UNAVAILABLE or DEADLINE_EXCEEDED), the transport also
// declines for kFailureBackoff, doubling up to kRetryInterval while such
// failures go on (a transfer that completes resets it): the retry goes over
// the gRPC stream rather than wait on a new link that would most likely
// fail the same way. A refusal in the shard's answer is not the link's
// failure, nor is its "still waiting" report (DEADLINE_EXCEEDED before the
// call's deadline). Thread-safe.
#ifndef SHARDOPT_CLIENT_SOCKET_PAYLOAD_TRANSPORT_H_
#define SHARDOPT_CLIENT_SOCKET_PAYLOAD_TRANSPORT_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/payload_transport.h"

namespace shardopt {

class SocketPayloadTransport final : public PayloadTransport {
 public:
  static constexpr absl::Duration kRetryInterval = absl::Seconds(30);
  // A peer that moves no byte for this long (the shard sends empty frames
  // every second while a pull waits for its ranges) fails the transfer.
  static constexpr absl::Duration kStallTimeout = absl::Seconds(10);
  // The first time a failed link sends payloads over the stream (see above).
  static constexpr absl::Duration kFailureBackoff = absl::Seconds(1);

  // To shard `shard_index` at gRPC address `address`.
  SocketPayloadTransport(std::string address, uint32_t shard_index);
  ~SocketPayloadTransport() override;

  const char* name() const override { return "payload socket"; }
  std::optional<absl::Status> Push(const PayloadCall& call, const v1::PushGradientsRequest& header,
                                   const char* payload, size_t element_size,
                                   v1::PushGradientsResponse* response) override;
  std::optional<absl::Status> Pull(const PayloadCall& call,
                                   const v1::PullParametersRequest& request, DType dtype,
                                   float* destination, PulledVersion* pulled) override;
  int64_t transfers() const override { return transfers_.load(std::memory_order_relaxed); }

 private:
  struct Link {
    int socket = -1;
    std::string token;
    bool used = false;  // Some transfer ended cleanly on it.
  };
  // An idle link, or a new one; nullopt: decline.
  std::optional<Link> Take(const PayloadCall& call);
  // After a transfer that ended cleanly: the link serves the next one.
  void Give(Link link);
  // After one that did not: the link is closed. `status` as `call`'s
  // result: UNAVAILABLE (retried, over a new link) when the link broke or
  // the shard no longer holds it.
  absl::Status Broken(Link link, absl::Status status, const PayloadCall& call);
  // A transfer completed: counted, and the failure backoff starts over.
  void Transferred();
  absl::StatusOr<Link> Open(const PayloadCall& call);

  const std::string host_;
  const uint32_t shard_index_;
  absl::Mutex mu_;
  std::vector<Link> idle_ ABSL_GUARDED_BY(mu_);
  uint16_t port_ ABSL_GUARDED_BY(mu_) = 0;  // 0: not known.
  absl::Time retry_after_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Duration open_backoff_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  absl::Duration failure_backoff_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  std::string last_refusal_ ABSL_GUARDED_BY(mu_);
  bool announced_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> next_transfer_;
  std::atomic<int64_t> transfers_{0};
};

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_SOCKET_PAYLOAD_TRANSPORT_H_
