// What a trainer declares: its model (ModelSpec, identical on every trainer
// of a job) and how its client behaves (TrainerClientOptions).
#ifndef SHARDOPT_CLIENT_TRAINER_OPTIONS_H_
#define SHARDOPT_CLIENT_TRAINER_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/channel_security.h"
#include "common/consistency.h"
#include "common/dtype.h"
#include "common/layout.h"
#include "common/loss_scaler.h"
#include "common/lr_schedule.h"
#include "common/optimizer_config.h"

namespace shardopt {

enum class GradientReduction { kMean, kSum };

// The model every trainer of a job declares identically.
struct ModelSpec {
  std::string model_id;
  std::vector<TensorSpec> tensors;
  uint32_t alignment = 0;  // 0: ModelLayout::kDefaultAlignment.
  // kWholeTensors for optimizers that need whole tensors (LAMB, Adafactor,
  // Muon): see common/layout.h.
  Partition partition = Partition::kFlat;
  OptimizerConfig optimizer;
  LrSchedule lr_schedule;  // Default: constant (optimizer.lr every step).
  // Gradient control (GradientControl in the proto): with either on, Step()
  // fetches every shard's statistics and sends all shards one decision.
  double max_grad_norm = 0;   // > 0: clip the global L2 norm to this.
  bool loss_scaling = false;  // Dynamic loss scaling (see LossScaler).
  LossScalerOptions loss_scaler;
  uint32_t num_trainers = 1;
  GradientReduction reduction = GradientReduction::kMean;
  // The step protocol (ModelConfig.consistency in the proto). In the
  // asynchronous modes each trainer's Step is applied alone as it arrives
  // (no gradient control on the shards: clip the gradient before Step), a
  // pull returns each shard's newest parameters, and `staleness` (kBounded)
  // bounds how far a trainer's step may run ahead of the slowest one's.
  Consistency consistency = Consistency::kSync;
  int64_t staleness = 0;
};

struct TrainerClientOptions {
  uint32_t trainer_rank = 0;
  // Deadline of each single RPC attempt (a pull waiting for slower trainers
  // counts against it).
  absl::Duration rpc_timeout = absl::Seconds(60);
  // Deadline of each attempt of a streamed push (BeginStreamedPush), which
  // stays open while backward() computes the gradient: a backward pass
  // longer than rpc_timeout must not fail every attempt. (The server still
  // ends a stream that sends nothing for its --stream_idle_timeout_s.)
  absl::Duration streamed_push_timeout = absl::Minutes(15);
  // Total time a call keeps retrying retryable failures (and waiting for
  // other trainers) without progress.
  absl::Duration retry_budget = absl::Seconds(60);
  absl::Duration initial_backoff = absl::Milliseconds(20);
  absl::Duration max_backoff = absl::Seconds(2);
  // How long Attach() waits for rank 0 to register the model.
  absl::Duration attach_timeout = absl::Seconds(60);
  // A pull or statistics call that waits for other trainers reports what it
  // waits for this often (through on_wait) while it goes on waiting.
  absl::Duration wait_report_interval = absl::Seconds(5);
  // Receives those reports ("shard 0 (127.0.0.1:5000): ... waiting for
  // trainer 1 (last pushed step 11) to push step 12"); unset: a warning line
  // on stderr.
  std::function<void(const std::string& report)> on_wait;
  // Bytes of tensor data per streamed message.
  size_t chunk_bytes = 4 << 20;
  // Element types on the wire. Trainer buffers stay fp32; with bf16 / fp16
  // the client rounds gradients to nearest even before pushing (refusing a
  // step whose gradient overflows the type) and widens pulled parameters
  // exactly. The server's master weights and optimizer state stay fp32.
  DType push_dtype = DType::kFloat32;
  DType pull_dtype = DType::kFloat32;
  // Crash recovery: keep this trainer's gradients (as pushed) and decisions
  // of the last `replay_steps` steps in memory. A shard restarted from a
  // checkpoint at version v refuses later steps (OUT_OF_RANGE); the client
  // then brings every shard to a common step by re-pushing v + 1 .. (each
  // applied once, however many trainers re-push) and goes on. Make it larger
  // than twice the servers' --checkpoint_every, or use journal_path. 0 (and
  // no journal): no history; a shard's rollback then rolls the whole job
  // back to a checkpoint (see Step). Costs replay_steps gradient copies.
  int replay_steps = 0;
  // A directory (created if missing; one per trainer and model) where every
  // push is saved (fsync'ed) before it is sent, with its decision and the
  // hyperparameter changes this trainer sent: the history then survives the
  // trainer's own restart, and is kept from the oldest step any shard could
  // come back at (PushGradientsResponse.recovery_floor). A restarted trainer
  // re-sends what the shards lack, also a push it died in the middle of.
  // Empty: off.
  std::string journal_path;
  // TLS and the bearer token (plaintext without a token by default).
  ChannelSecurity security;
  // Steps without gradient control: the pull of step k opens (on a second
  // connection per shard) while its push still streams, and writes each
  // range into the parameter buffer as soon as the shard has updated it
  // (pipelined steps, server --pipeline_range_elements). Same bits either way.
  bool overlap_pull = true;
  // Shards on this host (same user, same network namespace) read pushes
  // from and write pulls into a shared-memory segment of this trainer
  // instead of the gRPC stream (client/shared_memory_route.h); the rest,
  // and streamed pushes, use the stream. Same bits either way.
  bool shared_memory = true;
  // Shards reached over plaintext that it does not reach through shared
  // memory: push and pull bytes go over a plain TCP connection to the
  // shard's payload socket (client/socket_payload_transport.h) instead of
  // HTTP/2 frames in the stream; never over TLS. Same bits either way.
  bool socket_payloads = true;
  // The device data plane (client/device_pair_transport.h): fp32 push and
  // pull bytes over a pair with each shard that opens pairs of this kind
  // (server --device_pairs): "nccl" (a GPU shard; this trainer's bytes go
  // through device `device_pair_gpu`), "loopback" (a CPU shard on this
  // host), or "off". Tried before the other planes; shards without such
  // pairs, and 16-bit payloads, go the other ways. Same bits either way.
  std::string device_pairs = "off";
  int device_pair_gpu = 0;
};

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_TRAINER_OPTIONS_H_
