#include "server/shard_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <unistd.h>

#include <algorithm>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/payload_socket.h"
#include "proto/grpc/health/v1/health.pb.h"
#include "server/call_interceptor.h"
#include "server/listen_check.h"
#include "server/reflection_limits.h"

namespace shardopt {
namespace {

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const ShardServerOptions& options) {
  if (options.tls_cert_pem.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions tls(
      options.tls_client_ca_pem.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  tls.pem_root_certs = options.tls_client_ca_pem;
  tls.pem_key_cert_pairs.push_back({options.tls_key_pem, options.tls_cert_pem});
  return grpc::SslServerCredentials(tls);
}

// The address a trial listener takes: an abstract Unix socket of a random
// name, which no trainer dials and which holds no TCP port. Never the served
// port itself: a trial server there for a moment answered UNIMPLEMENTED (it
// has no services) to a trainer retrying through a restart, which ended it;
// and a kernel-picked port could have been that one. HoldListenAddress
// has checked the served port; the trial checks the credentials.
std::string TrialAddress() {
  absl::BitGen random;
  return absl::StrCat("unix-abstract:shardopt-trial-", getpid(), "-",
                      absl::Hex(absl::Uniform<uint64_t>(random), absl::kZeroPad16));
}

// gRPC reads the TLS key and certificate only when it starts serving, after
// the restore: a server started and stopped at once with the credentials
// finds a key that does not match its certificate before the restore changes
// anything. (Plaintext has nothing to find.)
absl::Status TryCredentials(const ShardServerOptions& options) {
  if (options.tls_cert_pem.empty()) return absl::OkStatus();
  grpc::ServerBuilder trial;
  int port = 0;
  trial.AddListeningPort(TrialAddress(), ServerCredentials(options), &port);
  std::unique_ptr<grpc::Server> server = trial.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(
        "cannot serve TLS with these credentials (do --tls_key_file and --tls_cert_file "
        "match?), or the trial listener on an abstract Unix socket could not start; gRPC's log "
        "above says why");
  }
  server->Shutdown(std::chrono::system_clock::now());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardServer>> ShardServer::Start(const std::string& listen_address,
                                                                const ShardServerOptions& options) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  // gRPC's health service has no protobuf descriptors of its own; touching
  // the generated ones links them in, so reflection can describe
  // grpc.health.v1.Health and `grpcurl ... grpc.health.v1.Health/Check` works.
  grpc::health::v1::HealthCheckRequest::descriptor();
  std::unique_ptr<ShardServer> server(new ShardServer());
  // The payload socket listens where gRPC does (every interface for a
  // wildcard address); a server on a Unix socket opens no TCP port.
  ShardServerOptions served = options;
  if (IsUnixSocketAddress(listen_address)) served.payload_socket = false;
  served.payload_socket_host = HostOfTarget(listen_address);
  if (served.payload_socket_host == "0.0.0.0" || served.payload_socket_host == "::") {
    served.payload_socket_host.clear();
  }
  // A start that will be refused is refused before the restore changes
  // anything (a named restore sets later checkpoints aside): the gRPC port
  // is checked free and held until gRPC listens (before the payload socket
  // takes a free port: never this one), the metrics port bound (its
  // /healthz says NOT_SERVING until the end) and the TLS credentials tried.
  absl::StatusOr<ListenAddressHold> held_port = HoldListenAddress(listen_address);
  if (!held_port.ok()) return held_port.status();
  server->service_ = std::make_unique<ShardServiceImpl>(served);
  if (!options.metrics_listen.empty()) {
    ShardServiceImpl* service = server->service_.get();
    ShardServer* self = server.get();
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> http = MetricsHttpServer::Start(
        options.metrics_listen, [service] { return service->RenderMetrics(); },
        [self, service] { return self->serving_.load() && !service->shutting_down(); });
    if (!http.ok()) return http.status();
    server->metrics_http_ = *std::move(http);
  }
  // The hold is no listener: this server's own --metrics_listen or
  // --payload_socket_port naming its gRPC port bound and listens beside it.
  if (absl::Status s = CheckListenAddressFree(listen_address); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(s.message(), "; or is it this server's own ",
                                               "--metrics_listen or --payload_socket_port?"));
  }
  if (absl::Status s = TryCredentials(options); !s.ok()) return s;
  // Restored before the port opens: no trainer sees the shard half-loaded.
  if (!options.restore_from.empty()) {
    if (absl::Status s = server->service_->RestoreFrom(options.restore_from); !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("--restore_from=", options.restore_from, ": ", s.message()));
    }
  }
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen_address, ServerCredentials(options), &server->port_);
  // gRPC sets SO_REUSEPORT by default: a second shard server on this port
  // (an old one still running) would then start too, and the kernel would
  // split the trainers' connections between the two.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(MakeCallInterceptorFactory(server->service_->metrics()));
  const int max_threads = std::max(options.max_threads, 4);
  interceptors.push_back(MakeReflectionLimitsFactory(server->service_->stream_watchdog(),
                                                     MaxOpenReflectionStreams(max_threads)));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  builder.RegisterService(server->service_.get());
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  // Clients ping every 3 s while a call is open (a pull may wait without
  // data; see ConnectionOptions), so that they notice a frozen shard within
  // seconds; accept that rather than answering with GOAWAY. The server pings
  // too, so that it notices a vanished client holding a stream.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 60000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
  grpc::ResourceQuota quota("shardopt_server");
  quota.SetMaxThreads(max_threads);
  builder.SetResourceQuota(quota);
  server->server_ = builder.BuildAndStart();
  *held_port = ListenAddressHold();  // (gRPC listens there now, or could not.)
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen_address));
  }
  server->serving_.store(true);
  return server;
}

ShardServer::~ShardServer() {
  Shutdown(absl::ZeroDuration());
  if (metrics_http_ != nullptr) metrics_http_->Stop();
}

std::shared_ptr<grpc::Channel> ShardServer::InProcessChannel() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  return server_->InProcessChannel(args);
}

int ShardServer::metrics_port() const {
  return metrics_http_ == nullptr ? 0 : metrics_http_->port();
}

void ShardServer::Shutdown(absl::Duration grace) {
  if (server_ == nullptr) return;
  // Drain our own calls first, then give gRPC at most a second to deliver
  // their last statuses: its Shutdown(deadline) also waits for idle client
  // connections to close, which can take the whole grace period for nothing.
  const absl::Time deadline = absl::Now() + grace;
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
    health->SetServingStatus(false);
  }
  service_->Shutdown();
  if (!service_->WaitForIdle(deadline)) {
    LogWarning("calls still in flight after %s; cancelling them", absl::FormatDuration(grace));
  }
  server_->Shutdown(absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Seconds(1))));
}

void ShardServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

}  // namespace shardopt
