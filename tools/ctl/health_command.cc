#include "tools/ctl/health_command.h"

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/time/clock.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"

namespace shardopt::ctl {

using ::grpc::health::v1::Health;
using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;

int Health(const CommandOptions& options, FILE* out) {
  if (options.servers.empty()) {
    fprintf(out, "shardoptctl health: --servers is required\n");
    return 2;
  }
  int rc = 0;
  for (const std::string& address : options.servers) {
    // No wait_for_ready: a server that is not listening fails the check at
    // once instead of holding it until the deadline.
    auto stub = Health::NewStub(options.channels.NewChannel(address, grpc::ChannelArguments()));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + options.timeout));
    HealthCheckResponse response;
    const grpc::Status s = stub->Check(&context, HealthCheckRequest(), &response);
    if (s.ok() && response.status() == HealthCheckResponse::SERVING) {
      fprintf(out, "%s SERVING\n", address.c_str());
      continue;
    }
    rc = 1;
    if (s.ok()) {
      fprintf(out, "%s not serving: %s\n", address.c_str(),
              HealthCheckResponse::ServingStatus_Name(response.status()).c_str());
    } else {
      fprintf(out, "%s health check failed: %d %s\n", address.c_str(),
              static_cast<int>(s.error_code()), s.error_message().c_str());
    }
  }
  return rc;
}

}  // namespace shardopt::ctl
