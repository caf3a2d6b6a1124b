// Test support: TwoShardClusterTest, a fixture with two real shard-server
// processes (StartCluster(2)) and trainer clients connected to them with
// short timeouts, for the trainer library's cluster-wide tests.
#ifndef SHARDOPT_TESTS_SUPPORT_TWO_SHARD_CLUSTER_H_
#define SHARDOPT_TESTS_SUPPORT_TWO_SHARD_CLUSTER_H_

#include <memory>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "client/trainer_client.h"
#include "gtest/gtest.h"
#include "tests/support/process.h"

namespace shardopt::testing {

class TwoShardClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto servers = StartCluster(2);
    ASSERT_TRUE(servers.ok()) << servers.status();
    servers_ = std::move(*servers);
  }

  // Trainer `rank`: 10 s per call, a 5 s retry budget.
  std::unique_ptr<TrainerClient> Connect(uint32_t rank) {
    TrainerClientOptions options;
    options.trainer_rank = rank;
    options.rpc_timeout = absl::Seconds(10);
    options.retry_budget = absl::Seconds(5);
    return TrainerClient::Connect(Addresses(servers_), options).value();
  }

  std::vector<std::unique_ptr<ServerProcess>> servers_;
};

}  // namespace shardopt::testing

#endif  // SHARDOPT_TESTS_SUPPORT_TWO_SHARD_CLUSTER_H_
