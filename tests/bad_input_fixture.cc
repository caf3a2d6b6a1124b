// BadInputTest's server, model and hand-made calls (bad_input_fixture.h).
#include "tests/bad_input_fixture.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/status/statusor.h"
#include "common/optimizer_config.h"
#include "common/proto_convert.h"

namespace shardopt::testing {

std::string BadInputTest::Bytes(const std::vector<float>& v, size_t begin, size_t end) {
  return FloatBytes(v.data() + begin, end - begin);
}

void BadInputTest::SetUp() {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(kShardIndex, kShardCount, ServerFlags());
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = std::move(*server);
  stub_ = NewStub(server_->address());

  layout_ = std::make_unique<ModelLayout>(
      ModelLayout::Create({{"w", {10, 13}, DType::kFloat32}, {"b", {13}, DType::kFloat32}}, 16,
                          kShardCount)
          .value());
  range_ = layout_->ShardRange(kShardIndex);
  config_.set_model_id(kModel);
  *config_.mutable_layout() = LayoutToProto(*layout_);
  OptimizerConfig adam = OptimizerConfig::Adam(0.01);
  *config_.mutable_optimizer() = OptimizerConfigToProto(adam);
  config_.set_num_trainers(kTrainers);
  config_.set_shard_count(kShardCount);
  initial_.resize(range_.size());
  for (size_t i = 0; i < initial_.size(); ++i) initial_[i] = 0.01f * static_cast<float>(i);
  ZeroPadding(&initial_);
  grpc::Status s = Register(config_, false, {{0, Bytes(initial_, 0, initial_.size())}});
  ASSERT_TRUE(s.ok()) << s.error_message();
}

grpc::Status BadInputTest::Register(const v1::ModelConfig& config, bool attach_only,
                                    const std::vector<Chunk>& chunks,
                                    v1::RegisterModelResponse* response_out, uint32_t shard_index) {
  return RawRegister(*stub_, config, shard_index, attach_only, chunks, response_out);
}

v1::PushHeader BadInputTest::Header(uint32_t rank, int64_t step) const {
  v1::PushHeader h;
  h.set_model_id(kModel);
  h.set_trainer_rank(rank);
  h.set_step(step);
  h.set_shard_index(kShardIndex);
  h.set_num_elements(range_.size());
  h.set_dtype(v1::DTYPE_FLOAT32);
  return h;
}

grpc::Status BadInputTest::Push(const v1::PushHeader* header, const std::vector<Chunk>& chunks,
                                v1::PushGradientsResponse* response_out, int cancel_after) {
  if (cancel_after < 0) return RawPush(*stub_, header, chunks, response_out);
  grpc::ClientContext context;
  v1::PushGradientsResponse response;
  auto writer = stub_->PushGradients(&context, &response);
  v1::PushGradientsRequest request;
  *request.mutable_header() = *header;
  bool open = writer->Write(request);
  for (int sent = 0; open && sent < cancel_after && sent < static_cast<int>(chunks.size());
       ++sent) {
    request.mutable_chunk()->set_offset(chunks[sent].offset);
    request.mutable_chunk()->set_data(chunks[sent].data);
    open = writer->Write(request);
  }
  context.TryCancel();
  writer->Finish();
  return grpc::Status(grpc::CANCELLED, "cancelled by test");
}

std::vector<BadInputTest::Chunk> BadInputTest::GoodChunks(const std::vector<float>& grad,
                                                          size_t chunk) const {
  std::vector<Chunk> chunks;
  for (size_t off = 0; off < grad.size(); off += chunk) {
    chunks.push_back({off, Bytes(grad, off, std::min(grad.size(), off + chunk))});
  }
  return chunks;
}

std::vector<float> BadInputTest::Gradient(float scale) const {
  std::vector<float> g(range_.size());
  for (size_t i = 0; i < g.size(); ++i) g[i] = scale * std::sin(static_cast<float>(i));
  ZeroPadding(&g);
  return g;
}

void BadInputTest::ZeroPadding(std::vector<float>* range_values) const {
  shardopt::ZeroPadding(*layout_, range_, range_values->data());
}

grpc::Status BadInputTest::PullBytes(int64_t min_version, v1::DType dtype, std::string* bytes,
                                     int64_t* version, absl::Duration timeout,
                                     const std::string& model, uint32_t shard_index) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::PullParametersRequest request;
  request.set_model_id(model);
  request.set_min_version(min_version);
  request.set_shard_index(shard_index);
  request.set_dtype(dtype);
  auto reader = stub_->PullParameters(&context, request);
  v1::PullParametersResponse response;
  const size_t element = dtype == v1::DTYPE_FLOAT32 ? 4 : 2;
  bytes->clear();
  while (reader->Read(&response)) {
    *version = response.version();
    EXPECT_EQ(response.chunk().offset(), bytes->size() / element);
    *bytes += response.chunk().data();
  }
  return reader->Finish();
}

grpc::Status BadInputTest::Pull(int64_t min_version, std::vector<float>* values, int64_t* version,
                                absl::Duration timeout, const std::string& model,
                                uint32_t shard_index) {
  std::string bytes;
  grpc::Status status =
      PullBytes(min_version, v1::DTYPE_FLOAT32, &bytes, version, timeout, model, shard_index);
  values->resize(bytes.size() / 4);
  if (!values->empty()) std::memcpy(values->data(), bytes.data(), values->size() * 4);
  return status;
}

v1::InspectResponse BadInputTest::Inspect() {
  grpc::ClientContext context;
  v1::InspectRequest request;
  request.set_model_id(kModel);
  v1::InspectResponse response;
  grpc::Status s = stub_->Inspect(&context, request, &response);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return response;
}

v1::ServerInfo BadInputTest::Info() {
  grpc::ClientContext context;
  v1::ServerInfo info;
  grpc::Status s = stub_->GetServerInfo(&context, v1::GetServerInfoRequest(), &info);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return info;
}

BadInputTest::State BadInputTest::Capture() {
  v1::InspectResponse info = Inspect();
  State state{info.version(), {info.trainers_pushed().begin(), info.trainers_pushed().end()}, {}};
  int64_t version = -1;
  grpc::Status s = Pull(0, &state.values, &version);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(version, state.version);
  return state;
}

void BadInputTest::ExpectRejected(const grpc::Status& status, grpc::StatusCode code,
                                  const std::string& message_part, const State& before) {
  EXPECT_EQ(status.error_code(), code) << status.error_message();
  EXPECT_NE(status.error_message().find(message_part), std::string::npos)
      << "message: " << status.error_message();
  EXPECT_TRUE(Capture() == before) << "state changed after: " << status.error_message();
}

}  // namespace shardopt::testing
