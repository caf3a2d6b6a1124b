// `shardoptctl health`: the container health check of a shard server.
//
// Health() calls grpc.health.v1.Health/Check (the whole server: service "")
// on every address in options.servers, each within options.timeout, and
// writes one line per server to `out`: "ADDRESS SERVING", or the serving
// status or call error otherwise. Returns 0 only when every server answered
// SERVING, else 1; 2 when no server is given. A server started with
// --restore_from answers only after its restore, so SERVING also means
// "restored".
#ifndef SHARDOPT_TOOLS_CTL_HEALTH_COMMAND_H_
#define SHARDOPT_TOOLS_CTL_HEALTH_COMMAND_H_

#include <cstdio>

#include "tools/ctl/commands.h"

namespace shardopt::ctl {

int Health(const CommandOptions& options, FILE* out);

}  // namespace shardopt::ctl

#endif  // SHARDOPT_TOOLS_CTL_HEALTH_COMMAND_H_
