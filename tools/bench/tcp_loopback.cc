// shardopt_bench section (a): raw TCP loopback throughput (tcp_loopback.h).
#include "tools/bench/tcp_loopback.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/run_info.h"

namespace shardopt::bench {
namespace {

constexpr size_t kTcpWriteBytes = 4 * kMiB;

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Takes `fd`, closing the one held.
  void Reset(int fd) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// Sends `total` bytes from `payload` (wrapping around) in write() calls of at
// most `write_bytes`.
absl::Status SendBytes(int fd, const char* payload, size_t payload_size, uint64_t total,
                       size_t write_bytes) {
  uint64_t sent = 0;
  while (sent < total) {
    const size_t at = static_cast<size_t>(sent % payload_size);
    const size_t n =
        static_cast<size_t>(std::min<uint64_t>({write_bytes, total - sent, payload_size - at}));
    const ssize_t w = send(fd, payload + at, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Errno("send");
    }
    sent += static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

absl::Status ReceiveBytes(int fd, char* buffer, size_t buffer_size, uint64_t total) {
  uint64_t received = 0;
  while (received < total) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buffer_size, total - received));
    const ssize_t r = read(fd, buffer, n);
    if (r < 0) {
      if (errno == EINTR) continue;
      return Errno("read");
    }
    if (r == 0) return absl::InternalError("the TCP peer closed early");
    received += static_cast<uint64_t>(r);
  }
  return absl::OkStatus();
}

// A connected pair of sockets on 127.0.0.1 through `listener`'s port.
absl::Status ConnectPair(int listener, const sockaddr_in& addr, Fd* sender, Fd* receiver) {
  sender->Reset(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (sender->get() < 0) return Errno("socket");
  if (connect(sender->get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Errno("connect");
  }
  receiver->Reset(accept(listener, nullptr, nullptr));
  if (receiver->get() < 0) return Errno("accept");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TcpResult> RunTcpParallel(uint64_t total, int repeats, int connections) {
  Fd listener(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (listener.get() < 0) return Errno("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Errno("bind 127.0.0.1:0");
  }
  if (listen(listener.get(), connections) != 0) return Errno("listen");
  socklen_t len = sizeof(addr);
  if (getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return Errno("getsockname");
  }
  std::vector<Fd> senders(connections), receivers(connections);
  for (int i = 0; i < connections; ++i) {
    if (absl::Status s = ConnectPair(listener.get(), addr, &senders[i], &receivers[i]); !s.ok()) {
      return s;
    }
  }
  // Each connection's sender streams its own payload (a share of up to
  // 1 GiB in all, so from memory, as RunTcp's), the receiver reads into its
  // own 4 MiB buffer.
  const uint64_t share = total / connections;
  const size_t payload_size = static_cast<size_t>(
      std::max<uint64_t>(kTcpWriteBytes, std::min<uint64_t>(share, (1u << 30) / connections)));
  std::vector<std::vector<char>> payloads(connections, std::vector<char>(payload_size, 7));
  std::vector<std::vector<char>> inboxes(connections, std::vector<char>(kTcpWriteBytes));
  auto transfer = [&](uint64_t bytes) -> absl::StatusOr<double> {
    std::vector<absl::Status> statuses(2 * connections);
    std::vector<std::thread> threads;
    const Clock::time_point t0 = Clock::now();
    for (int i = 0; i < connections; ++i) {
      threads.emplace_back([&, i] {
        statuses[2 * i] = SendBytes(senders[i].get(), payloads[i].data(), payload_size,
                                    bytes / connections, kTcpWriteBytes);
      });
      threads.emplace_back([&, i] {
        statuses[2 * i + 1] = ReceiveBytes(receivers[i].get(), inboxes[i].data(), kTcpWriteBytes,
                                           bytes / connections);
      });
    }
    for (std::thread& t : threads) t.join();
    const double seconds = Since(t0);
    for (const absl::Status& s : statuses) {
      if (!s.ok()) return s;
    }
    return seconds;
  };
  absl::StatusOr<double> warm = transfer(std::min<uint64_t>(total, 64 * kMiB));
  if (!warm.ok()) return warm.status();
  TcpResult result;
  for (int i = 0; i < repeats; ++i) {
    absl::StatusOr<double> seconds = transfer(share * connections);
    if (!seconds.ok()) return seconds.status();
    result.gbps.push_back(static_cast<double>(share * connections) / *seconds / 1e9);
  }
  result.best = *std::max_element(result.gbps.begin(), result.gbps.end());
  result.median = Median(result.gbps);
  return result;
}

absl::StatusOr<TcpResult> RunTcp(uint64_t total, int repeats) {
  Fd listener(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (listener.get() < 0) return Errno("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Errno("bind 127.0.0.1:0");
  }
  if (listen(listener.get(), 1) != 0) return Errno("listen");
  socklen_t len = sizeof(addr);
  if (getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return Errno("getsockname");
  }
  Fd sender(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (sender.get() < 0) return Errno("socket");
  if (connect(sender.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Errno("connect");
  }
  Fd receiver(accept(listener.get(), nullptr, nullptr));
  if (receiver.get() < 0) return Errno("accept");

  int sndbuf = 0, rcvbuf = 0;
  socklen_t optlen = sizeof(int);
  getsockopt(sender.get(), SOL_SOCKET, SO_SNDBUF, &sndbuf, &optlen);
  optlen = sizeof(int);
  getsockopt(receiver.get(), SOL_SOCKET, SO_RCVBUF, &rcvbuf, &optlen);
  absl::PrintF(
      "  sockets:   127.0.0.1:%d, one accept()ed connection; SO_SNDBUF/SO_RCVBUF left at\n"
      "             the defaults (kernel autotuning; initially SO_SNDBUF=%d, SO_RCVBUF=%d;\n"
      "             tcp_wmem=\"%s\", tcp_rmem=\"%s\")\n",
      ntohs(addr.sin_port), sndbuf, rcvbuf, Trim(ReadFile("/proc/sys/net/ipv4/tcp_wmem")).c_str(),
      Trim(ReadFile("/proc/sys/net/ipv4/tcp_rmem")).c_str());

  // The sender reads a large payload (the whole repetition, up to 1 GiB) so it
  // streams from memory rather than from a cache-resident buffer; the receiver
  // reads into one 4 MiB buffer.
  const size_t payload_size =
      static_cast<size_t>(std::max<uint64_t>(kTcpWriteBytes, std::min<uint64_t>(total, 1u << 30)));
  std::vector<char> payload(payload_size);
  for (size_t i = 0; i < payload_size; ++i) payload[i] = static_cast<char>(i * 131 + 7);
  std::vector<char> inbox(kTcpWriteBytes);
  absl::PrintF(
      "  transfer:  %s MiB per repetition in %zu-byte write() calls (payload buffer %zu MiB),\n"
      "             read() into one %zu-byte buffer; 1 warm-up of %s MiB, then %d timed\n",
      Fixed(static_cast<double>(total) / kMiB, 0), kTcpWriteBytes, payload_size / kMiB,
      kTcpWriteBytes, Fixed(std::min<double>(total, 64.0 * kMiB) / kMiB, 0), repeats);
  std::fflush(stdout);

  auto transfer = [&](uint64_t bytes) -> absl::StatusOr<double> {
    absl::Status send_status, receive_status;
    const Clock::time_point t0 = Clock::now();
    std::thread send_thread([&] {
      send_status = SendBytes(sender.get(), payload.data(), payload.size(), bytes, kTcpWriteBytes);
    });
    std::thread receive_thread(
        [&] { receive_status = ReceiveBytes(receiver.get(), inbox.data(), inbox.size(), bytes); });
    send_thread.join();
    receive_thread.join();
    const double seconds = Since(t0);
    if (!send_status.ok()) return send_status;
    if (!receive_status.ok()) return receive_status;
    return seconds;
  };

  absl::StatusOr<double> warm = transfer(std::min<uint64_t>(total, 64 * kMiB));
  if (!warm.ok()) return warm.status();
  TcpResult result;
  Table table({"raw TCP loopback", "MiB", "seconds", "GB/s"});
  for (int i = 0; i < repeats; ++i) {
    absl::StatusOr<double> seconds = transfer(total);
    if (!seconds.ok()) return seconds.status();
    const double gbps = static_cast<double>(total) / *seconds / 1e9;
    result.gbps.push_back(gbps);
    table.AddRow({absl::StrCat("repetition ", i + 1), Fixed(static_cast<double>(total) / kMiB, 0),
                  Fixed(*seconds, 3), Fixed(gbps, 2)});
  }
  result.best = *std::max_element(result.gbps.begin(), result.gbps.end());
  result.median = Median(result.gbps);
  table.AddRow({"best (used for ratios)", "", "", Fixed(result.best, 2)});
  table.AddRow({"median", "", "", Fixed(result.median, 2)});
  table.Print();
  return result;
}

}  // namespace shardopt::bench
