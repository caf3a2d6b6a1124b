// Test support for bad_input_test and bad_model_setup_test: BadInputTest, a
// real shard-server process (shard 1 of 2) with one Adam model registered,
// hand-made calls against it, and the shard's observable state (version,
// ranks pushed, parameter bytes) to check that a refused call changed
// nothing.
#ifndef SHARDOPT_TESTS_BAD_INPUT_FIXTURE_H_
#define SHARDOPT_TESTS_BAD_INPUT_FIXTURE_H_

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/layout.h"
#include "gtest/gtest.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "tests/support/process.h"
#include "tests/support/raw_calls.h"

namespace shardopt::testing {

class BadInputTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kShardCount = 2;
  static constexpr uint32_t kShardIndex = 1;  // Not 0, so a defaulted shard_index is wrong.
  static constexpr uint32_t kTrainers = 2;
  static constexpr char kModel[] = "model";

  using Chunk = RawChunk;

  // v[begin, end) as raw bytes.
  static std::string Bytes(const std::vector<float>& v, size_t begin, size_t end);

  // Starts the server (with ServerFlags()) and registers `config_` with
  // `initial_` as values.
  void SetUp() override;
  virtual std::vector<std::string> ServerFlags() const { return {}; }

  grpc::Status Register(const v1::ModelConfig& config, bool attach_only,
                        const std::vector<Chunk>& chunks,
                        v1::RegisterModelResponse* response_out = nullptr,
                        uint32_t shard_index = kShardIndex);

  // A valid fp32 push header of the whole range.
  v1::PushHeader Header(uint32_t rank, int64_t step) const;

  // Sends a header (unless null) then chunks; `cancel_after` >= 0 cancels
  // the call after that many chunks instead of finishing the stream.
  grpc::Status Push(const v1::PushHeader* header, const std::vector<Chunk>& chunks,
                    v1::PushGradientsResponse* response_out = nullptr, int cancel_after = -1);

  // `grad` in chunks of `chunk` elements, in order, without gaps.
  std::vector<Chunk> GoodChunks(const std::vector<float>& grad, size_t chunk = 16) const;

  // scale * sin(i) over the range's tensor elements, zero on its padding.
  std::vector<float> Gradient(float scale) const;
  // Zeros the padding elements of a whole range's values.
  void ZeroPadding(std::vector<float>* range_values) const;

  // Pulls the raw payload bytes of `dtype` elements.
  grpc::Status PullBytes(int64_t min_version, v1::DType dtype, std::string* bytes, int64_t* version,
                         absl::Duration timeout = absl::Seconds(10),
                         const std::string& model = kModel, uint32_t shard_index = kShardIndex);

  grpc::Status Pull(int64_t min_version, std::vector<float>* values, int64_t* version,
                    absl::Duration timeout = absl::Seconds(10), const std::string& model = kModel,
                    uint32_t shard_index = kShardIndex);

  v1::InspectResponse Inspect();
  // GetServerInfo of the shard (a failed call fails the test).
  v1::ServerInfo Info();

  // The observable state: version, ranks pushed for the next step, values.
  struct State {
    int64_t version;
    std::vector<uint32_t> pushed;
    std::vector<float> values;
    bool operator==(const State& o) const {
      return version == o.version && pushed == o.pushed && values.size() == o.values.size() &&
             std::memcmp(values.data(), o.values.data(), values.size() * 4) == 0;
    }
  };
  State Capture();

  // `status` has `code` and a message containing `message_part`, and the
  // state is still `before`.
  void ExpectRejected(const grpc::Status& status, grpc::StatusCode code,
                      const std::string& message_part, const State& before);

  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<v1::ShardService::Stub> stub_;
  std::unique_ptr<ModelLayout> layout_;
  FlatRange range_;
  v1::ModelConfig config_;
  std::vector<float> initial_;
};

}  // namespace shardopt::testing

#endif  // SHARDOPT_TESTS_BAD_INPUT_FIXTURE_H_
