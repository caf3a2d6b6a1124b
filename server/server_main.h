// The shard daemon's whole program (flags, device choice, serving until
// SIGTERM / SIGINT), as a function, so that test binaries can run the
// production server with a FileEnv of their own (tests/support/
// fault_injecting_server.cc) instead of copying it.
//
// Serves shardopt.v1.ShardService, grpc.health.v1.Health and reflection.
// Logs to stderr. SIGTERM / SIGINT shut it down cleanly (blocked pulls get
// UNAVAILABLE, calls in flight get a grace period) and it exits 0.
#ifndef SHARDOPT_SERVER_SERVER_MAIN_H_
#define SHARDOPT_SERVER_SERVER_MAIN_H_

#include <functional>

#include "common/file.h"

namespace shardopt {

// Parses the command line (the server's flags and any other flag linked into
// the binary), then runs the server; returns the process's exit code (0
// after a clean shutdown, 1 when it cannot start, a signal came before it
// served or a second signal ended the shutdown (server/shutdown_signals.h),
// 2 for bad flag values; an unknown flag or a value of the wrong type ends
// the process in Abseil's parser, with 1).
// `file_env`, when set, is called once after the flags are parsed and gives
// the FileEnv that checkpoints and the port file are written through (it
// must live until the process ends); unset, FileEnv::Default().
int RunShardServer(int argc, char** argv, const std::function<FileEnv*()>& file_env = nullptr);

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_SERVER_MAIN_H_
