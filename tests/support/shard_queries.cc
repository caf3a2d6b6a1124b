#include "tests/support/shard_queries.h"

#include <grpcpp/grpcpp.h>

#include <chrono>

#include "gtest/gtest.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "tests/support/raw_calls.h"

namespace shardopt::testing {

v1::InspectResponse InspectOf(const std::string& address, const std::string& model) {
  v1::InspectResponse response;
  EXPECT_TRUE(RawInspect(*NewStub(address), model, &response).ok());
  return response;
}

v1::ServerInfo ServerInfoOf(const std::string& address) {
  v1::ServerInfo info;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  EXPECT_TRUE(NewStub(address)->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
  return info;
}

}  // namespace shardopt::testing
