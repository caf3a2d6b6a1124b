// MetricsHttpServer: the shard server's plain HTTP endpoint (--metrics_listen)
// for Prometheus and for probes that speak HTTP (Kubernetes, Docker):
//   GET /metrics  the page `render_metrics` makes (Prometheus text format);
//   GET /healthz  200 "SERVING" while `serving` says so, else 503
//                 "NOT_SERVING" (the state gRPC's health service reports).
// Anything else is 404. It carries no state and accepts no writes, so it
// needs no token; bind it where only the monitoring network reaches.
// Start() returns once the port is bound; Stop() (or the destructor) ends
// it and joins its thread.
#ifndef SHARDOPT_SERVER_METRICS_HTTP_H_
#define SHARDOPT_SERVER_METRICS_HTTP_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}

namespace shardopt {

class MetricsHttpServer {
 public:
  // `listen_address` is HOST:PORT (port 0 picks a free one; IPv6 as
  // [ADDR]:PORT). UNAVAILABLE when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& listen_address, std::function<std::string()> render_metrics,
      std::function<bool()> serving);
  ~MetricsHttpServer();

  int port() const { return port_; }
  void Stop();

 private:
  MetricsHttpServer() = default;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  std::atomic<bool> listening_done_{false};
  int port_ = 0;
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_METRICS_HTTP_H_
