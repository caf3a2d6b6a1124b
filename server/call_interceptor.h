// A gRPC server interceptor on every call of a shard server (ShardService,
// health, reflection): records each finished call's method, status code and
// duration in ServerMetrics, and answers a request that does not parse with
// INVALID_ARGUMENT instead of gRPC's bare INTERNAL.
//
// Why here: gRPC's synchronous server parses a unary request before the
// handler runs, and answers a message that does not parse with INTERNAL and
// an empty message; the handler never sees it. The service never answers
// INTERNAL without a message (every error of its own says what failed), so
// that pair, on a method of shardopt's service, is a request that did not
// parse.
#ifndef SHARDOPT_SERVER_CALL_INTERCEPTOR_H_
#define SHARDOPT_SERVER_CALL_INTERCEPTOR_H_

#include <grpcpp/support/server_interceptor.h>

#include <memory>

#include "server/metrics.h"

namespace shardopt {

// `metrics` must outlive the server.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeCallInterceptorFactory(
    ServerMetrics* metrics);

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_CALL_INTERCEPTOR_H_
