// Test support: a shard's answers to the read-only calls a test checks
// state with (gtest failures when the call fails; an empty answer then).
#ifndef SHARDOPT_TESTS_SUPPORT_SHARD_QUERIES_H_
#define SHARDOPT_TESTS_SUPPORT_SHARD_QUERIES_H_

#include <string>

#include "proto/shardopt/v1/shard_service.pb.h"

namespace shardopt::testing {

// Inspect of `model` (no slice) on the shard at `address`.
v1::InspectResponse InspectOf(const std::string& address, const std::string& model);
// GetServerInfo of the shard at `address`, within 10 s.
v1::ServerInfo ServerInfoOf(const std::string& address);

}  // namespace shardopt::testing

#endif  // SHARDOPT_TESTS_SUPPORT_SHARD_QUERIES_H_
