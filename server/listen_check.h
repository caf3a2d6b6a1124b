// HoldListenAddress: whether the TCP address a server is about to listen
// on is already taken, asked before the server does anything a refused start
// would have done for nothing (a named restore sets the later checkpoints of
// its model aside); and the port held from then until gRPC listens on it.
// gRPC binds only when it starts serving, and a model must be restored
// before any trainer can reach it, so the restore comes first; a restore
// can take long, and meanwhile the kernel would hand the port, which the
// server's predecessor just freed, to any socket that asks for a free one
// (this server's payload socket, another server's, a trainer's outgoing
// connection) when it lies in the ephemeral range (50051 does).
//
// UNAVAILABLE naming the address when another socket holds its port (a
// listening one: another shard server, a stale process), when the host does
// not resolve, or when none of its addresses binds (not on this machine, a
// privileged port); INVALID_ARGUMENT without a numeric port. An empty hold
// for port 0. A Unix socket (IsUnixSocketAddress, common/payload_socket.h)
// is in use when a connect to it succeeds: gRPC would unlink a live
// server's socket file and take its name; nothing is held for it.
#ifndef SHARDOPT_SERVER_LISTEN_CHECK_H_
#define SHARDOPT_SERVER_LISTEN_CHECK_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardopt {

// The sockets that hold a port: bound with SO_REUSEADDR but not listening,
// so that gRPC's listener (SO_REUSEADDR too) binds beside them, while the
// kernel picks the port for no socket that asks for a free one. Move-only;
// closed when destroyed (once gRPC listens).
class ListenAddressHold {
 public:
  ListenAddressHold() = default;
  ~ListenAddressHold();
  ListenAddressHold(ListenAddressHold&& other) noexcept;
  ListenAddressHold& operator=(ListenAddressHold&& other) noexcept;
  ListenAddressHold(const ListenAddressHold&) = delete;
  ListenAddressHold& operator=(const ListenAddressHold&) = delete;

  size_t sockets() const { return sockets_.size(); }

 private:
  friend absl::StatusOr<ListenAddressHold> HoldListenAddress(const std::string& listen_address);
  void Close();

  std::vector<int> sockets_;
};

// `listen_address` as --listen and --metrics_listen take it: HOST:PORT,
// [IPV6]:PORT, :PORT (every interface) or unix:PATH.
absl::StatusOr<ListenAddressHold> HoldListenAddress(const std::string& listen_address);
// The same, letting the port go at once.
inline absl::Status CheckListenAddressFree(const std::string& listen_address) {
  return HoldListenAddress(listen_address).status();
}

// Whether only this machine can reach `listen_address`: a Unix socket, or a
// loopback host (127.0.0.0/8, ::1, localhost). A server listening elsewhere
// without tokens lets anyone who reaches it train and write files.
bool OnlyThisMachineReaches(const std::string& listen_address);

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_LISTEN_CHECK_H_
