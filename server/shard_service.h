// ShardServiceImpl: the gRPC face of one shard server (shardopt.v1.ShardService).
//
// Holds the models registered on this shard (ModelRegistry of HostedModel)
// and translates between the wire contract and ModelShard: it validates
// every request before touching state, so a malformed call gets
// INVALID_ARGUMENT / NOT_FOUND / FAILED_PRECONDITION / UNIMPLEMENTED and
// changes nothing. The step calls (register, push, pull) are in
// shard_service.cc, statistics and hyperparameters in
// shard_service_step_control.cc, payloads through shared memory and over
// payload sockets in shard_service_shared_memory.cc and
// shard_service_socket.cc; the calls that read or replace
// a model's state as a whole (inspect, server info, checkpoint, rollback)
// and the restore before serving, with loading a checkpoint into a model
// (LoadModel), in shard_service_state.cc. Thread-safe; gRPC's sync server
// calls it from many threads.
#ifndef SHARDOPT_SERVER_SHARD_SERVICE_H_
#define SHARDOPT_SERVER_SHARD_SERVICE_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/file.h"
#include "common/segment_fence.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "server/access_control.h"
#include "server/checkpointing.h"
#include "server/device_pair_host.h"
#include "server/hosted_model.h"
#include "server/metrics.h"
#include "server/model_registry.h"
#include "server/model_shard.h"
#include "server/parallel_for.h"
#include "server/payload_socket_host.h"
#include "server/pull_place_claims.h"
#include "server/shared_memory_host.h"
#include "server/state_budget.h"
#include "server/stream_watchdog.h"

namespace shardopt {

struct ShardServerOptions {
  uint32_t shard_index = 0;
  uint32_t shard_count = 1;
  int threads = 1;
  // Where models live and are updated: -1 the CPU (on `threads` threads),
  // else this GPU (see server/device_support.h).
  int gpu_index = -1;
  // Bytes of parameter data per PullParameters message. 1 MiB keeps every
  // message under gRPC's default 4 MiB receive limit (grpcurl, Python).
  size_t pull_chunk_bytes = 1 << 20;
  // Elements per pipeline range of every model's steps
  // (ModelShardOptions::pipeline_range_elements); 0: whole steps.
  uint64_t pipeline_range_elements = uint64_t{1} << 20;
  // Keep a timeline of each step (ModelShardOptions::step_timeline).
  bool step_timeline = false;
  // Push and register streams that send nothing for this long are cancelled
  // (see StreamWatchdog); zero disables.
  absl::Duration stream_idle_timeout = absl::Seconds(60);
  // Most threads gRPC's sync server may use (every blocked pull holds one).
  int max_threads = 1024;
  // Registrations whose state (parameters, optimizer slots, per-trainer
  // staging) would take the models on this server past this many bytes are
  // refused with RESOURCE_EXHAUSTED instead of exhausting memory.
  uint64_t max_state_bytes = uint64_t{1} << 40;
  // Periodic checkpoints: with both set, every model is saved at every
  // version that is a multiple of checkpoint_every (version 0 included) to
  // checkpoint_dir/<model_id>/step-<version>/.
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  // Periodic checkpoints kept per model (older ones are removed); 0 keeps all.
  int checkpoint_keep = 0;
  // What checkpoints are written and pruned through (not owned; must outlive
  // the server). Tests put a FileEnvWrapper here.
  FileEnv* file_env = FileEnv::Default();
  // Before serving, restore the models found here (see RestoreFrom).
  std::string restore_from;
  // Restored models take this partition instead of the saved one
  // (--restore_partition); a rollback keeps the live model's.
  std::optional<Partition> restore_partition;
  // Who may call what (--auth_token_file); by default every call is allowed.
  AccessControl access;
  // TLS (--tls_cert_file, --tls_key_file, PEM): empty serves plaintext. With
  // tls_client_ca_pem (--tls_client_ca_file) clients must present a
  // certificate that CA signed (mutual TLS).
  std::string tls_cert_pem;
  std::string tls_key_pem;
  std::string tls_client_ca_pem;
  // HOST:PORT of the HTTP /metrics and /healthz endpoint; empty: none.
  std::string metrics_listen;
  // When set, Checkpoint requests may only name directories inside it
  // (--checkpoint_request_root); else any directory the server may write.
  std::string checkpoint_request_root;
  // Trainers on this host may move payloads through shared memory
  // (SharedMemoryHost; --shared_memory).
  bool shared_memory = true;
  // Trainers that reach this server over plaintext may move payloads over a
  // TCP port of this host (PayloadSocketHost; --payload_socket), listening
  // on payload_socket_host (empty: every interface; ShardServer::Start sets
  // it to its listen address's host, so a server on loopback stays there).
  // Never with TLS: the bytes would travel unencrypted.
  bool payload_socket = true;
  std::string payload_socket_host = "127.0.0.1";
  uint16_t payload_socket_port = 0;  // 0: a free port (--payload_socket_port).
  // The kind of device pair trainers may open (OpenDevicePair): "nccl"
  // (GPU memory; a server on a GPU), "loopback" (host memory, the same
  // protocol for a server on the CPU), or "off".
  std::string device_pairs = "off";
};

class ShardServiceImpl final : public v1::ShardService::Service {
 public:
  explicit ShardServiceImpl(const ShardServerOptions& options);
  ~ShardServiceImpl() override;

  grpc::Status RegisterModel(grpc::ServerContext* context,
                             grpc::ServerReader<v1::RegisterModelRequest>* reader,
                             v1::RegisterModelResponse* response) override;
  grpc::Status PushGradients(grpc::ServerContext* context,
                             grpc::ServerReader<v1::PushGradientsRequest>* reader,
                             v1::PushGradientsResponse* response) override;
  grpc::Status PullParameters(grpc::ServerContext* context,
                              const v1::PullParametersRequest* request,
                              grpc::ServerWriter<v1::PullParametersResponse>* writer) override;
  grpc::Status GetStepStats(grpc::ServerContext* context, const v1::GetStepStatsRequest* request,
                            v1::StepStats* response) override;
  grpc::Status SetHyperparameters(grpc::ServerContext* context,
                                  const v1::SetHyperparametersRequest* request,
                                  v1::SetHyperparametersResponse* response) override;
  grpc::Status Inspect(grpc::ServerContext* context, const v1::InspectRequest* request,
                       v1::InspectResponse* response) override;
  grpc::Status GetServerInfo(grpc::ServerContext* context, const v1::GetServerInfoRequest* request,
                             v1::ServerInfo* response) override;
  grpc::Status OpenDevicePair(grpc::ServerContext* context,
                              const v1::OpenDevicePairRequest* request,
                              v1::OpenDevicePairResponse* response) override;
  grpc::Status Checkpoint(grpc::ServerContext* context, const v1::CheckpointRequest* request,
                          v1::CheckpointResponse* response) override;
  grpc::Status RollBack(grpc::ServerContext* context, const v1::RollBackRequest* request,
                        v1::RollBackResponse* response) override;

  // Before serving: loads the models of `path` on this shard (any shard
  // count may have written them). `path` is a checkpoint directory (loaded
  // if it verifies), a model's directory of periodic checkpoints, or a
  // directory of those (as --checkpoint_dir makes them): each model from its
  // newest committed checkpoint whose every part verifies, newer damaged ones
  // set aside and logged (common/checkpoint_catalog.h); none there is not an
  // error. DATA_LOSS naming the files when no committed checkpoint of a model
  // verifies: nothing is loaded.
  absl::Status RestoreFrom(const std::string& path);

  // Refuses new calls with UNAVAILABLE and wakes blocked pulls; calls in
  // flight (a push being received, an update) run on. Then WaitForIdle()
  // until they are done, before grpc::Server::Shutdown.
  void Shutdown();
  // True once no call is in flight; false if `deadline` came first.
  bool WaitForIdle(absl::Time deadline);
  bool shutting_down() const;

  // What every call's interceptor and the checkpoints count.
  ServerMetrics* metrics() { return &metrics_; }
  // Cancels streams idle past --stream_idle_timeout_s (also reflection's).
  StreamWatchdog* stream_watchdog() { return &watchdog_; }
  // The /metrics page: the counters and each model's gauges, read now.
  std::string RenderMetrics() const;

 private:
  // Counts one call in flight for WaitForIdle; UNAVAILABLE after Shutdown().
  class CallScope {
   public:
    explicit CallScope(ShardServiceImpl* service);
    ~CallScope();
    const absl::Status& admitted() const { return admitted_; }

   private:
    ShardServiceImpl* const service_;
    absl::Status admitted_;
  };
  absl::Status CheckShardIndex(uint32_t shard_index) const;
  // OK when the call's token may do `access` (see AccessControl).
  absl::Status Authorize(const grpc::ServerContext& context, Access access) const {
    return options_.access.Check(context, access);
  }
  // PushGradients without its accounting; `model_id` and `rank` are set
  // once the header names a registered model and a trainer rank of it.
  grpc::Status ReceivePush(grpc::ServerContext* context,
                           grpc::ServerReader<v1::PushGradientsRequest>* reader,
                           v1::PushGradientsResponse* response, std::string* model_id,
                           std::optional<uint32_t>* rank);
  // Where this server keeps a model's numbers: its GPU, or the CPU pool.
  ModelShard::BackendFactory BackendFactory();
  // PlanShard for this server's shard, with its pipelining.
  absl::StatusOr<ShardPlan> PlanHere(v1::ModelConfig config) const;
  // What registering `plan` reserves of the state budget (with a GPU's bf16
  // copy).
  uint64_t StateBytes(const ShardPlan& plan) const;
  // Periodic checkpoints of `model_id` (none without --checkpoint_dir).
  PeriodicCheckpointOptions CheckpointOptionsFor(const std::string& model_id) const;
  // A model made from a verified checkpoint: its plan for this shard, its
  // state budget, its ModelShard. Not installed.
  // `partition`, when given, replaces the saved one.
  absl::StatusOr<std::shared_ptr<HostedModel>> LoadModel(const CheckpointReader& checkpoint,
                                                         std::optional<Partition> partition);
  // Logs a damaged checkpoint that is set aside (restores and rollbacks).
  static void LogDamagedCheckpoint(const std::string& directory, const absl::Status& why);
  // `named`: the operator named this checkpoint (--restore_from=DIR/step-N).
  // The job goes back to it (GoBack) before the model is installed when it
  // was named, and whenever it comes from outside the model's periodic
  // checkpoint directory (an export, a copy of the root, another root):
  // the directory's steps from then on are another timeline's.
  absl::Status RestoreModel(const CheckpointReader& checkpoint, bool named);
  // With periodic checkpoints: sets aside, as a rollback does, the step
  // directories of `model` (not installed yet) after `step`, so that neither
  // this timeline's saves of those steps nor a later restart take them for
  // its own; refused when a restart command left naming the checkpoint
  // would give up this timeline's own steps (see CheckGoingBack). (Every
  // shard does it on its own: nothing writes those steps meanwhile.)
  absl::Status GoBack(HostedModel& model, int64_t step);
  // A model's directory of periodic checkpoints (the newest that verifies),
  // or a model directory that is one checkpoint.
  absl::Status RestoreNewestOf(const std::string& model_root);
  // With periodic checkpoints: refuses a new model (`version` -1) when the
  // model's checkpoint directory already holds committed checkpoints, and a
  // restored one when it holds a later one or one of another run.
  absl::Status CheckCheckpointRoot(const std::string& model_id, int64_t version,
                                   const std::string& run_id);
  // A registration that would create `model_id` for run `run_id` on a
  // server started to restore from its --checkpoint_dir, whose directory of
  // the model now holds a committed checkpoint of that run (committed by the
  // other shards after this one came back empty, before the model's first
  // checkpoint was whole): restores the newest, as the start would have, and
  // returns true. False when there is none of that run (CheckCheckpointRoot's
  // refusal of the registration stands). Asked once that refused it.
  absl::StatusOr<bool> RestoreCommittedOfRun(const std::string& model_id,
                                             const std::string& run_id);
  // With periodic checkpoints: FAILED_PRECONDITION for a Checkpoint RPC's
  // `directory` of `model_id` at `step` that a restart from --checkpoint_dir
  // would take for periodic checkpoints (RestoreFrom's walk of the root):
  // the root, anything in a model's directory but that model's own
  // step directory of this very step, a step or part name at the top, and
  // step directories in any other directory of the root.
  absl::Status CheckRequestedCheckpointPlace(const std::string& directory,
                                             const std::string& model_id, int64_t step) const;
  // The Checkpoint RPC into the model's periodic checkpoints
  // (CheckpointRequest.periodic, or its step directory named).
  grpc::Status SavePeriodicCheckpoint(const grpc::ServerContext& context, HostedModel& model,
                                      int64_t step, int64_t max_wait_ms,
                                      v1::CheckpointResponse* response);
  // A Checkpoint RPC's answer for `written` (counted and logged when files
  // were written; `kind` "" or "periodic ").
  grpc::Status AnswerCheckpoint(const grpc::ServerContext& context, const std::string& model_id,
                                int64_t step, absl::Duration write_time,
                                const absl::StatusOr<CheckpointPartWritten>& written,
                                const char* kind, v1::CheckpointResponse* response);

  // `bytes` bytes at the place `where` names in an attached segment, with
  // the segment held: FAILED_PRECONDITION without shared memory or when the
  // attachment is not open, INVALID_ARGUMENT when the bytes overrun it.
  // The trainer's fence word (SharedMemoryPayload.fence_ticket), when it
  // named one: every touch of `data` goes through Touch.
  struct SharedPlace {
    std::shared_ptr<const SharedSegment> segment;
    char* data = nullptr;
    PullPlace place;  // The same bytes through any attachment of the segment.
    std::optional<SegmentFence> fence;
    uint64_t ticket = 0;
    // Runs `touch` (one piece of reading or writing `data`), under the fence
    // when there is one.
    absl::Status Touch(const std::function<absl::Status()>& touch) {
      return fence ? fence->Access(ticket, touch) : touch();
    }
    // False once the trainer closed the fence to this call.
    bool Open() const { return !fence || fence->Open(ticket); }
  };
  absl::StatusOr<SharedPlace> LocateShared(const v1::SharedMemoryPayload& where, uint64_t bytes,
                                           const char* what) const;
  // The push's payload from an attached segment (PushHeader.shared_memory)
  // into `writer`: the stream must end after the header (checked before
  // anything is staged); stops when the call is cancelled.
  absl::Status ReceiveSharedPayload(const v1::PushHeader& header, DType dtype,
                                    grpc::ServerContext* context,
                                    grpc::ServerReader<v1::PushGradientsRequest>* reader,
                                    StreamWatchdog::Watch& watch, ModelShard::PushWriter& writer);
  // This server's payload sockets; FAILED_PRECONDITION when it has none.
  absl::StatusOr<PayloadSocketHost*> PayloadSockets() const;
  // The link a call names (FAILED_PRECONDITION without payload sockets, or
  // when it is not open or busy), for the call's transfer.
  absl::StatusOr<PayloadSocketHost::Lease> AcquireLink(const v1::SocketPayload& where) const;
  // The push's payload from its link (PushHeader.socket_payload) into
  // `writer`: the stream must end after the header; the lease is finished
  // once every byte was read and staged.
  absl::Status ReceiveSocketPayload(const v1::PushHeader& header, DType dtype,
                                    grpc::ServerContext* context,
                                    grpc::ServerReader<v1::PushGradientsRequest>* reader,
                                    StreamWatchdog::Watch& watch, ModelShard::PushWriter& writer,
                                    PayloadSocketHost::Lease& lease);
  // The rest of a pull of `version` over its link: the first message, the
  // frames, the last message (see PullParametersRequest.socket_payload).
  grpc::Status SendSocketPull(grpc::ServerContext* context,
                              const v1::PullParametersRequest& request, ModelShard& shard,
                              int64_t version, DType dtype, absl::Time deadline, ReadPin& pin,
                              grpc::ServerWriter<v1::PullParametersResponse>* writer);

  // This server's device pairs; FAILED_PRECONDITION when it opens none.
  absl::StatusOr<DevicePairHost*> DevicePairs() const;
  // A push over a device pair (PushHeader.device_pair): its checks (fp32,
  // the model in the pair's memory, the stream ending after the header)
  // and its pair, before the push begins.
  absl::StatusOr<DevicePairHost::Lease> AcquireDevicePairForPush(
      const v1::PushHeader& header, DType dtype, grpc::ServerContext* context,
      grpc::ServerReader<v1::PushGradientsRequest>* reader, const ModelShard& shard);
  // Marks `lease` abandoned (DevicePairHost::Lease::Abandoned) when
  // `context`'s call was cancelled (by the trainer, its connection, or its
  // deadline): the trainer drops its end then (DevicePairTransport). Run as
  // the call ends, whatever it answers.
  static void AbandonPairOfCancelledCall(grpc::ServerContext& context,
                                         DevicePairHost::Lease& lease);
  // Its payload over the pair into `writer`, in the backend's memory where
  // the step allows (see DevicePairPayload).
  absl::Status ReceiveDevicePairPayload(const v1::PushHeader& header, grpc::ServerContext* context,
                                        grpc::ServerReader<v1::PushGradientsRequest>* reader,
                                        StreamWatchdog::Watch& watch,
                                        ModelShard::PushWriter& writer,
                                        DevicePairHost::Lease& lease);
  // Checks a pull over a device pair can be served, before its wait
  // (`other_place`: it names another place for its payload too).
  absl::Status CheckDevicePairPull(const v1::PullParametersRequest& request, DType dtype,
                                   const ModelShard& shard, bool other_place) const;
  // The rest of a pull of `version` over its device pair: the first message
  // once every range is in, the bytes, the last message.
  grpc::Status SendDevicePairPull(grpc::ServerContext* context,
                                  const v1::PullParametersRequest& request, ModelShard& shard,
                                  int64_t version, absl::Time deadline, ReadPin& pin,
                                  grpc::ServerWriter<v1::PullParametersResponse>* writer);

  const ShardServerOptions options_;
  const absl::Time start_time_;
  std::unique_ptr<SharedMemoryHost> shared_memory_;  // Null without shared memory.
  // Which pull through shared memory writes each place (newest wins).
  PullPlaceClaims pull_claims_;
  std::unique_ptr<PayloadSocketHost> payload_sockets_;  // Null without payload sockets.
  std::unique_ptr<DevicePairHost> device_pairs_;        // Null without device pairs.
  mutable ServerMetrics metrics_;  // Thread-safe; counted from const paths too.
  ThreadPool pool_;
  StreamWatchdog watchdog_;
  StateBudget budget_;
  ModelRegistry models_;
  absl::Mutex rollback_mu_;  // One rollback at a time.
  mutable absl::Mutex mu_;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  int calls_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // Held by RestoreCommittedOfRun while it restores (see there).
  absl::Mutex registration_restore_mu_;
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_SHARD_SERVICE_H_
