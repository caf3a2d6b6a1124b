// ShardServer: a running gRPC server hosting one ShardServiceImpl, plus the
// standard grpc.health.v1 health service and server reflection (so grpcurl
// can list and call every method without .proto files), over plaintext or
// TLS (mutual with a client CA), with every call counted by the call
// interceptor; and, with options.metrics_listen, the HTTP /metrics and
// /healthz endpoint.
//
// Start() binds (port 0 picks a free port, reported by port()) and returns
// once the server accepts calls; it refuses a port another socket holds
// (no SO_REUSEPORT sharing), before it restores anything. Shutdown() reports NOT_SERVING (health
// service and /healthz), wakes blocked pulls, stops accepting calls and
// waits for the ones in flight, up to a grace period.
#ifndef SHARDOPT_SERVER_SHARD_SERVER_H_
#define SHARDOPT_SERVER_SHARD_SERVER_H_

#include <grpcpp/server.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/metrics_http.h"
#include "server/shard_service.h"

namespace shardopt {

// Largest gRPC message accepted, both ways: room for a few-MiB chunk plus
// its header, and for a client that picked larger chunks.
inline constexpr int kMaxMessageBytes = 64 << 20;

class ShardServer {
 public:
  static absl::StatusOr<std::unique_ptr<ShardServer>> Start(const std::string& listen_address,
                                                            const ShardServerOptions& options);
  ~ShardServer();

  int port() const { return port_; }
  // The metrics endpoint's port; 0 without one.
  int metrics_port() const;
  // A channel to this server within the process, past the network and TLS
  // (the fuzzers call the service through it).
  std::shared_ptr<grpc::Channel> InProcessChannel();
  void Shutdown(absl::Duration grace = absl::Seconds(5));
  // Blocks until Shutdown() has finished.
  void Wait();

 private:
  ShardServer() = default;

  std::unique_ptr<ShardServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<MetricsHttpServer> metrics_http_;
  int port_ = 0;
  // Set once gRPC serves: /healthz (up since before the restore) says
  // NOT_SERVING until then.
  std::atomic<bool> serving_{false};
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_SHARD_SERVER_H_
