// Zero-copy framing of the tensor payloads in the client's streams.
//
// The generated stubs would copy every payload twice on the way out (into a
// protobuf `bytes` field, then into gRPC's buffers) and twice on the way in
// (parsing into a string, then into the trainer's buffer). These frame types
// speak the same wire format (shardopt.v1 PushGradientsRequest /
// PullParametersResponse) through custom grpc::SerializationTraits instead:
// - PushFrame serialises a chunk as a few bytes of protobuf framing followed
//   by a slice that points at the caller's gradient memory, so the payload is
//   copied only by the kernel. gRPC may still hold such a slice after the
//   call's Finish() (a server that answers early leaves data queued in the
//   transport): each slice pins a PayloadPins, and the caller's memory must
//   stay valid until PayloadPins::WaitUntilReleased() returns.
// - PullFrame parses a response straight out of gRPC's received slices into
//   the caller's parameter buffer: one copy.
// The server is unaffected: on the wire these are ordinary protobuf messages.
#ifndef SHARDOPT_CLIENT_WIRE_FRAMES_H_
#define SHARDOPT_CLIENT_WIRE_FRAMES_H_

#include <grpcpp/impl/serialization_traits.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/status.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/dtype.h"
#include "proto/shardopt/v1/shard_service.pb.h"

namespace shardopt {

// Counts the payload slices gRPC still holds.
class PayloadPins {
 public:
  void Acquire();
  void Release();
  // Blocks until every acquired pin is released.
  void WaitUntilReleased();

 private:
  absl::Mutex mu_;
  int64_t held_ ABSL_GUARDED_BY(mu_) = 0;
};

// One message of a PushGradients stream: the header, or a chunk of fp32
// gradient elements starting at range-local element `offset`.
struct PushFrame {
  const v1::PushGradientsRequest* header = nullptr;  // Set: send this message.
  uint64_t offset = 0;
  const void* data = nullptr;
  uint64_t count = 0;           // Elements.
  size_t element_size = 4;      // Bytes per element of the push's dtype.
  PayloadPins* pins = nullptr;  // Required with data.
};

// One message of a PullParameters stream of `dtype` elements, parsed (and
// widened exactly to fp32) into `destination`, the first element of this
// shard's range in the caller's flat buffer, holding `capacity` elements.
// After a Read: `version`, the chunk's `offset` and `count`; a malformed
// message fails the Read and leaves `error` set.
struct PullFrame {
  float* destination = nullptr;
  uint64_t capacity = 0;
  DType dtype = DType::kFloat32;
  std::vector<char> scratch;  // 16-bit payloads, before widening.
  int64_t version = 0;
  double lr = 0;
  uint64_t offset = 0;
  uint64_t count = 0;
  std::string error;
};

// Exposed for tests: the same parsing PullFrame's Deserialize does.
grpc::Status ParsePullResponse(grpc::ByteBuffer* buffer, PullFrame* frame);
grpc::Status SerializePushFrame(const PushFrame& frame, grpc::ByteBuffer* buffer);

}  // namespace shardopt

namespace grpc {

template <>
class SerializationTraits<shardopt::PushFrame, void> {
 public:
  static Status Serialize(const shardopt::PushFrame& frame, ByteBuffer* buffer, bool* own_buffer) {
    *own_buffer = true;
    return shardopt::SerializePushFrame(frame, buffer);
  }
  static Status Deserialize(ByteBuffer*, shardopt::PushFrame*) {
    return Status(StatusCode::INTERNAL, "PushFrame is write-only");
  }
};

template <>
class SerializationTraits<shardopt::PullFrame, void> {
 public:
  static Status Serialize(const shardopt::PullFrame&, ByteBuffer*, bool*) {
    return Status(StatusCode::INTERNAL, "PullFrame is read-only");
  }
  static Status Deserialize(ByteBuffer* buffer, shardopt::PullFrame* frame) {
    Status status = shardopt::ParsePullResponse(buffer, frame);
    buffer->Clear();
    return status;
  }
};

}  // namespace grpc

#endif  // SHARDOPT_CLIENT_WIRE_FRAMES_H_
