// CheckListenAddressFree: whether the TCP address a server is about to listen
// on is already taken, asked before the server does anything a refused start
// would have done for nothing (a named restore sets the later checkpoints of
// its model aside). gRPC binds only when it starts serving, and a model must
// be restored before any trainer can reach it, so the restore comes first.
//
// UNAVAILABLE naming the address when another socket holds its port (a
// listening one: another shard server, a stale process), when the host does
// not resolve, or when none of its addresses binds (not on this machine, a
// privileged port); INVALID_ARGUMENT without a numeric port. OK for port 0.
// A Unix socket (IsUnixSocketAddress, common/payload_socket.h) is in use when
// a connect to it succeeds: gRPC would unlink a live server's socket file
// and take its name. The port can still be taken between this check and the
// real bind.
#ifndef SHARDOPT_SERVER_LISTEN_CHECK_H_
#define SHARDOPT_SERVER_LISTEN_CHECK_H_

#include <string>

#include "absl/status/status.h"

namespace shardopt {

// `listen_address` as --listen and --metrics_listen take it: HOST:PORT,
// [IPV6]:PORT, :PORT (every interface) or unix:PATH.
absl::Status CheckListenAddressFree(const std::string& listen_address);

// Whether only this machine can reach `listen_address`: a Unix socket, or a
// loopback host (127.0.0.0/8, ::1, localhost). A server listening elsewhere
// without tokens lets anyone who reaches it train and write files.
bool OnlyThisMachineReaches(const std::string& listen_address);

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_LISTEN_CHECK_H_
