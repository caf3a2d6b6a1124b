// Test support for the data-plane tests (shared_memory_test,
// device_pair_test): one short job of test_trainer processes on freshly
// started shard servers, and the bit-for-bit comparison of two such jobs.
#ifndef SHARDOPT_TESTS_SUPPORT_TRANSPORT_JOBS_H_
#define SHARDOPT_TESTS_SUPPORT_TRANSPORT_JOBS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace shardopt::testing {

struct TransportJob {
  // One entry per shard: its server's flags.
  std::vector<std::vector<std::string>> server_flags;
  uint32_t trainers = 1;
  // One entry per rank: its trainer's flags.
  std::vector<std::vector<std::string>> trainer_flags;
  std::string models;  // test_trainer's --models.
  int steps = 12;
  // Every process its own NCCL_HOSTID, so that NCCL takes processes on one
  // GPU for separate hosts (its socket transport).
  bool own_nccl_hosts = false;
};

// Runs the job to its end (gtest failures for what went wrong); returns the
// trainers' output root ("" when a server did not start).
std::string RunTransportJob(const TransportJob& job);

// Every rank's pulled parameters (<model>.bin) and the masters
// (<model>.master.bin) of each of `models` (comma-separated) have the same
// bits in the jobs at roots `a` and `b`.
void ExpectSameTrainerResults(const std::string& a, const std::string& b, uint32_t trainers,
                              const std::string& models, const std::string& label);

}  // namespace shardopt::testing

#endif  // SHARDOPT_TESTS_SUPPORT_TRANSPORT_JOBS_H_
