// Test support: shardopt.v1 calls made by hand, as a raw gRPC client (or
// grpcurl) would, for tests of what the server does with any input.
#ifndef SHARDOPT_TESTS_SUPPORT_RAW_CALLS_H_
#define SHARDOPT_TESTS_SUPPORT_RAW_CALLS_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "proto/shardopt/v1/shard_service.grpc.pb.h"

namespace shardopt::testing {

// One streamed message's tensor data.
struct RawChunk {
  uint64_t offset;
  std::string data;
};

// `count` floats from `values` as raw bytes.
std::string FloatBytes(const float* values, size_t count);

std::unique_ptr<v1::ShardService::Stub> NewStub(const std::string& address);

// RegisterModel: a header, then `chunks` as values (stopping early if the
// server has already answered).
grpc::Status RawRegister(v1::ShardService::Stub& stub, const v1::ModelConfig& config,
                         uint32_t shard_index, bool attach_only,
                         const std::vector<RawChunk>& chunks,
                         v1::RegisterModelResponse* response = nullptr);

// Inspect of `model_id` (no slice); with `deadline_seconds` > 0 the call
// gives up after that long.
grpc::Status RawInspect(v1::ShardService::Stub& stub, const std::string& model_id,
                        v1::InspectResponse* response, int deadline_seconds = 0);

// The unary method `full_method` ("/shardopt.v1.ShardService/Inspect") with
// `request_bytes` as the request, whatever they hold (the server parses
// them), within `timeout_ms`; the reply's bytes into `reply_bytes` if given;
// `authorization`, unless empty, as the call's `authorization` metadata.
grpc::Status RawUnaryCall(grpc::ChannelInterface* channel, const std::string& full_method,
                          const std::string& request_bytes, int timeout_ms,
                          std::string* reply_bytes = nullptr,
                          const std::string& authorization = "");

// The client-streaming method `full_method` with `messages` as the
// stream's messages, whatever they hold (the server parses each), within
// `timeout_ms`.
grpc::Status RawClientStream(grpc::ChannelInterface* channel, const std::string& full_method,
                             const std::vector<std::string>& messages, int timeout_ms);

// PushGradients: the header (unless null), then `chunks`.
grpc::Status RawPush(v1::ShardService::Stub& stub, const v1::PushHeader* header,
                     const std::vector<RawChunk>& chunks,
                     v1::PushGradientsResponse* response = nullptr);

}  // namespace shardopt::testing

#endif  // SHARDOPT_TESTS_SUPPORT_RAW_CALLS_H_
