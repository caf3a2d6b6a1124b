#include "server/metrics_http.h"

#include <httplib.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"

namespace shardopt {
namespace {

absl::Status SplitHostPort(absl::string_view address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || !absl::SimpleAtoi(address.substr(colon + 1), port) ||
      *port < 0 || *port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", address, "' is not HOST:PORT"));
  }
  absl::string_view h = address.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  *host = std::string(h.empty() ? "0.0.0.0" : h);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen_address, std::function<std::string()> render_metrics,
    std::function<bool()> serving) {
  std::string host;
  int port = 0;
  if (absl::Status s = SplitHostPort(listen_address, &host, &port); !s.ok()) return s;
  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer());
  server->http_ = std::make_unique<httplib::Server>();
  httplib::Server& http = *server->http_;
  // A scraper or prober that stops reading, or keeps its connection open,
  // must not hold a thread for long: probes need one within a second.
  http.set_read_timeout(2, 0);
  http.set_write_timeout(2, 0);
  http.set_keep_alive_max_count(1);
  http.set_keep_alive_timeout(1);
  http.new_task_queue = [] { return new httplib::ThreadPool(4); };
  // Nothing here takes a body. Any method but GET and HEAD is refused (405)
  // before httplib reads its body (whole into memory, unbounded, chunked
  // ones too; a GET's it does not read).
  http.set_pre_routing_handler([](const httplib::Request& request, httplib::Response& response) {
    if (request.method == "GET" || request.method == "HEAD") {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    response.status = 405;
    response.set_header("Allow", "GET, HEAD");
    return httplib::Server::HandlerResponse::Handled;
  });
  http.set_payload_max_length(4096);
  // httplib's default sets SO_REUSEPORT: a second server on this port would
  // bind too, and scrapes would reach either.
  http.set_socket_options([](socket_t socket) {
    const int one = 1;
    setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  });
  http.Get("/metrics", [render = std::move(render_metrics)](const httplib::Request&,
                                                            httplib::Response& response) {
    response.set_content(render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  http.Get("/healthz",
           [serving = std::move(serving)](const httplib::Request&, httplib::Response& response) {
             const bool up = serving();
             response.status = up ? 200 : 503;
             response.set_content(up ? "SERVING\n" : "NOT_SERVING\n", "text/plain");
           });
  server->port_ =
      port == 0 ? http.bind_to_any_port(host) : (http.bind_to_port(host, port) ? port : -1);
  if (server->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen for metrics on ", listen_address));
  }
  MetricsHttpServer* self = server.get();
  server->thread_ = std::thread([self, &http] {
    http.listen_after_bind();
    self->listening_done_.store(true);
  });
  // httplib's stop() does nothing before the loop runs: wait for it, so that
  // a Stop() right after Start() cannot leave the thread listening.
  for (int i = 0; i < 2000 && !http.is_running(); ++i) absl::SleepFor(absl::Milliseconds(1));
  return server;
}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() {
  if (http_ == nullptr || !thread_.joinable()) return;
  // stop() is a no-op until the loop runs: repeat it until the loop ended.
  while (!listening_done_.load()) {
    http_->stop();
    absl::SleepFor(absl::Milliseconds(5));
  }
  thread_.join();
}

}  // namespace shardopt
