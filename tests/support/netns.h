// Test support: a second "host" for cluster tests, made of a network
// namespace of its own joined to the test's namespace by a veth pair, so that
// the test can cut it off the network and reconnect it the way a failed
// switch or a pulled cable would, while its processes keep running.
//
// Partition() installs an nftables table in the namespace that drops every
// packet in and out, silently: connects to it time out, open TCP connections
// stall and retransmit, and after Heal() they carry on where they stopped.
// Needs root (CAP_NET_ADMIN) and the `ip` and `nft` tools; Unsupported()
// says why not, for a test to skip with.
//
// Names carry the test's pid. The hosts of one test process share a /16 in
// 10.201-230.x.x that no route of the machine uses when the first host is
// made (chosen under a lock file, so concurrent test processes take
// different ones). The namespace and the veth pair are removed when the
// object is destroyed; RemoveStaleHosts() removes those of test processes
// that were killed before they could.
#ifndef SHARDOPT_TESTS_SUPPORT_NETNS_H_
#define SHARDOPT_TESTS_SUPPORT_NETNS_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardopt::testing {

class IsolatedHost {
 public:
  // The reason this machine cannot make isolated hosts, or nullopt (it makes
  // and removes a probe host to find out).
  static std::optional<std::string> Unsupported();

  // Removes the namespaces and veth links of dead test processes.
  static void RemoveStaleHosts();

  // Host `index` (0..62) of this test process: address 10.<a>.<index>.2,
  // with the test's end of the link at 10.<a>.<index>.1, its gateway (so its
  // processes reach every address of the test's namespace, the other hosts'
  // gateways included).
  static absl::StatusOr<std::unique_ptr<IsolatedHost>> Create(int index);
  ~IsolatedHost();

  const std::string& netns() const { return netns_; }
  const std::string& address() const { return address_; }
  const std::string& gateway() const { return gateway_; }

  // Drop every packet in and out of the host / stop dropping them.
  absl::Status Partition();
  absl::Status Heal();

  // argv that runs `command` inside the namespace ("ip netns exec NAME ...").
  std::vector<std::string> Wrap(const std::vector<std::string>& command) const;

 private:
  IsolatedHost() = default;

  std::string netns_;
  std::string link_;  // The test's end of the veth pair.
  std::string address_;
  std::string gateway_;
  bool partitioned_ = false;
};

}  // namespace shardopt::testing

#endif  // SHARDOPT_TESTS_SUPPORT_NETNS_H_
