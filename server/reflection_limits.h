// A gRPC server interceptor that bounds server reflection's streams, which
// need no token (so that `grpcurl list` works) and each hold one of the
// server's threads for as long as they stay open (gRPC's reflection service
// is synchronous). Without bounds, anyone who reaches the port could open
// --max_threads of them, send nothing, and leave every trainer's call
// RESOURCE_EXHAUSTED.
//
// A reflection stream beyond `max_open` open at once is cancelled at its
// start (so that the trainers keep most threads however long the admitted
// ones stay); an open one is watched by `watchdog` (cancelled once idle for
// its timeout, as a push stream is) until its status is sent. Other calls
// are not intercepted.
#ifndef SHARDOPT_SERVER_REFLECTION_LIMITS_H_
#define SHARDOPT_SERVER_REFLECTION_LIMITS_H_

#include <grpcpp/support/server_interceptor.h>

#include <memory>

#include "server/stream_watchdog.h"

namespace shardopt {

// How many reflection streams may be open at once on a server of
// `max_threads` call threads: a quarter of them, at most 16 (more than
// grpcurl's one per command, run by a few people at once), at least 1.
int MaxOpenReflectionStreams(int max_threads);

// `watchdog` must outlive the server.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeReflectionLimitsFactory(
    StreamWatchdog* watchdog, int max_open);

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_REFLECTION_LIMITS_H_
