#include "tests/support/netns.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "tests/support/process.h"

namespace shardopt::testing {
namespace {

// A second octet per test process, so two concurrent test runs use
// different subnets (and the 10.200-249 range stays clear of common LANs).
int SubnetOctet() { return 200 + static_cast<int>(getpid() % 50); }

// Drops everything in and out of the namespace; the whole table is added or
// deleted at once, so a partition starts and ends atomically.
constexpr char kPartitionTable[] =
    "table inet shardopt_partition { "
    "chain in { type filter hook input priority 0; policy drop; }; "
    "chain out { type filter hook output priority 0; policy drop; }; }";

// Removes the namespaces and links of test processes that died without
// cleaning up (killed by a timeout): their subnets would clash with ours.
void RemoveStaleHosts(const std::string& ip) {
  DIR* dir = opendir("/run/netns");
  if (dir == nullptr) return;
  std::vector<std::string> stale;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.rfind("shardopt-", 0) != 0) continue;
    const long pid = std::strtol(name.c_str() + 9, nullptr, 10);
    if (pid > 0 && kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) stale.push_back(name);
  }
  closedir(dir);
  for (const std::string& name : stale) {
    const std::string tag = name.substr(9);
    RunTool({ip, "link", "del", absl::StrCat("so", tag, "a")}).IgnoreError();
    RunTool({ip, "netns", "del", name}).IgnoreError();
  }
}

}  // namespace

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

std::optional<std::string> IsolatedHost::Unsupported() {
  if (geteuid() != 0) return "network namespaces need root (CAP_NET_ADMIN)";
  for (const char* tool : {"ip", "nft"}) {
    if (FindSystemTool(tool).empty()) {
      return absl::StrCat("no `", tool, "` (Debian packages iproute2, nftables)");
    }
  }
  RemoveStaleHosts(FindSystemTool("ip"));
  // Creating one is the only real test of the capability.
  absl::StatusOr<std::unique_ptr<IsolatedHost>> probe = Create(63);
  if (!probe.ok())
    return absl::StrCat("cannot make a network namespace: ", probe.status().ToString());
  if (absl::Status s = (*probe)->Partition(); !s.ok()) {
    return absl::StrCat("cannot install nftables rules: ", s.ToString());
  }
  return std::nullopt;
}

absl::StatusOr<std::unique_ptr<IsolatedHost>> IsolatedHost::Create(int index) {
  if (index < 0 || index > 63) return absl::InvalidArgumentError("host index must be in [0, 63]");
  const std::string ip = FindSystemTool("ip");
  if (ip.empty()) return absl::FailedPreconditionError("no `ip` tool");
  auto host = std::unique_ptr<IsolatedHost>(new IsolatedHost());
  const std::string tag = absl::StrCat(getpid(), "x", index);
  host->netns_ = absl::StrCat("shardopt-", tag);
  host->link_ = absl::StrCat("so", tag, "a");  // At most 15 characters.
  const std::string peer = absl::StrCat("so", tag, "b");
  const std::string prefix = absl::StrCat("10.", SubnetOctet(), ".", index, ".");
  host->address_ = prefix + "2";
  const std::vector<std::vector<std::string>> steps = {
      {ip, "netns", "add", host->netns_},
      {ip, "link", "add", host->link_, "type", "veth", "peer", "name", peer},
      {ip, "link", "set", peer, "netns", host->netns_},
      {ip, "addr", "add", prefix + "1/24", "dev", host->link_},
      {ip, "link", "set", host->link_, "up"},
      {ip, "netns", "exec", host->netns_, ip, "addr", "add", prefix + "2/24", "dev", peer},
      {ip, "netns", "exec", host->netns_, ip, "link", "set", peer, "up"},
      {ip, "netns", "exec", host->netns_, ip, "link", "set", "lo", "up"},
  };
  for (const auto& step : steps) {
    // On failure the destructor removes what was made.
    if (absl::Status s = RunTool(step); !s.ok()) return s;
  }
  return host;
}

IsolatedHost::~IsolatedHost() {
  const std::string ip = FindSystemTool("ip");
  // Deleting one end of a veth pair deletes both; the namespace goes with
  // its last process.
  if (!link_.empty()) RunTool({ip, "link", "del", link_}).IgnoreError();
  if (!netns_.empty()) RunTool({ip, "netns", "del", netns_}).IgnoreError();
}

absl::Status IsolatedHost::Partition() {
  if (partitioned_) return absl::OkStatus();
  absl::Status s = RunTool(Wrap({FindSystemTool("nft"), kPartitionTable}));
  if (s.ok()) partitioned_ = true;
  return s;
}

absl::Status IsolatedHost::Heal() {
  if (!partitioned_) return absl::OkStatus();
  absl::Status s =
      RunTool(Wrap({FindSystemTool("nft"), "delete", "table", "inet", "shardopt_partition"}));
  if (s.ok()) partitioned_ = false;
  return s;
}

std::vector<std::string> IsolatedHost::Wrap(const std::vector<std::string>& command) const {
  std::vector<std::string> argv = {FindSystemTool("ip"), "netns", "exec", netns_};
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

}  // namespace shardopt::testing
