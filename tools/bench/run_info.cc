// shardopt_bench's header block and /proc readers (run_info.h).
#include "tools/bench/run_info.h"

#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace shardopt::bench {
namespace {

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

}  // namespace

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string Trim(const std::string& s) { return std::string(absl::StripAsciiWhitespace(s)); }

std::string LoadAverage() {
  const std::string s = Trim(ReadFile("/proc/loadavg"));
  // "0.12 0.30 0.25 1/234 5678": keep the three averages.
  size_t pos = 0;
  for (int i = 0; i < 3 && pos != std::string::npos; ++i) pos = s.find(' ', pos + 1);
  return pos == std::string::npos ? s : s.substr(0, pos);
}

uint64_t LoopbackReceivedBytes() {
  std::istringstream lines(ReadFile("/proc/net/dev"));
  std::string line;
  while (std::getline(lines, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos || Trim(line.substr(0, colon)) != "lo") continue;
    std::istringstream fields(line.substr(colon + 1));
    uint64_t rx_bytes = 0;
    fields >> rx_bytes;
    return rx_bytes;
  }
  return 0;
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

}  // namespace shardopt::bench
