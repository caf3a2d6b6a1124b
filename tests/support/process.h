// Test support: real child processes (shard servers, trainers) for tests.
//
// ChildProcess runs a binary with arguments, its stdout/stderr going to the
// test's log, and is killed (SIGKILL) and reaped when destroyed if still
// running. ServerProcess starts `shardopt_server` (or a test server that runs
// the same program, such as tests/fault_injecting_server) on 127.0.0.1 (or
// another placement) with port 0 and waits (bounded) for the port file, so
// ports never collide.
#ifndef SHARDOPT_TESTS_SUPPORT_PROCESS_H_
#define SHARDOPT_TESTS_SUPPORT_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace shardopt::testing {

// Absolute path of a file in the test's runfiles ("server/shardopt_server").
std::string Runfile(const std::string& workspace_relative_path);

// A fresh empty directory under the test's temporary directory.
std::string MakeTempDir(const std::string& prefix);

class ChildProcess {
 public:
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(const std::string& binary,
                                                             const std::vector<std::string>& args);
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  void Signal(int signal_number);
  // Waits up to `timeout`; returns the exit code (128 + signal when killed),
  // or nullopt if still running.
  std::optional<int> Wait(absl::Duration timeout);

 private:
  explicit ChildProcess(pid_t pid) : pid_(pid) {}
  pid_t pid_;
  std::optional<int> exit_code_;
};

// Where and what a server runs: on 127.0.0.1 of the test's own network, or on
// `host` through `launcher` (a command prefix such as IsolatedHost::Wrap's
// "ip netns exec NAME", which must exec the server in place); the binary
// `binary` (a runfile: the test needs it in its data).
struct ServerPlacement {
  std::string host = "127.0.0.1";
  std::vector<std::string> launcher;
  std::string binary = "server/shardopt_server";
};

class ServerProcess {
 public:
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(
      uint32_t shard_index, uint32_t shard_count, const std::vector<std::string>& extra_flags = {},
      const ServerPlacement& placement = {});

  const std::string& address() const { return address_; }
  ChildProcess& process() { return *process_; }

 private:
  std::unique_ptr<ChildProcess> process_;
  std::string address_;
};

// Runs `command` with /bin/sh, stderr merged into stdout; returns (exit
// code, output).
std::pair<int, std::string> RunShell(const std::string& command);

// Full path of a system tool ("ip", "nft"), or "" when absent.
std::string FindSystemTool(const std::string& name);

// Runs argv[0] (a full path) with the rest as arguments and waits up to 30 s;
// the command line and its exit status in the error.
absl::Status RunTool(const std::vector<std::string>& argv);

// nullopt when shardopt_server (a runfile) with `flags` (and a free port)
// stays up for its first 5 s (it is then stopped); else the exit code it
// ended with (127: it could not be started). For tests that need what a
// flag asks for (a GPU, NCCL) and skip where the server refuses it.
std::optional<int> ServerExitsAtStart(const std::vector<std::string>& flags);

// Starts S servers (shard 0..S-1 of S) with `extra_flags`; their addresses
// in shard order.
absl::StatusOr<std::vector<std::unique_ptr<ServerProcess>>> StartCluster(
    uint32_t shard_count, const std::vector<std::string>& extra_flags = {},
    const ServerPlacement& placement = {});
std::vector<std::string> Addresses(const std::vector<std::unique_ptr<ServerProcess>>& servers);

// The README's crash-recovery flags: periodic checkpoints every `every`
// steps into `checkpoint_dir`, restored from it at every start.
std::vector<std::string> CrashRecoveryFlags(const std::string& checkpoint_dir, int every);

// Starts shard `shard_index` of `shard_count` again with `flags` on `address`,
// the one a server that was killed had (trainers look for it there).
absl::StatusOr<std::unique_ptr<ServerProcess>> StartServerAt(const std::string& address,
                                                             uint32_t shard_index,
                                                             uint32_t shard_count,
                                                             std::vector<std::string> flags,
                                                             const ServerPlacement& placement = {});

}  // namespace shardopt::testing

#endif  // SHARDOPT_TESTS_SUPPORT_PROCESS_H_
