#include "tests/support/process.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace shardopt::testing {

std::string Runfile(const std::string& path) {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* workspace = getenv("TEST_WORKSPACE");
  if (srcdir != nullptr) {
    return absl::StrCat(srcdir, "/", workspace != nullptr ? workspace : "shardopt", "/", path);
  }
  return path;  // Run from the workspace root by hand.
}

std::string MakeTempDir(const std::string& prefix) {
  static std::atomic<int> counter{0};
  const char* base = getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(base != nullptr ? base : "/tmp", "/", prefix, "_", getpid(), "_",
                                 counter.fetch_add(1));
  mkdir(dir.c_str(), 0755);
  return dir;
}

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::string& binary, const std::vector<std::string>& args) {
  std::vector<std::string> argv_storage = {binary};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    // Children must not outlive the test, even one killed by a timeout
    // (no destructors run then): the kernel kills them when it dies. (It
    // tracks the forking thread: tests start children from their main thread.)
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // The parent died before prctl.
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  fprintf(stderr, "[test] started pid %d: %s\n", pid, absl::StrJoin(argv_storage, " ").c_str());
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid));
}

ChildProcess::~ChildProcess() {
  if (!exit_code_) {
    kill(pid_, SIGKILL);
    Wait(absl::Seconds(10));
  }
}

void ChildProcess::Signal(int signal_number) {
  if (!exit_code_) kill(pid_, signal_number);
}

std::optional<int> ChildProcess::Wait(absl::Duration timeout) {
  if (exit_code_) return exit_code_;
  const absl::Time give_up = absl::Now() + timeout;
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return exit_code_;
    }
    if (absl::Now() >= give_up) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(5));
  }
}

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(
    uint32_t shard_index, uint32_t shard_count, const std::vector<std::string>& extra_flags,
    const ServerPlacement& placement) {
  const std::string dir = MakeTempDir(absl::StrCat("shard", shard_index));
  const std::string port_file = dir + "/port";
  std::vector<std::string> args = {
      absl::StrCat("--listen=", placement.host, ":0"), absl::StrCat("--shard_index=", shard_index),
      absl::StrCat("--shard_count=", shard_count), "--threads=2", "--device=cpu",
      // Tiny ranges: every test's steps run
      // pipelined, range by range.
      "--pipeline_range_elements=64", "--port_file=" + port_file};
  args.insert(args.end(), extra_flags.begin(), extra_flags.end());
  std::string binary = Runfile(placement.binary);
  const std::string name = placement.binary.substr(placement.binary.rfind('/') + 1);
  if (!placement.launcher.empty()) {
    args.insert(args.begin(), binary);
    args.insert(args.begin(), placement.launcher.begin() + 1, placement.launcher.end());
    binary = placement.launcher.front();
  }
  absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Start(binary, args);
  if (!child.ok()) return child.status();
  auto server = std::unique_ptr<ServerProcess>(new ServerProcess());
  server->process_ = std::move(*child);
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (absl::Now() < give_up) {
    std::ifstream in(port_file);
    int port = 0;
    if (in >> port && port > 0) {
      server->address_ = absl::StrCat(placement.host, ":", port);
      return server;
    }
    if (server->process_->Wait(absl::Milliseconds(10))) {
      return absl::InternalError(absl::StrCat(name, " exited during start-up"));
    }
  }
  return absl::DeadlineExceededError(absl::StrCat(name, " did not report its port in 30 s"));
}

std::vector<std::string> CrashRecoveryFlags(const std::string& checkpoint_dir, int every) {
  return {"--checkpoint_dir=" + checkpoint_dir, absl::StrCat("--checkpoint_every=", every),
          "--restore_from=" + checkpoint_dir};
}

absl::StatusOr<std::unique_ptr<ServerProcess>> StartServerAt(const std::string& address,
                                                             uint32_t shard_index,
                                                             uint32_t shard_count,
                                                             std::vector<std::string> flags,
                                                             const ServerPlacement& placement) {
  flags.push_back("--listen=" + address);  // (After Start's own: the last one counts.)
  return ServerProcess::Start(shard_index, shard_count, flags, placement);
}

absl::StatusOr<std::vector<std::unique_ptr<ServerProcess>>> StartCluster(
    uint32_t shard_count, const std::vector<std::string>& extra_flags,
    const ServerPlacement& placement) {
  std::vector<std::unique_ptr<ServerProcess>> servers;
  for (uint32_t i = 0; i < shard_count; ++i) {
    absl::StatusOr<std::unique_ptr<ServerProcess>> s =
        ServerProcess::Start(i, shard_count, extra_flags, placement);
    if (!s.ok()) return s.status();
    servers.push_back(std::move(*s));
  }
  return servers;
}

std::pair<int, std::string> RunShell(const std::string& command) {
  FILE* pipe = popen(absl::StrCat(command, " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
  const int status = pclose(pipe);
  return {WEXITSTATUS(status), output};
}

std::string FindSystemTool(const std::string& name) {
  for (const char* dir : {"/usr/sbin", "/sbin", "/usr/bin", "/bin"}) {
    const std::string path = absl::StrCat(dir, "/", name);
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

absl::Status RunTool(const std::vector<std::string>& argv) {
  absl::StatusOr<std::unique_ptr<ChildProcess>> child =
      ChildProcess::Start(argv[0], std::vector<std::string>(argv.begin() + 1, argv.end()));
  if (!child.ok()) return child.status();
  std::optional<int> rc = (*child)->Wait(absl::Seconds(30));
  if (!rc.has_value()) return absl::DeadlineExceededError(absl::StrJoin(argv, " "));
  if (*rc != 0) {
    return absl::InternalError(absl::StrCat(absl::StrJoin(argv, " "), " exited with ", *rc));
  }
  return absl::OkStatus();
}

std::vector<std::string> Addresses(const std::vector<std::unique_ptr<ServerProcess>>& servers) {
  std::vector<std::string> out;
  for (const auto& s : servers) out.push_back(s->address());
  return out;
}

std::optional<int> ServerExitsAtStart(const std::vector<std::string>& flags) {
  std::vector<std::string> args = {"--listen=127.0.0.1:0"};
  args.insert(args.end(), flags.begin(), flags.end());
  absl::StatusOr<std::unique_ptr<ChildProcess>> probe =
      ChildProcess::Start(Runfile("server/shardopt_server"), args);
  if (!probe.ok()) return 127;
  if (std::optional<int> rc = (*probe)->Wait(absl::Seconds(5))) return rc;
  (*probe)->Signal(SIGTERM);
  (*probe)->Wait(absl::Seconds(10));
  return std::nullopt;
}

}  // namespace shardopt::testing
