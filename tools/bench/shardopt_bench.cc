// shardopt_bench: one-run throughput picture of a shardopt shard on this
// machine, printed as plain tables (see tools/bench/README.md).
//
//   bazel run -c opt //tools/bench:shardopt_bench [-- --sizes_mib=4,64,256 ...]
//
// (a) raw TCP loopback throughput (two sockets of its own, 4 MiB write()s);
// (b) TrainerClient::Step (push + pull) payload throughput against an
//     in-process ShardServer, one trainer, one shard, plain SGD, and its ratio
//     to (a);
// (c) CPU optimizer update rate (AdamW, SGD-momentum, Adagrad, plain SGD) over
//     a ThreadPool, next to a memcpy bandwidth reference from the same run;
// (d) bytes on the wire and step time per step with fp32, bf16 and fp16
//     gradients and parameters.
//
// GB means 10^9 bytes, MiB 2^20 bytes. Everything the tables need goes to
// stdout; the server's own log lines go to stderr.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/trainer_client.h"
#include "common/finite.h"
#include "common/layout.h"
#include "common/logging.h"
#include "common/optimizer_config.h"
#include "server/malloc_tuning.h"
#include "server/optim/optimizer.h"
#include "server/parallel_for.h"
#include "server/shard_server.h"

ABSL_FLAG(std::vector<std::string>, sizes_mib, std::vector<std::string>({"4", "64", "256"}),
          "Push+pull payload sizes in MiB of fp32 gradients (one tensor of MiB * 262144 "
          "elements each).");
ABSL_FLAG(int64_t, optimizer_params, int64_t{64} << 20,
          "Parameters per optimizer update in section (c).");
ABSL_FLAG(double, seconds_per_case, 3.0,
          "Approximate timed seconds per case (each push+pull size, each optimizer and "
          "thread count).");
ABSL_FLAG(bool, skip_tcp, false, "Skip (a), the raw TCP loopback measurement.");
ABSL_FLAG(bool, skip_push_pull, false, "Skip (b), the shardopt push+pull measurement.");
ABSL_FLAG(bool, skip_optimizer, false, "Skip (c), the optimizer and memcpy measurement.");
ABSL_FLAG(int, wire_mib, 64,
          "(d): MiB of fp32 parameters for the wire element-type comparison; 0 skips it.");
ABSL_FLAG(int, threads, 0,
          "Threads for the server's optimizer pool and for the multi-threaded rows of (c); "
          "0 = std::thread::hardware_concurrency().");
ABSL_FLAG(int64_t, tcp_mib, 1024, "MiB sent per raw TCP repetition.");
ABSL_FLAG(int, tcp_repeats, 3, "Raw TCP repetitions (after one short warm-up).");
ABSL_FLAG(int64_t, memcpy_mib, 1024, "MiB copied per memcpy repetition in (c).");
ABSL_FLAG(int, warmup_steps, 2, "Untimed push+pull steps before the timed ones.");
ABSL_FLAG(bool, tune_malloc, true,
          "Apply shardopt_server's malloc settings (server/malloc_tuning.h) to this process.");
ABSL_FLAG(int, chunk_kib, 4096,
          "KiB of gradient data per pushed message in (b) and (d): the client's chunk_bytes "
          "(default 4096, as TrainerClientOptions; at most 32768).");
ABSL_FLAG(int, pull_chunk_kib, 1024,
          "KiB of parameter data per pulled message in (b) and (d): the server's "
          "pull_chunk_bytes (default 1024, as shardopt_server's --pull_chunk_kib).");

namespace shardopt {
namespace {

// Bytes of tensor data per streamed message, each way.
struct ChunkSizes {
  size_t push;  // the client's chunk_bytes
  size_t pull;  // the server's pull_chunk_bytes
};

using Clock = std::chrono::steady_clock;

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kTcpWriteBytes = 4 * kMiB;
// What ModelShard::ApplyStep uses (server/model_shard.cc), for the
// update-only estimate of (b).
constexpr size_t kServerGrainElements = 16;
constexpr size_t kServerBlockElements = 8192;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double Min(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::min_element(v.begin(), v.end());
}

double Mean(const std::vector<double>& v) {
  if (v.empty()) return 0;
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

// Runs `fn` once untimed, then timed until `budget_s` has passed and at least
// `min_reps` runs were made (at most `max_reps`). Returns the per-run seconds.
template <typename Fn>
std::vector<double> TimeRepeated(double budget_s, int min_reps, int max_reps, Fn&& fn) {
  fn();
  std::vector<double> times;
  const Clock::time_point start = Clock::now();
  while (static_cast<int>(times.size()) < max_reps &&
         (static_cast<int>(times.size()) < min_reps || Since(start) < budget_s)) {
    const Clock::time_point t0 = Clock::now();
    fn();
    times.push_back(Since(t0));
  }
  return times;
}

std::string Fixed(double v, int decimals) { return absl::StrFormat("%.*f", decimals, v); }

// A plain text table: the first column left-aligned, the others right-aligned.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void AddRow(std::vector<std::string> row) {
    row.resize(header_.size());
    rows_.push_back(std::move(row));
  }
  void Print() const {
    std::vector<size_t> width(header_.size());
    for (size_t c = 0; c < header_.size(); ++c) {
      width[c] = header_[c].size();
      for (const auto& r : rows_) width[c] = std::max(width[c], r[c].size());
    }
    auto line = [&](const std::vector<std::string>& r) {
      std::string out = "  ";
      for (size_t c = 0; c < r.size(); ++c) {
        if (c > 0) out += "  ";
        const std::string pad(width[c] - r[c].size(), ' ');
        out += c == 0 ? r[c] + pad : pad + r[c];
      }
      while (!out.empty() && out.back() == ' ') out.pop_back();
      absl::PrintF("%s\n", out.c_str());
    };
    line(header_);
    size_t total = 0;
    for (size_t w : width) total += w;
    absl::PrintF("  %s\n", std::string(total + 2 * (width.size() - 1), '-').c_str());
    for (const auto& r : rows_) line(r);
    std::fflush(stdout);
  }

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// ------------------------------------------------------------------ header

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string Trim(const std::string& s) { return std::string(absl::StripAsciiWhitespace(s)); }

struct CpuInfo {
  std::string model = "unknown";
  int processors = 0;
};

CpuInfo ReadCpuInfo() {
  CpuInfo info;
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  bool have_model = false;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = Trim(line.substr(0, colon));
    if (key == "processor") ++info.processors;
    if (key == "model name" && !have_model) {
      info.model = Trim(line.substr(colon + 1));
      have_model = true;
    }
  }
  return info;
}

std::string LoadAverage() {
  const std::string s = Trim(ReadFile("/proc/loadavg"));
  // "0.12 0.30 0.25 1/234 5678": keep the three averages.
  size_t pos = 0;
  for (int i = 0; i < 3 && pos != std::string::npos; ++i) pos = s.find(' ', pos + 1);
  return pos == std::string::npos ? s : s.substr(0, pos);
}

std::string ShellQuote(const std::string& arg) {
  if (!arg.empty() && arg.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                            "0123456789-_=.,/:+@%") == std::string::npos) {
    return arg;
  }
  std::string out = "'";
  for (char c : arg) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

void PrintHeader(int argc, char** argv, int threads) {
  const CpuInfo cpu = ReadCpuInfo();
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) args.push_back(ShellQuote(argv[i]));
  absl::PrintF("shardopt_bench\n");
  absl::PrintF(
      "  date:      %s\n",
      absl::FormatTime("%Y-%m-%d %H:%M:%S %Z", absl::Now(), absl::LocalTimeZone()).c_str());
  absl::PrintF("  cpu:       %s\n", cpu.model.c_str());
  absl::PrintF("  cores:     %d logical CPUs in /proc/cpuinfo, hardware_concurrency=%u\n",
               cpu.processors, std::thread::hardware_concurrency());
  absl::PrintF("  threads:   %d (server optimizer pool and multi-threaded rows of (c))\n", threads);
#ifdef NDEBUG
  absl::PrintF("  build:     NDEBUG (-c opt)\n");
#else
  absl::PrintF("  build:     assertions on (not -c opt; use bazel run -c opt)\n");
#endif
  absl::PrintF("  loadavg:   %s (1/5/15 min, at start)\n", LoadAverage().c_str());
  absl::PrintF("  command:   %s\n", absl::StrJoin(args, " ").c_str());
  absl::PrintF("  units:     GB = 1e9 bytes, MB = 1e6 bytes, MiB = 2^20 bytes\n");
  std::fflush(stdout);
}

// ------------------------------------------------------------------ (a) TCP

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

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

struct TcpResult {
  std::vector<double> gbps;  // One per repetition.
  double best = 0;
  double median = 0;
};

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

// ------------------------------------------------------------ (b) push+pull

struct PushPullRow {
  int mib = 0;
  uint64_t elements = 0;
  int steps = 0;
  std::vector<double> step_s;
  uint64_t bytes_per_step = 0;
  int split_steps = 0;
  double push_s = 0, pull_s = 0;  // Means over the split pass.
  double update_s = 0;            // Median, standalone (server's split).
  double scan_s = 0;              // Median, standalone CopyAndFindNonFinite.
};

void FillGradients(std::vector<float>& g) {
  for (size_t i = 0; i < g.size(); ++i)
    g[i] = static_cast<float>(static_cast<int>(i % 251) - 125) * 1e-3f;
}

void FillParams(std::vector<float>& p) {
  for (size_t i = 0; i < p.size(); ++i)
    p[i] = static_cast<float>(static_cast<int>(i % 97) - 48) * 1e-2f;
}

OptimizerConfig BenchSgd() {
  // Plain SGD, small lr, no momentum: a real but cheap update (reads p, g;
  // writes p).
  return OptimizerConfig::Sgd(1e-4);
}

// Server-side costs of one step measured outside gRPC: the SGD update split
// the way ModelShard::ApplyStep splits it, and the copy into staging with
// its fused NaN/inf scan that each pushed chunk gets (PushWriter::Write).
absl::Status EstimateServerCompute(uint64_t n, int threads, double budget_s, PushPullRow& row) {
  absl::StatusOr<std::unique_ptr<Optimizer>> opt = Optimizer::Create(BenchSgd(), n);
  if (!opt.ok()) return opt.status();
  std::vector<float> params(n), grads(n);
  FillParams(params);
  FillGradients(grads);
  ThreadPool pool(threads);
  int64_t step = 1;
  std::vector<double> update = TimeRepeated(budget_s, 3, 1000, [&] {
    pool.ParallelFor(n, kServerGrainElements, [&](size_t begin, size_t end) {
      for (size_t block = begin; block < end; block += kServerBlockElements) {
        (*opt)->Update(step, params.data(), grads.data(), block,
                       std::min(end, block + kServerBlockElements));
      }
    });
    ++step;
  });
  size_t bad = 0;
  std::vector<float> staging(n);
  std::vector<double> scan = TimeRepeated(
      budget_s, 3, 1000, [&] { bad += n - CopyAndFindNonFinite(staging.data(), grads.data(), n); });
  if (bad != 0) return absl::InternalError("benchmark gradients are not finite");
  row.update_s = Median(update);
  row.scan_s = Median(scan);
  return absl::OkStatus();
}

absl::StatusOr<PushPullRow> RunPushPull(int mib, int threads, double seconds, int warmup_steps,
                                        ChunkSizes chunks) {
  PushPullRow row;
  row.mib = mib;
  row.elements = static_cast<uint64_t>(mib) * (kMiB / sizeof(float));
  const uint64_t n = row.elements;

  // First the standalone estimates, so their buffers are gone before the
  // server and client allocate theirs.
  if (absl::Status s = EstimateServerCompute(n, threads, std::max(0.05, 0.1 * seconds), row);
      !s.ok()) {
    return s;
  }

  ShardServerOptions server_options;
  server_options.shard_index = 0;
  server_options.shard_count = 1;
  server_options.threads = threads;
  server_options.pull_chunk_bytes = chunks.pull;
  std::fflush(stdout);
  absl::StatusOr<std::unique_ptr<ShardServer>> server =
      ShardServer::Start("127.0.0.1:0", server_options);
  if (!server.ok()) return server.status();

  TrainerClientOptions client_options;
  client_options.trainer_rank = 0;
  client_options.chunk_bytes = chunks.push;
  absl::StatusOr<std::unique_ptr<TrainerClient>> client =
      TrainerClient::Connect({absl::StrCat("127.0.0.1:", (*server)->port())}, client_options);
  if (!client.ok()) return client.status();

  ModelSpec spec;
  spec.model_id = absl::StrCat("bench_", mib, "mib");
  spec.tensors = {TensorSpec{"w", {static_cast<int64_t>(n)}, DType::kFloat32}};
  spec.optimizer = BenchSgd();
  spec.num_trainers = 1;
  absl::StatusOr<ModelLayout> layout = ModelLayout::Create(spec.tensors, spec.alignment, 1);
  if (!layout.ok()) return layout.status();
  std::vector<float> params(layout->total_elements()), grads(layout->total_elements());
  FillParams(params);
  FillGradients(grads);
  const float initial_param = params[1];
  if (absl::Status s = (*client)->Register(spec, params); !s.ok()) return s;

  int64_t step = 0;
  auto do_step = [&]() -> absl::StatusOr<double> {
    ++step;
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<StepResult> r = (*client)->Step(step, grads, absl::MakeSpan(params));
    const double dt = Since(t0);
    if (!r.ok()) return r.status();
    if (r->version != step || !r->applied_here) {
      return absl::InternalError(absl::StrCat("step ", step, " came back as version ", r->version,
                                              " applied=", r->applied_here));
    }
    row.bytes_per_step = r->bytes_pushed + r->bytes_pulled;
    return dt;
  };

  double warm_s = 0;
  for (int i = 0; i < std::max(1, warmup_steps); ++i) {
    absl::StatusOr<double> dt = do_step();
    if (!dt.ok()) return dt.status();
    warm_s = *dt;
  }
  row.steps =
      static_cast<int>(std::clamp(std::ceil(seconds / std::max(warm_s, 1e-6)), 3.0, 100000.0));
  for (int i = 0; i < row.steps; ++i) {
    absl::StatusOr<double> dt = do_step();
    if (!dt.ok()) return dt.status();
    row.step_s.push_back(*dt);
  }
  if (row.bytes_per_step != 2 * sizeof(float) * n) {
    return absl::InternalError(absl::StrCat("a step moved ", row.bytes_per_step,
                                            " payload bytes, expected ", 2 * sizeof(float) * n));
  }

  // Breakdown pass: the same two calls Step makes, timed separately.
  row.split_steps = std::max(2, row.steps / 3);
  std::vector<double> push_s, pull_s;
  for (int i = 0; i < row.split_steps; ++i) {
    ++step;
    Clock::time_point t0 = Clock::now();
    absl::StatusOr<StepResult> pushed = (*client)->Push(step, grads);
    push_s.push_back(Since(t0));
    if (!pushed.ok()) return pushed.status();
    t0 = Clock::now();
    absl::StatusOr<int64_t> version = (*client)->Pull(step, absl::MakeSpan(params));
    pull_s.push_back(Since(t0));
    if (!version.ok()) return version.status();
    if (*version != step) return absl::InternalError("pull returned the wrong version");
  }
  row.push_s = Mean(push_s);
  row.pull_s = Mean(pull_s);
  if (params[1] == initial_param) {
    return absl::InternalError("the pulled parameters never changed");
  }

  client->reset();
  (*server)->Shutdown(absl::Seconds(1));
  return row;
}

// ------------------------------------------------------------ (c) optimizer

struct CopyRate {
  int threads = 0;
  double seconds = 0;  // Median per copy.
  double gbps = 0;     // Read + write bytes.
};

std::vector<CopyRate> RunMemcpy(size_t bytes, const std::vector<int>& thread_counts,
                                double seconds) {
  std::vector<char> src(bytes), dst(bytes);
  for (size_t i = 0; i < bytes; i += 4096) src[i] = static_cast<char>(i >> 12);
  std::memset(dst.data(), 1, bytes);
  std::vector<CopyRate> rates;
  for (int t : thread_counts) {
    ThreadPool pool(t);
    std::vector<double> times = TimeRepeated(seconds, 3, 100000, [&] {
      pool.ParallelFor(bytes, 4096, [&](size_t begin, size_t end) {
        std::memcpy(dst.data() + begin, src.data() + begin, end - begin);
      });
    });
    CopyRate r;
    r.threads = t;
    r.seconds = Median(times);
    r.gbps = 2.0 * static_cast<double>(bytes) / r.seconds / 1e9;
    rates.push_back(r);
  }
  return rates;
}

struct OptimizerCase {
  std::string name;
  OptimizerConfig config;
  int bytes_per_param;
  std::string traffic;
};

absl::Status RunOptimizers(uint64_t n, const std::vector<int>& thread_counts, double seconds,
                           const std::vector<CopyRate>& memcpy_rates) {
  OptimizerConfig sgd_momentum = OptimizerConfig::Sgd(1e-3);
  sgd_momentum.momentum = 0.9;
  const std::vector<OptimizerCase> cases = {
      {"adamw", OptimizerConfig::AdamW(), 28, "r p,g,m,v; w p,m,v"},
      {"sgd-momentum", sgd_momentum, 20, "r p,g,buf; w p,buf"},
      {"adagrad", OptimizerConfig::Adagrad(), 20, "r p,g,sum; w p,sum"},
      {"sgd (plain, as in b)", OptimizerConfig::Sgd(1e-4), 12, "r p,g; w p"},
  };
  std::vector<float> params(n), grads(n);
  FillParams(params);
  FillGradients(grads);
  Table table({"optimizer", "threads", "B/param", "traffic", "ms/update", "Mparams/s", "GB/s",
               "memcpy GB/s", "frac of memcpy"});
  for (const OptimizerCase& c : cases) {
    absl::StatusOr<std::unique_ptr<Optimizer>> opt = Optimizer::Create(c.config, n);
    if (!opt.ok()) return opt.status();
    int64_t step = 0;
    for (size_t k = 0; k < thread_counts.size(); ++k) {
      const int t = thread_counts[k];
      ThreadPool pool(t);
      std::vector<double> times = TimeRepeated(seconds, 3, 100000, [&] {
        ++step;
        pool.ParallelFor(n, kServerGrainElements, [&](size_t begin, size_t end) {
          (*opt)->Update(step, params.data(), grads.data(), begin, end);
        });
      });
      const double s = Median(times);
      const double gbps = static_cast<double>(c.bytes_per_param) * n / s / 1e9;
      std::string mem = "n/a", frac = "n/a";
      for (const CopyRate& r : memcpy_rates) {
        if (r.threads == t) {
          mem = Fixed(r.gbps, 2);
          frac = Fixed(gbps / r.gbps, 2);
        }
      }
      table.AddRow({c.name, absl::StrCat(t), absl::StrCat(c.bytes_per_param), c.traffic,
                    Fixed(s * 1e3, 2), Fixed(n / s / 1e6, 0), Fixed(gbps, 2), mem, frac});
    }
  }
  for (float p : params) {
    if (!std::isfinite(p)) return absl::InternalError("optimizer produced a non-finite value");
  }
  table.Print();
  return absl::OkStatus();
}

// ------------------------------------------------- (d) wire element types

// Bytes the loopback device has received so far (/proc/net/dev, "lo"): what
// actually crossed the "wire", headers and framing included. Machine-wide,
// so other loopback traffic during a run shows up too.
uint64_t LoopbackBytes() {
  std::ifstream in("/proc/net/dev");
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    if (absl::StripAsciiWhitespace(line.substr(0, colon)) != "lo") continue;
    std::istringstream fields(line.substr(colon + 1));
    uint64_t rx_bytes = 0;
    fields >> rx_bytes;
    return rx_bytes;
  }
  return 0;
}

struct WireRow {
  DType push = DType::kFloat32, pull = DType::kFloat32;
  int steps = 0;
  double step_ms = 0;
  uint64_t payload_per_step = 0;
  double loopback_per_step = 0;
};

// Push + pull steps of one model with the given wire types.
absl::StatusOr<WireRow> RunWire(DType push, DType pull, uint64_t n, int threads, double seconds,
                                ChunkSizes chunks) {
  WireRow row;
  row.push = push;
  row.pull = pull;
  ShardServerOptions server_options;
  server_options.threads = threads;
  server_options.pull_chunk_bytes = chunks.pull;
  absl::StatusOr<std::unique_ptr<ShardServer>> server =
      ShardServer::Start("127.0.0.1:0", server_options);
  if (!server.ok()) return server.status();
  TrainerClientOptions client_options;
  client_options.chunk_bytes = chunks.push;
  client_options.push_dtype = push;
  client_options.pull_dtype = pull;
  absl::StatusOr<std::unique_ptr<TrainerClient>> client =
      TrainerClient::Connect({absl::StrCat("127.0.0.1:", (*server)->port())}, client_options);
  if (!client.ok()) return client.status();
  ModelSpec spec;
  spec.model_id = "wire";
  spec.tensors = {TensorSpec{"w", {static_cast<int64_t>(n)}, DType::kFloat32}};
  spec.optimizer = BenchSgd();
  absl::StatusOr<ModelLayout> layout = ModelLayout::Create(spec.tensors, spec.alignment, 1);
  if (!layout.ok()) return layout.status();
  std::vector<float> params(layout->total_elements()), grads(layout->total_elements());
  FillParams(params);
  FillGradients(grads);
  if (absl::Status s = (*client)->Register(spec, params); !s.ok()) return s;
  int64_t step = 0;
  auto do_step = [&]() -> absl::Status {
    absl::StatusOr<StepResult> r = (*client)->Step(++step, grads, absl::MakeSpan(params));
    if (!r.ok()) return r.status();
    row.payload_per_step = r->bytes_pushed + r->bytes_pulled;
    return absl::OkStatus();
  };
  if (absl::Status s = do_step(); !s.ok()) return s;  // Warm-up.
  const uint64_t lo_before = LoopbackBytes();
  const Clock::time_point t0 = Clock::now();
  do {
    if (absl::Status s = do_step(); !s.ok()) return s;
    ++row.steps;
  } while (Since(t0) < seconds || row.steps < 3);
  row.step_ms = 1e3 * Since(t0) / row.steps;
  row.loopback_per_step = static_cast<double>(LoopbackBytes() - lo_before) / row.steps;
  return row;
}

absl::Status RunWireTypes(int mib, int threads, double seconds, ChunkSizes chunks) {
  const uint64_t n = static_cast<uint64_t>(mib) * (kMiB / sizeof(float));
  absl::PrintF(
      "\n(d) bytes on the wire per step by element type: %d MiB of fp32 parameters (%d "
      "elements),\n  1 trainer, 1 shard; payload = push + pull bytes as counted by the "
      "client; loopback = bytes\n  the lo device received (/proc/net/dev, machine-wide: "
      "headers and framing included)\n",
      mib, n);
  const std::pair<DType, DType> cases[] = {{DType::kFloat32, DType::kFloat32},
                                           {DType::kBFloat16, DType::kFloat32},
                                           {DType::kBFloat16, DType::kBFloat16},
                                           {DType::kFloat16, DType::kFloat16}};
  std::vector<WireRow> rows;
  for (const auto& [push, pull] : cases) {
    absl::StatusOr<WireRow> row = RunWire(push, pull, n, threads, seconds, chunks);
    if (!row.ok()) return row.status();
    rows.push_back(*row);
  }
  Table table({"push / pull", "steps", "ms/step", "payload MB/step", "loopback MB/step",
               "vs fp32 bytes", "vs fp32 time"});
  for (const WireRow& r : rows) {
    table.AddRow({absl::StrCat(DTypeName(r.push), " / ", DTypeName(r.pull)), absl::StrCat(r.steps),
                  Fixed(r.step_ms, 2), Fixed(r.payload_per_step / 1e6, 1),
                  Fixed(r.loopback_per_step / 1e6, 1),
                  Fixed(r.loopback_per_step / rows[0].loopback_per_step, 3) + "x",
                  Fixed(r.step_ms / rows[0].step_ms, 3) + "x"});
  }
  table.Print();
  return absl::OkStatus();
}

// ------------------------------------------------------------------ main

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "shardopt throughput benchmark: raw TCP loopback, push+pull, optimizer update rate");
  absl::ParseCommandLine(argc, argv);
  SetLogTag("shardopt_bench");
  // The daemon tunes malloc at start-up (server/malloc_tuning.h); so does the
  // in-process server here, which also tunes the client side of (b).
  const bool malloc_tuned = absl::GetFlag(FLAGS_tune_malloc) && TuneMallocForLargeMessages();

  int threads = absl::GetFlag(FLAGS_threads);
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const double seconds = std::max(0.0, absl::GetFlag(FLAGS_seconds_per_case));
  std::vector<int> sizes;
  for (const std::string& s : absl::GetFlag(FLAGS_sizes_mib)) {
    int mib = 0;
    if (!absl::SimpleAtoi(s, &mib) || mib <= 0 || mib > 4096) {
      std::fprintf(stderr, "--sizes_mib: '%s' is not a size in MiB in [1, 4096]\n", s.c_str());
      return 2;
    }
    sizes.push_back(mib);
  }
  const int64_t optimizer_params = absl::GetFlag(FLAGS_optimizer_params);
  const int64_t tcp_mib = absl::GetFlag(FLAGS_tcp_mib);
  const int64_t memcpy_mib = absl::GetFlag(FLAGS_memcpy_mib);
  const int tcp_repeats = absl::GetFlag(FLAGS_tcp_repeats);
  const int chunk_kib = absl::GetFlag(FLAGS_chunk_kib);
  if (chunk_kib <= 0 || chunk_kib > 32768) {
    std::fprintf(stderr, "--chunk_kib must be in [1, 32768]\n");
    return 2;
  }
  const int pull_chunk_kib = absl::GetFlag(FLAGS_pull_chunk_kib);
  if (pull_chunk_kib <= 0 || pull_chunk_kib > 32768) {
    std::fprintf(stderr, "--pull_chunk_kib must be in [1, 32768]\n");
    return 2;
  }
  const ChunkSizes chunks{static_cast<size_t>(chunk_kib) << 10, static_cast<size_t>(pull_chunk_kib)
                                                                    << 10};
  if (optimizer_params <= 0 || tcp_mib <= 0 || memcpy_mib <= 0 || tcp_repeats <= 0) {
    std::fprintf(
        stderr, "--optimizer_params, --tcp_mib, --memcpy_mib and --tcp_repeats must be positive\n");
    return 2;
  }

  PrintHeader(argc, argv, threads);
  absl::PrintF("  malloc:    %s\n",
               malloc_tuned ? "tuned as in shardopt_server (server/malloc_tuning.h; applies "
                              "to the client half of (b) too)"
                            : "glibc defaults (--notune_malloc)");
  const Clock::time_point run_start = Clock::now();

  std::optional<TcpResult> tcp;
  if (!absl::GetFlag(FLAGS_skip_tcp)) {
    absl::PrintF("\n(a) raw TCP loopback throughput\n");
    absl::StatusOr<TcpResult> r = RunTcp(static_cast<uint64_t>(tcp_mib) * kMiB, tcp_repeats);
    if (!r.ok()) {
      std::fprintf(stderr, "raw TCP: %s\n", r.status().ToString().c_str());
      return 1;
    }
    tcp = *r;
  }

  std::vector<PushPullRow> rows;
  if (!absl::GetFlag(FLAGS_skip_push_pull) && !sizes.empty()) {
    absl::PrintF(
        "\n(b) shardopt push+pull: TrainerClient::Step against an in-process ShardServer\n"
        "  127.0.0.1:0, 1 shard, %d optimizer threads; 1 trainer; 1 fp32 tensor; plain SGD\n"
        "  lr=1e-4 (no momentum); %d KiB per pushed message (client chunk_bytes%s), %d KiB\n"
        "  per pulled message (server pull_chunk_bytes%s); %d warm-up steps, then N steps\n"
        "  for ~%s s; payload = push bytes + pull bytes\n",
        threads, chunk_kib, chunk_kib == 4096 ? ", the default" : "; default 4096", pull_chunk_kib,
        pull_chunk_kib == 1024 ? ", the default" : "; default 1024",
        std::max(1, absl::GetFlag(FLAGS_warmup_steps)), Fixed(seconds, 1));
    std::fflush(stdout);
    for (int mib : sizes) {
      absl::StatusOr<PushPullRow> r =
          RunPushPull(mib, threads, seconds, absl::GetFlag(FLAGS_warmup_steps), chunks);
      if (!r.ok()) {
        std::fprintf(stderr, "push+pull %d MiB: %s\n", mib, r.status().ToString().c_str());
        return 1;
      }
      rows.push_back(*r);
    }
    Table main_table({"push+pull", "elements", "steps", "step ms mean", "median", "min", "MB/step",
                      "payload GB/s", "vs raw TCP"});
    for (const PushPullRow& r : rows) {
      const double mean = Mean(r.step_s);
      const double gbps = r.bytes_per_step / mean / 1e9;
      main_table.AddRow({absl::StrCat(r.mib, " MiB"), absl::StrCat(r.elements),
                         absl::StrCat(r.steps), Fixed(mean * 1e3, 2),
                         Fixed(Median(r.step_s) * 1e3, 2), Fixed(Min(r.step_s) * 1e3, 2),
                         Fixed(r.bytes_per_step / 1e6, 1), Fixed(gbps, 3),
                         tcp ? absl::StrFormat("%.3fx", gbps / tcp->best) : "n/a (no TCP)"});
    }
    main_table.Print();
    absl::PrintF(
        "\n  breakdown: Push and Pull timed separately (means over a second, shorter pass),\n"
        "  and server compute measured standalone (medians; same split as ApplyStep)\n");
    Table split({"push+pull", "steps", "push ms", "push GB/s", "pull ms", "pull GB/s",
                 "sgd update ms", "stage+scan ms", "update % of step"});
    for (const PushPullRow& r : rows) {
      const double half = r.bytes_per_step / 2.0;
      split.AddRow({absl::StrCat(r.mib, " MiB"), absl::StrCat(r.split_steps),
                    Fixed(r.push_s * 1e3, 2), Fixed(half / r.push_s / 1e9, 3),
                    Fixed(r.pull_s * 1e3, 2), Fixed(half / r.pull_s / 1e9, 3),
                    Fixed(r.update_s * 1e3, 2), Fixed(r.scan_s * 1e3, 2),
                    Fixed(100.0 * r.update_s / Mean(r.step_s), 1)});
    }
    split.Print();
  }

  if (!absl::GetFlag(FLAGS_skip_optimizer)) {
    std::vector<int> thread_counts = {threads};
    if (threads != 1) thread_counts.push_back(1);
    const size_t copy_bytes = static_cast<size_t>(memcpy_mib) * kMiB;
    absl::PrintF(
        "\n(c) CPU optimizer update rate, %lld parameters, Update split over a ThreadPool\n"
        "  (median per update); memcpy reference: %lld MiB buffer, read+write bytes\n",
        static_cast<long long>(optimizer_params), static_cast<long long>(memcpy_mib));
    std::fflush(stdout);
    std::vector<CopyRate> copies = RunMemcpy(copy_bytes, thread_counts, seconds);
    Table copy_table({"memcpy", "threads", "ms/copy", "GB/s (r+w)"});
    for (const CopyRate& c : copies) {
      copy_table.AddRow({absl::StrCat(memcpy_mib, " MiB"), absl::StrCat(c.threads),
                         Fixed(c.seconds * 1e3, 2), Fixed(c.gbps, 2)});
    }
    copy_table.Print();
    absl::PrintF("\n");
    if (absl::Status s =
            RunOptimizers(static_cast<uint64_t>(optimizer_params), thread_counts, seconds, copies);
        !s.ok()) {
      std::fprintf(stderr, "optimizer: %s\n", s.ToString().c_str());
      return 1;
    }
  }

  if (const int wire_mib = absl::GetFlag(FLAGS_wire_mib); wire_mib > 0) {
    if (absl::Status s = RunWireTypes(wire_mib, threads, seconds, chunks); !s.ok()) {
      std::fprintf(stderr, "wire types: %s\n", s.ToString().c_str());
      return 1;
    }
  }

  absl::PrintF("\nsummary\n");
  if (tcp) {
    absl::PrintF("  raw TCP loopback: %s GB/s best, %s GB/s median of %zu\n",
                 Fixed(tcp->best, 2).c_str(), Fixed(tcp->median, 2).c_str(), tcp->gbps.size());
  }
  for (const PushPullRow& r : rows) {
    const double gbps = r.bytes_per_step / Mean(r.step_s) / 1e9;
    absl::PrintF("  push+pull %d MiB: %s ms/step, %s GB/s payload%s\n", r.mib,
                 Fixed(Mean(r.step_s) * 1e3, 2).c_str(), Fixed(gbps, 3).c_str(),
                 tcp ? absl::StrFormat(" = %.3fx raw TCP best", gbps / tcp->best).c_str() : "");
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  absl::PrintF("  peak RSS: %s MiB; wall time: %s s; loadavg at end: %s\n",
               Fixed(usage.ru_maxrss / 1024.0, 0).c_str(), Fixed(Since(run_start), 1).c_str(),
               LoadAverage().c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace shardopt

int main(int argc, char** argv) { return shardopt::Main(argc, argv); }
