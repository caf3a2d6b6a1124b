#include "tests/support/netns.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "tests/support/process.h"

namespace shardopt::testing {
namespace {

constexpr int kFirstOctet = 201, kOctets = 30;  // 10.201.0.0/16 .. 10.230.0.0/16.
constexpr int kProbeIndex = 63;

// Drops everything in and out of the namespace; the whole table is added or
// deleted at once, so a partition starts and ends atomically.
constexpr char kPartitionTable[] =
    "table inet shardopt_partition { "
    "chain in { type filter hook input priority 0; policy drop; }; "
    "chain out { type filter hook output priority 0; policy drop; }; }";

// (second, third) octets of the 10.x.y.0 destinations of this namespace's
// routes.
std::set<std::pair<int, int>> RoutesInUse() {
  std::set<std::pair<int, int>> used;
  std::ifstream routes("/proc/net/route");
  std::string line;
  std::getline(routes, line);  // Header.
  while (std::getline(routes, line)) {
    std::istringstream fields(line);
    std::string iface, destination_hex;
    fields >> iface >> destination_hex;
    // Little-endian hex: 10.X.Y.Z is 0xZZYYXX0A.
    const unsigned long destination = std::strtoul(destination_hex.c_str(), nullptr, 16);
    if ((destination & 0xff) == 10) {
      used.insert({static_cast<int>((destination >> 8) & 0xff),
                   static_cast<int>((destination >> 16) & 0xff)});
    }
  }
  return used;
}

// The names of test host `tag` (<pid>x<index>): its namespace and the test's
// end of its veth pair (at most 15 characters).
std::string NamespaceName(const std::string& tag) { return "shardopt-" + tag; }
std::string LinkName(const std::string& tag) { return absl::StrCat("so", tag, "a"); }

absl::Mutex subnet_mu;
int subnet_octet ABSL_GUARDED_BY(subnet_mu) = 0;  // 0: not chosen yet.

// Held while a host is made: another test process chooses its /16 only
// after this one's first route exists.
class MachineLock {
 public:
  MachineLock() : fd_(open("/tmp/shardopt-netns.lock", O_CREAT | O_RDWR, 0644)) {
    if (fd_ >= 0) flock(fd_, LOCK_EX);
  }
  ~MachineLock() {
    if (fd_ >= 0) close(fd_);  // Releases the lock.
  }

 private:
  int fd_;
};

}  // namespace

void IsolatedHost::RemoveStaleHosts() {
  const std::string ip = FindSystemTool("ip");
  DIR* dir = opendir("/run/netns");
  if (ip.empty() || dir == nullptr) {
    if (dir != nullptr) closedir(dir);
    return;
  }
  std::vector<std::string> stale;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    const std::string prefix = NamespaceName("");
    if (name.rfind(prefix, 0) != 0) continue;
    const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
    if (pid > 0 && kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) stale.push_back(name);
  }
  closedir(dir);
  for (const std::string& name : stale) {
    const std::string tag = name.substr(NamespaceName("").size());
    RunTool({ip, "link", "del", LinkName(tag)}).IgnoreError();
    RunTool({ip, "netns", "del", name}).IgnoreError();
  }
}

std::optional<std::string> IsolatedHost::Unsupported() {
  if (geteuid() != 0) return "network namespaces need root (CAP_NET_ADMIN)";
  for (const char* tool : {"ip", "nft"}) {
    if (FindSystemTool(tool).empty()) {
      return absl::StrCat("no `", tool, "` (Debian packages iproute2, nftables)");
    }
  }
  // Making one is the only real test of the capability.
  absl::StatusOr<std::unique_ptr<IsolatedHost>> probe = Create(kProbeIndex);
  if (!probe.ok()) {
    return absl::StrCat("cannot make a network namespace: ", probe.status().ToString());
  }
  if (absl::Status s = (*probe)->Partition(); !s.ok()) {
    return absl::StrCat("cannot install nftables rules: ", s.ToString());
  }
  return std::nullopt;
}

absl::StatusOr<std::unique_ptr<IsolatedHost>> IsolatedHost::Create(int index) {
  if (index < 0 || index > kProbeIndex) {
    return absl::InvalidArgumentError("host index must be in [0, 63]");
  }
  const std::string ip = FindSystemTool("ip");
  if (ip.empty()) return absl::FailedPreconditionError("no `ip` tool");
  MachineLock machine_lock;
  absl::MutexLock lock(&subnet_mu);
  const std::set<std::pair<int, int>> used = RoutesInUse();
  if (subnet_octet == 0) {
    for (int i = 0; i < kOctets && subnet_octet == 0; ++i) {
      const int octet = kFirstOctet + (static_cast<int>(getpid()) + i) % kOctets;
      bool free = true;
      for (const auto& [second, third] : used) free &= second != octet;
      if (free) subnet_octet = octet;
    }
    if (subnet_octet == 0) {
      return absl::ResourceExhaustedError("every 10.201-230.0.0/16 is in use on this machine");
    }
  }
  if (used.count({subnet_octet, index}) > 0) {
    // Another process took the /16 after this one chose it (rare).
    return absl::AlreadyExistsError(
        absl::StrCat("10.", subnet_octet, ".", index, ".0/24 is already routed on this machine"));
  }
  auto host = std::unique_ptr<IsolatedHost>(new IsolatedHost());
  const std::string tag = absl::StrCat(getpid(), "x", index);
  host->netns_ = NamespaceName(tag);
  host->link_ = LinkName(tag);
  const std::string peer = absl::StrCat("so", tag, "b");
  const std::string prefix = absl::StrCat("10.", subnet_octet, ".", index, ".");
  host->address_ = prefix + "2";
  host->gateway_ = prefix + "1";
  const std::vector<std::vector<std::string>> steps = {
      {ip, "netns", "add", host->netns_},
      {ip, "link", "add", host->link_, "type", "veth", "peer", "name", peer},
      {ip, "link", "set", peer, "netns", host->netns_},
      {ip, "addr", "add", prefix + "1/24", "dev", host->link_},
      {ip, "link", "set", host->link_, "up"},
      {ip, "netns", "exec", host->netns_, ip, "addr", "add", prefix + "2/24", "dev", peer},
      {ip, "netns", "exec", host->netns_, ip, "link", "set", peer, "up"},
      {ip, "netns", "exec", host->netns_, ip, "link", "set", "lo", "up"},
      {ip, "netns", "exec", host->netns_, ip, "route", "add", "default", "via", prefix + "1"},
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
