// DevicePairTransport: the device-pair PayloadTransport of one shard (the
// device data plane, common/device_pair.h): the bytes of an fp32 push or
// pull go over a pair the trainer opened with the shard (OpenDevicePair)
// instead of the gRPC stream; the call, its answer and every rule stay on
// gRPC (see v1::DevicePairPayload for the protocol).
//
// Buffers in host memory (TrainerClient's Step) feed a pair of a device
// kind (NCCL) piece by piece through its device scratch; a host kind
// (loopback) sends and receives them in place. During StepOnDevice the
// gradient is sent from, and the parameters received into, the trainer's
// device buffers themselves (DeviceTwins).
//
// It keeps a small pool of pairs (a push and the overlapped pull of a step
// each take one for their whole call, so that one pair never carries two
// transfers); a call that finds none idle opens one, within its deadline
// (at most two at a time: others go another way meanwhile). A shard that
// opens no pairs of this kind, or whose model lives in other memory, is
// asked again at most every kRetryInterval; one that could not be reached
// or did not join, after 250 ms, then doubling up to kRetryInterval;
// meanwhile the transport declines (the next data plane carries the
// bytes). While bytes move, the call's answer is awaited on a second
// thread: a shard that ends the call with an error ends the transfer too.
// A pair whose transfer failed is dropped, and the call fails UNAVAILABLE;
// its retry, and the calls for kFailureBackoff after (doubling while
// failures repeat), go another way (the stream), so that the step goes on
// over gRPC instead of waiting for a new pair to join.
// Thread-safe.
#ifndef SHARDOPT_CLIENT_DEVICE_PAIR_TRANSPORT_H_
#define SHARDOPT_CLIENT_DEVICE_PAIR_TRANSPORT_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/device_twins.h"
#include "client/payload_transport.h"
#include "common/device_pair.h"

namespace shardopt {

class DevicePairTransport final : public PayloadTransport {
 public:
  static constexpr absl::Duration kRetryInterval = absl::Seconds(30);
  static constexpr absl::Duration kJoinTimeout = absl::Seconds(30);
  // After a transfer over a pair failed, the transport declines this long
  // (doubling while failures repeat, up to kRetryInterval).
  static constexpr absl::Duration kFailureBackoff = absl::Seconds(1);

  // Pairs of `kind` on CUDA device `device` with shard `shard_index`;
  // `trainer` names this trainer to the shard ("trainer 1").
  // `twins` (may be null): the device twins of TrainerClient::StepOnDevice's
  // host mirrors, sent from and received into directly.
  DevicePairTransport(const DevicePairKind& kind, int device, uint32_t shard_index,
                      std::string trainer, std::shared_ptr<DeviceTwins> twins = nullptr);
  ~DevicePairTransport() override;

  const char* name() const override { return "device pair"; }
  std::optional<absl::Status> Push(const PayloadCall& call, const v1::PushGradientsRequest& header,
                                   const char* payload, size_t element_size,
                                   v1::PushGradientsResponse* response) override;
  std::optional<absl::Status> Pull(const PayloadCall& call,
                                   const v1::PullParametersRequest& request, DType dtype,
                                   float* destination, PulledVersion* pulled) override;
  int64_t transfers() const override { return transfers_.load(std::memory_order_relaxed); }

 private:
  struct Held {
    std::string name;
    std::unique_ptr<DevicePair> pair;
  };
  // An idle pair, or a new one; nullopt: decline.
  std::optional<Held> Take(const PayloadCall& call);
  absl::StatusOr<Held> Open(const PayloadCall& call);
  // After a call that left the pair clean.
  void Give(Held held);
  // After a transfer that failed on the pair: the retry and the calls for
  // a while after go another way. After one that succeeded: that ends.
  void TransferFailed(const absl::Status& why);
  void Succeeded();
  // After a shard's error `answer` to a call with `deadline`, given once no
  // byte moved or every byte moved cleanly: the pair is kept (a wait's
  // DEADLINE_EXCEEDED report included) unless the answer is about it (the
  // shard does not hold it, takes none, or keeps the model in other
  // memory: then UNAVAILABLE, so that the retry goes over a new pair or
  // another plane), or the call ended without the shard's answer: the
  // connection broke, it was cancelled, or its deadline passed. The shard
  // drops its end of a pair whose call was cancelled (the deadline
  // included) too: neither end can tell what the other moved then.
  absl::Status Answered(Held held, absl::Status answer, absl::Time deadline);
  // Moves `bytes` of host memory over the pair (through its scratch for a
  // device kind), until `cancelled` says the call ended.
  absl::Status SendHost(DevicePair& pair, const char* host, uint64_t bytes, absl::Time deadline,
                        const std::string& what, const std::function<bool()>& cancelled);
  absl::Status ReceiveHost(DevicePair& pair, char* host, uint64_t bytes, absl::Time deadline,
                           const std::string& what, const std::function<bool()>& cancelled);
  // The same from or into the pair's own memory (a device twin), in place.
  static absl::Status SendOwn(DevicePair& pair, const char* memory, uint64_t bytes,
                              absl::Time deadline, const std::string& what,
                              const std::function<bool()>& cancelled);
  static absl::Status ReceiveOwn(DevicePair& pair, char* memory, uint64_t bytes,
                                 absl::Time deadline, const std::string& what,
                                 const std::function<bool()>& cancelled);

  const DevicePairKind& kind_;
  const int device_;
  const uint32_t shard_index_;
  const std::string trainer_;
  const std::shared_ptr<DeviceTwins> twins_;
  absl::Mutex mu_;
  std::vector<Held> idle_ ABSL_GUARDED_BY(mu_);
  absl::Time retry_after_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Duration failure_backoff_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  absl::Duration open_backoff_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  std::string last_refusal_ ABSL_GUARDED_BY(mu_);
  bool announced_ ABSL_GUARDED_BY(mu_) = false;
  size_t opening_ ABSL_GUARDED_BY(mu_) = 0;  // Pairs being opened (outside mu_).
  std::atomic<uint64_t> next_transfer_{1};
  std::atomic<int64_t> transfers_{0};
};

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_DEVICE_PAIR_TRANSPORT_H_
