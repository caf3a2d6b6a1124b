// ShardConnection: a trainer's link to one shard server. It owns the
// channel (reopened after a failed connect), counts the attempts that found
// the shard unreachable, and makes ONE attempt of each call on a context
// the caller set up (deadline, cancellation). Retries, fan-out and recovery
// are the callers' (ShardFanOut, Recovery, TrainerClient).
//
// Payloads travel zero-copy (client/wire_frames.h): a push sends slices of
// the caller's buffer, which must outlive the `pins`; a pull writes straight
// into the caller's buffer. Calls of several threads may overlap (a pull's
// wait check probes every shard from one shard's worker thread while that
// shard's own worker reopens its channel): each call keeps the channel it
// started on (Link) until it ends. set_range and set_transport are not
// called while calls run.
#ifndef SHARDOPT_CLIENT_SHARD_CONNECTION_H_
#define SHARDOPT_CLIENT_SHARD_CONNECTION_H_

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/support/channel_arguments.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/channel_security.h"
#include "client/payload_transport.h"
#include "client/ready_ranges.h"
#include "client/wire_frames.h"
#include "common/dtype.h"
#include "common/layout.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"

namespace shardopt {

// How connections are opened.
struct ConnectionOptions {
  absl::Duration initial_backoff = absl::Milliseconds(20);
  absl::Duration max_backoff = absl::Seconds(2);
  // A peer that stops answering keepalive pings fails the calls open to it
  // within keepalive_time + keepalive_timeout.
  absl::Duration keepalive_time = absl::Seconds(3);
  absl::Duration keepalive_timeout = absl::Seconds(3);
  // Plaintext or TLS, and the bearer token (client/channel_security.h).
  ChannelFactory channels;
  // Connections of different lanes to one shard are separate TCP
  // connections (a channel argument tells them apart): the pull of a step
  // streams on lane 1 while its push streams on lane 0.
  int lane = 0;
};

class ShardConnection {
 public:
  ShardConnection(uint32_t index, std::string address, const ConnectionOptions& options);

  uint32_t index() const { return index_; }
  const std::string& address() const { return address_; }
  // The shard's part of the model's layout (set at register/attach).
  FlatRange range() const { return range_; }
  void set_range(FlatRange range) { range_ = range; }

  // The pair's other data plane (client/payload_transport.h), offered every
  // push but streamed ones and every pull before the stream; null: the
  // stream alone. Set before calls start (or to the one already set); the
  // lanes of one shard share one transport.
  void set_transport(std::shared_ptr<PayloadTransport> transport) {
    transport_ = std::move(transport);
  }
  const PayloadTransport* transport() const { return transport_.get(); }

  // Before an attempt: replaces a channel that failed to connect (a channel
  // that failed to reach a shard that was down can keep failing for many
  // seconds after it is back; a fresh one connects at once).
  void PrepareAttempt();
  // After an attempt: counts it when the shard was unreachable, or the
  // attempt's own deadline passed (`deadline_passed`; a server's earlier
  // DEADLINE_EXCEEDED is its report that it still waits, not a failure).
  void RecordAttempt(const absl::Status& status, bool deadline_passed);
  // Attempts that failed UNAVAILABLE or DEADLINE_EXCEEDED (the client's own
  // deadline; not a server's report that it is still waiting).
  int64_t unreachable_attempts() const { return unreachable_attempts_.load(); }

  // "shard 1 (127.0.0.1:5000): <what>: <cause>", keeping the cause's code.
  absl::Status Annotate(const absl::Status& status, const std::string& what) const;

  // ---- One attempt of each call.
  // The register stream: the header, then `count` initial values (none to
  // attach) in chunks of `chunk_bytes`.
  absl::Status Register(grpc::ClientContext& context, const v1::RegisterHeader& header,
                        const float* values, uint64_t count, size_t chunk_bytes,
                        v1::RegisterModelResponse* response);
  // The push stream of `header.num_elements` elements of `element_size`
  // bytes at `payload` (this shard's part). With `ready` (flat-buffer
  // elements, see ReadyRanges), each chunk waits until it is ready and the
  // stream ends only once commits are allowed; FAILED_PRECONDITION (the
  // stream cancelled, not committed) when it fails.
  absl::Status Push(grpc::ClientContext& context, const v1::PushGradientsRequest& header,
                    const char* payload, size_t element_size, size_t chunk_bytes,
                    PayloadPins* pins, v1::PushGradientsResponse* response,
                    const ReadyRanges* ready = nullptr);
  // Pulls this shard's range as `dtype` into `destination` (range().size()
  // floats); with request.wait_only, only waits.
  absl::Status Pull(grpc::ClientContext& context, const v1::PullParametersRequest& request,
                    DType dtype, float* destination, PulledVersion* pulled);
  absl::Status GetStepStats(grpc::ClientContext& context, const v1::GetStepStatsRequest& request,
                            v1::StepStats* stats);
  absl::Status SetHyperparameters(grpc::ClientContext& context,
                                  const v1::SetHyperparametersRequest& request);
  absl::Status Checkpoint(grpc::ClientContext& context, const v1::CheckpointRequest& request,
                          v1::CheckpointResponse* response);
  absl::Status Inspect(grpc::ClientContext& context, const v1::InspectRequest& request,
                       v1::InspectResponse* response);
  // The summary of `model_id` here; NOT_FOUND when the server does not hold
  // it (it came back without it).
  absl::Status Summary(grpc::ClientContext& context, const std::string& model_id,
                       v1::ModelSummary* summary);
  absl::Status RollBack(grpc::ClientContext& context, const v1::RollBackRequest& request,
                        v1::RollBackResponse* response);

 private:
  // One channel with what calls on it need; replaced whole by a reopen.
  struct Link {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::ShardService::Stub> stub;
    std::unique_ptr<grpc::internal::RpcMethod> push_method;
    std::unique_ptr<grpc::internal::RpcMethod> pull_method;
  };
  std::shared_ptr<Link> OpenLink() const;
  // The channel a call starts on (it holds it until it ends).
  std::shared_ptr<Link> CurrentLink() const;

  const uint32_t index_;
  const std::string address_;
  const ChannelFactory channels_;
  grpc::ChannelArguments channel_args_;
  mutable absl::Mutex link_mu_;
  std::shared_ptr<Link> link_ ABSL_GUARDED_BY(link_mu_);
  std::atomic<bool> reopen_channel_{false};
  std::shared_ptr<PayloadTransport> transport_;
  FlatRange range_;
  std::atomic<int64_t> unreachable_attempts_{0};
};

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_SHARD_CONNECTION_H_
