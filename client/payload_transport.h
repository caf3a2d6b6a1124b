// PayloadTransport: another way for the bytes of one (trainer, shard) pair's
// pushes and pulls to travel than the gRPC stream.
//
// The stream always works and carries every control message (registration,
// headers, answers, decisions) and every exactly-once rule. A transport is
// chosen per pair (TrainerClient sets one on each shard's connections, the
// lanes of a shard sharing it); ShardConnection offers it every push that is
// not streamed during backward and every pull, and a transport that cannot
// carry one now (not attached to that shard, no room for the type) declines,
// and the stream carries it. An attempt a transport makes is one attempt of
// the call, with the call's context: the shard answers it over gRPC as it
// answers a stream, and a transport whose link to the shard broke answers
// UNAVAILABLE, so that the retry goes over the stream or a new link. Today:
// shared memory (client/shared_memory_transport.h); NCCL would be another.
#ifndef SHARDOPT_CLIENT_PAYLOAD_TRANSPORT_H_
#define SHARDOPT_CLIENT_PAYLOAD_TRANSPORT_H_

#include <grpcpp/client_context.h>

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "common/layout.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"

namespace shardopt {

// What a pull returned.
struct PulledVersion {
  int64_t version = -1;
  double lr = 0;  // Of the step that made the version.
};

// One attempt's context: the call's, the shard's stub, the shard's range.
struct PayloadCall {
  grpc::ClientContext& context;
  v1::ShardService::Stub& stub;
  FlatRange range;
};

class PayloadTransport {
 public:
  virtual ~PayloadTransport() = default;
  virtual const char* name() const = 0;
  // The push of `header` with its payload at `payload` (range.size()
  // elements of `element_size` bytes); nullopt when declined.
  virtual std::optional<absl::Status> Push(const PayloadCall& call,
                                           const v1::PushGradientsRequest& header,
                                           const char* payload, size_t element_size,
                                           v1::PushGradientsResponse* response) = 0;
  // The pull `request` as `dtype` into `destination` (range.size() floats);
  // nullopt when declined.
  virtual std::optional<absl::Status> Pull(const PayloadCall& call,
                                           const v1::PullParametersRequest& request, DType dtype,
                                           float* destination, PulledVersion* pulled) = 0;
  // Pushes and pulls this transport carried.
  virtual int64_t transfers() const = 0;
};

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_PAYLOAD_TRANSPORT_H_
