#include "tests/support/raw_calls.h"

#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>

#include <chrono>

namespace shardopt::testing {

std::string FloatBytes(const float* values, size_t count) {
  return std::string(reinterpret_cast<const char*>(values), count * sizeof(float));
}

std::unique_ptr<v1::ShardService::Stub> NewStub(const std::string& address) {
  return v1::ShardService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

grpc::Status RawInspect(v1::ShardService::Stub& stub, const std::string& model_id,
                        v1::InspectResponse* response, int deadline_seconds) {
  grpc::ClientContext context;
  if (deadline_seconds > 0) {
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(deadline_seconds));
  }
  v1::InspectRequest request;
  request.set_model_id(model_id);
  return stub.Inspect(&context, request, response);
}

grpc::Status RawUnaryCall(grpc::ChannelInterface* channel, const std::string& full_method,
                          const std::string& request_bytes, int timeout_ms,
                          std::string* reply_bytes, const std::string& authorization) {
  grpc::Slice slice(request_bytes.data(), request_bytes.size());
  grpc::ByteBuffer request(&slice, 1), reply;
  grpc::internal::RpcMethod method(full_method.c_str(), grpc::internal::RpcMethod::NORMAL_RPC);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  if (!authorization.empty()) context.AddMetadata("authorization", authorization);
  const grpc::Status status = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel, method, &context, request, &reply);
  if (status.ok() && reply_bytes != nullptr) {
    std::vector<grpc::Slice> slices;
    if (!reply.Dump(&slices).ok())
      return grpc::Status(grpc::StatusCode::INTERNAL, "unreadable reply");
    reply_bytes->clear();
    for (const grpc::Slice& s : slices) {
      reply_bytes->append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  return status;
}

grpc::Status RawClientStream(grpc::ChannelInterface* channel, const std::string& full_method,
                             const std::vector<std::string>& messages, int timeout_ms) {
  grpc::internal::RpcMethod method(full_method.c_str(),
                                   grpc::internal::RpcMethod::CLIENT_STREAMING);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  grpc::ByteBuffer reply;
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(channel, method, &context,
                                                                    &reply));
  bool open = true;
  for (const std::string& m : messages) {
    grpc::Slice slice(m.data(), m.size());
    grpc::ByteBuffer message(&slice, 1);
    if (!(open = writer->Write(message))) break;
  }
  if (open) writer->WritesDone();
  return writer->Finish();
}

grpc::Status RawRegister(v1::ShardService::Stub& stub, const v1::ModelConfig& config,
                         uint32_t shard_index, bool attach_only,
                         const std::vector<RawChunk>& chunks,
                         v1::RegisterModelResponse* response_out) {
  grpc::ClientContext context;
  v1::RegisterModelResponse response;
  auto writer = stub.RegisterModel(&context, &response);
  v1::RegisterModelRequest request;
  *request.mutable_header()->mutable_config() = config;
  request.mutable_header()->set_shard_index(shard_index);
  request.mutable_header()->set_attach_only(attach_only);
  bool open = writer->Write(request);
  for (const RawChunk& c : chunks) {
    if (!open) break;
    request.mutable_values()->set_offset(c.offset);
    request.mutable_values()->set_data(c.data);
    open = writer->Write(request);
  }
  if (open) writer->WritesDone();
  grpc::Status status = writer->Finish();
  if (response_out != nullptr) *response_out = response;
  return status;
}

grpc::Status RawPush(v1::ShardService::Stub& stub, const v1::PushHeader* header,
                     const std::vector<RawChunk>& chunks, v1::PushGradientsResponse* response_out) {
  grpc::ClientContext context;
  v1::PushGradientsResponse response;
  auto writer = stub.PushGradients(&context, &response);
  v1::PushGradientsRequest request;
  bool open = true;
  if (header != nullptr) {
    *request.mutable_header() = *header;
    open = writer->Write(request);
  }
  for (const RawChunk& c : chunks) {
    if (!open) break;
    request.mutable_chunk()->set_offset(c.offset);
    request.mutable_chunk()->set_data(c.data);
    open = writer->Write(request);
  }
  if (open) writer->WritesDone();
  grpc::Status status = writer->Finish();
  if (response_out != nullptr) *response_out = response;
  return status;
}

}  // namespace shardopt::testing
