// A gRPC server interceptor that bounds server reflection's streams, which
// need no token (so that `grpcurl list` works) and each hold one of the
// server's threads for as long as they stay open (gRPC's reflection service
// is synchronous). Without bounds, anyone who reaches the port could open
// --max_threads of them, send nothing, and leave every trainer's call
// RESOURCE_EXHAUSTED.
//
// A reflection stream beyond `max_open` open at once is cancelled at its
// start; an open one is watched by `watchdog` (cancelled once idle for its
// timeout, as a push stream is). Other calls are not intercepted.
#ifndef SHARDOPT_SERVER_REFLECTION_LIMITS_H_
#define SHARDOPT_SERVER_REFLECTION_LIMITS_H_

#include <grpcpp/support/server_interceptor.h>

#include <memory>

#include "server/stream_watchdog.h"

namespace shardopt {

// More than grpcurl's one per command, run by a few people at once.
inline constexpr int kMaxOpenReflectionStreams = 16;

// `watchdog` must outlive the server.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeReflectionLimitsFactory(StreamWatchdog* watchdog, int max_open = kMaxOpenReflectionStreams);

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_REFLECTION_LIMITS_H_
