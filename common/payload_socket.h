// The payload socket's wire format and its bounded I/O: the one place both
// ends (client/socket_payload_transport.h, server/payload_socket_host.h)
// take it from.
//
// A trainer opens a plain TCP connection to the port a server's ServerInfo
// names and sends a hello: the 8 bytes "SOLINK02" and a link token of
// kLinkTokenChars hex characters it drew at random. The server answers the
// 8 bytes "SOLINKOK" (or closes the connection). From then on the
// connection carries data frames, each a 32-byte header (little-endian:
// magic "SOFR", flags, transfer, byte offset in the transfer, byte count)
// and that many bytes. A gRPC call names the link and the transfer
// (v1::SocketPayload); a frame of another transfer ends the link. A
// transfer's bytes go in pieces of kSocketPieceBytes (the last shorter),
// one frame each, so that the receiver checks every piece where it lands
// and the sender hands the kernel a piece at a time (steps whose push went
// as one frame of 64 or 256 MiB took 2-5% longer on loopback). Builds that
// sent a push as one frame said "SOLINK01": either end refuses the other's
// hello, and their payloads take the gRPC stream.
//
// Every wait is bounded twice: by the call's deadline, and by a stall
// timeout (no byte moved for that long: a peer that froze). Sends never
// raise SIGPIPE.
#ifndef SHARDOPT_COMMON_PAYLOAD_SOCKET_H_
#define SHARDOPT_COMMON_PAYLOAD_SOCKET_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace shardopt {

inline constexpr size_t kLinkTokenChars = 32;
// What a server's refusal of a link it does not hold says (the client
// recognises it and opens a new link).
inline constexpr char kLinkNotOpen[] = "is not open on this shard";
inline constexpr size_t kHelloBytes = 8 + kLinkTokenChars;
inline constexpr size_t kHelloAnswerBytes = 8;
inline constexpr size_t kFrameHeaderBytes = 32;
// A whole number of elements of every wire type.
inline constexpr uint64_t kSocketPieceBytes = uint64_t{1} << 20;

// A link's hello, and the link token in one (INVALID_ARGUMENT when it is
// not a hello).
std::string EncodeHello(absl::string_view link);
absl::StatusOr<std::string> DecodeHello(absl::string_view hello);
// The server's answer to a hello it accepted.
absl::string_view HelloAccepted();

struct PayloadFrame {
  // kEnded: the sender ends the transfer without (more) data; the call's
  // status says why.
  static constexpr uint32_t kData = 0;
  static constexpr uint32_t kEnded = 1;
  uint32_t flags = kData;
  uint64_t transfer = 0;
  uint64_t offset = 0;  // Bytes of the transfer before this frame's.
  uint64_t bytes = 0;   // That follow the header (0: a frame that only
                        // says the sender is alive).
};
void EncodeFrameHeader(const PayloadFrame& frame, char out[kFrameHeaderBytes]);
// INVALID_ARGUMENT when the magic or the flags are wrong.
absl::StatusOr<PayloadFrame> DecodeFrameHeader(const char in[kFrameHeaderBytes]);

// How long a blocking transfer may take: until `deadline`, no longer than
// `stall` without a byte moving, and until `cancelled` (polled at least
// every second) says so.
struct SocketWait {
  absl::Time deadline = absl::InfiniteFuture();
  absl::Duration stall = absl::Seconds(30);
  std::function<bool()> cancelled;
};
// All `bytes` of `data` onto `socket` (`more`: MSG_MORE, more follows).
// UNAVAILABLE when the peer closed or reset the connection,
// DEADLINE_EXCEEDED (saying which bound) when the wait ran out, CANCELLED
// when it was cancelled.
absl::Status SendAll(int socket, const char* data, size_t bytes, const SocketWait& wait,
                     bool more = false);
// Exactly `bytes` into `data`; UNAVAILABLE naming how many came when the
// peer closed first.
absl::Status ReceiveAll(int socket, char* data, size_t bytes, const SocketWait& wait);

// One frame: its header, then its `frame.bytes` bytes from `data`.
absl::Status SendFrame(int socket, const PayloadFrame& frame, const char* data,
                       const SocketWait& wait);
// The next frame's header (its bytes are the caller's to read): ReceiveAll's
// errors, or INVALID_ARGUMENT for something that is not a frame header.
absl::StatusOr<PayloadFrame> ReceiveFrameHeader(int socket, const SocketWait& wait);

// A listening TCP socket on `host` (an address; empty: every interface) at
// `port` (0: one the kernel picks), and that port. Non-blocking,
// close-on-exec.
struct TcpListener {
  int fd = -1;
  uint16_t port = 0;
};
absl::StatusOr<TcpListener> ListenTcp(const std::string& host, uint16_t port = 0);
// A link's peer that acknowledges nothing for kLinkUnansweredTimeout
// (neither the link's last bytes nor, on an idle link, TCP's keepalive
// probes, sent after kLinkKeepaliveIdleSeconds of silence and then every
// kLinkKeepaliveIntervalSeconds) breaks the link: one whose peer's host
// vanished without a FIN (powered off, cut off the network) then reads as
// closed, so that neither a trainer's pool reuses it nor a shard keeps it
// (and its place under the shard's cap of links) for good. Without the
// timeout, a link left with unacknowledged bytes (an end frame sent just
// before the cut) would retransmit for a quarter of an hour. Linux (5.11 and
// later) also breaks a link whose peer keeps its receive window shut that
// long while answering every probe, a peer that reads nothing for 30 s: a
// trainer gives up on a stalled link sooner anyway (its transfers' stall
// bound), and the shard's pull to a trainer that stopped reading then ends
// after 30 s where its stall bound (--stream_idle_timeout_s) is longer.
inline constexpr int kLinkKeepaliveIdleSeconds = 5;
inline constexpr int kLinkKeepaliveIntervalSeconds = 1;
inline constexpr absl::Duration kLinkUnansweredTimeout = absl::Seconds(30);
// Both ends' settings of a link's TCP connection: TCP_NODELAY (frame headers
// and short frames go at once) and the timeouts above.
void ConfigureLinkSocket(int socket);
// True when `socket` has bytes to read or its peer closed it (checked
// without waiting or consuming anything): an idle link in that state is not
// clean.
bool ReadableOrClosed(int socket);
// A connected TCP socket (blocking, ConfigureLinkSocket's settings,
// close-on-exec) to
// `host`:`port`, connected within `timeout`; UNAVAILABLE when it is not.
absl::StatusOr<int> ConnectTcp(const std::string& host, uint16_t port, absl::Duration timeout);
// A link named `token` to the payload socket at `host`:`port`: connected,
// its hello sent and accepted, all within `timeout`; UNAVAILABLE (or
// DEADLINE_EXCEEDED) when it is not. The descriptor is the trainer's alone
// (MarkForkPrivate, common/fork_private.h): close it with CloseForkPrivate.
absl::StatusOr<int> OpenLink(const std::string& host, uint16_t port, absl::string_view token,
                             absl::Duration timeout);
// Whether a gRPC target or listen address names a Unix socket (unix:PATH,
// unix://PATH, unix-abstract:NAME), not a TCP host whose name starts with
// "unix".
bool IsUnixSocketAddress(absl::string_view target);
// The host part of a gRPC target "host:port" / "[v6]:port" (scheme prefixes
// such as "ipv4:" dropped); empty when it has none (a Unix socket).
std::string HostOfTarget(absl::string_view target);

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_PAYLOAD_SOCKET_H_
