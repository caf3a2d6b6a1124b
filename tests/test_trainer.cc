// test_trainer: one trainer process of the end-to-end tests.
//
// Trains one synthetic model per name in --models against the shard servers
// in --servers, as rank --rank of --num_trainers, for --steps steps, and
// writes each model's final flat parameters to <out_dir>/<model>.bin.
// Exits non-zero with the client's error on any failure.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/push_history.h"
#include "client/security_flags.h"
#include "client/trainer_client.h"
#include "common/device_pair.h"
#include "tests/support/raw_calls.h"
#include "tests/support/synthetic.h"

ABSL_FLAG(std::string, servers, "", "Comma-separated shard addresses, in shard order.");
ABSL_FLAG(uint32_t, rank, 0, "This trainer's rank.");
ABSL_FLAG(uint32_t, num_trainers, 1, "Number of trainers.");
ABSL_FLAG(std::string, models, "adamw", "Comma-separated optimizer names, one model each.");
ABSL_FLAG(int, steps, 20, "Steps to train.");
ABSL_FLAG(uint64_t, seed, 1, "Data seed.");
ABSL_FLAG(std::string, out_dir, "", "Where to write <model>.bin.");
ABSL_FLAG(uint64_t, chunk_bytes, 1000, "Bytes per streamed chunk (small: many chunks).");
ABSL_FLAG(std::string, push_dtype, "float32",
          "Gradient type on the wire: float32|bfloat16|float16.");
ABSL_FLAG(std::string, pull_dtype, "float32",
          "Parameter type on the wire: float32|bfloat16|float16.");
ABSL_FLAG(double, max_grad_norm, 0, "Clip the global gradient norm to this (0: off).");
ABSL_FLAG(bool, loss_scaling, false, "Dynamic loss scaling.");
ABSL_FLAG(double, initial_loss_scale, 65536, "With --loss_scaling.");
ABSL_FLAG(int64_t, loss_scale_growth_interval, 1000, "With --loss_scaling.");
ABSL_FLAG(int, replay_steps, 0,
          "Keep this many pushed steps to re-push to a shard restarted from a checkpoint.");
ABSL_FLAG(absl::Duration, retry_budget, absl::Seconds(60),
          "How long the client retries a shard that is down.");
ABSL_FLAG(absl::Duration, rpc_timeout, absl::Seconds(30), "Deadline of each call attempt.");
ABSL_FLAG(absl::Duration, min_step_time, absl::ZeroDuration(),
          "Pace the job: each step takes at least this long (the rest is slept).");
ABSL_FLAG(std::string, lr_change, "",
          "STEP:LR: every trainer schedules the optimizer with this lr from STEP on (sent "
          "just before pushing STEP).");
ABSL_FLAG(std::string, journal_dir, "",
          "Keep a push journal per (rank, model) here (TrainerClientOptions::journal_path).");
ABSL_FLAG(int64_t, die_mid_push_at_step, 0,
          "Fault injection: at this step, journal the gradient, push it to shard 0 only, and "
          "exit with status 3 (a trainer that dies in the middle of a push).");
ABSL_FLAG(int64_t, fork_child_at_step, 0,
          "At this step, fork a child that sleeps for 5 minutes (a DataLoader worker that "
          "outlives the trainer) and write its pid to <out_dir>/forked_child.pid.");
ABSL_FLAG(bool, shared_memory, true,
          "Move payloads through shared memory with shards that take it (else gRPC).");
ABSL_FLAG(bool, socket_payloads, true,
          "Move payloads over payload sockets with shards that take them and that shared "
          "memory does not reach (else gRPC).");
ABSL_FLAG(std::string, device_pairs, "off",
          "Move fp32 payloads over device pairs of this kind (nccl, loopback) with shards "
          "that open them (TrainerClientOptions::device_pairs).");
ABSL_FLAG(bool, device_buffers, false,
          "A GPU trainer's buffers (with --device_pairs): each step's gradient is copied into "
          "memory of the pairs' kind (a GPU's for nccl), the parameters there are poisoned with "
          "NaN, and StepOnDevice must write every one of them.");
ABSL_FLAG(bool, shared_buffers, false,
          "Compute gradients in and pull parameters into the client's shared buffers (no "
          "copies on the trainer's side).");
ABSL_FLAG(std::vector<std::string>, plant_inf_steps, {},
          "Rank 0 puts +inf into its gradient at these steps (in the last tensor, so on the "
          "last shard only).");

ABSL_FLAG(std::string, consistency, "sync", "sync, async or bounded (ModelConfig.consistency).");
ABSL_FLAG(int64_t, staleness, 0, "With --consistency=bounded: the bound.");
ABSL_FLAG(bool, dyadic, false,
          "Exact numbers (tests/support/synthetic.h DyadicInitialParams, DyadicGradient): "
          "gradients that do not depend on the parameters.");
ABSL_FLAG(double, lr, 0, "> 0: the optimizer's lr instead of the named config's.");
ABSL_FLAG(bool, finish, false,
          "End with TrainerClient::Finish (the last step saved as a periodic checkpoint).");
ABSL_FLAG(std::string, finish_after_file, "",
          "With --finish: wait (up to 120 s) for this file to exist before calling Finish.");
ABSL_FLAG(std::string, partition, "",
          "flat or whole_tensors instead of the named config's (SyntheticModelSpec).");

namespace shardopt::testing {
namespace {

// Where rank 0 plants +inf: inside the last tensor, so on the last shard.
uint64_t PlantedElement(const ModelLayout& layout) { return layout.tensors().back().offset; }
// +inf at odd steps, NaN at even ones.
float PlantedValue(int64_t step) {
  return step % 2 == 1 ? std::numeric_limits<float>::infinity()
                       : std::numeric_limits<float>::quiet_NaN();
}

absl::StatusOr<DType> ParseDType(const std::string& name) {
  for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    if (name == DTypeName(d)) return d;
  }
  return absl::InvalidArgumentError("unknown dtype " + name);
}

// TrainerClient::StepOnDevice from buffers in the pairs' memory: the
// gradient copied there, the parameters there poisoned with NaN first (a
// part the step did not write shows), and copied back for the next step's
// synthetic gradient.
// (Freed by the model's loop, before the process and its CUDA runtime end.)
struct DeviceBuffers {
  std::shared_ptr<void> grads, params;
  size_t bytes = 0;
};

absl::StatusOr<StepResult> StepOnDevice(TrainerClient& client, const TrainerClientOptions& options,
                                        int64_t step, absl::Span<const float> grads,
                                        absl::Span<float> params, DeviceBuffers& buffers) {
  absl::StatusOr<const DevicePairKind*> kind = FindDevicePairKind(options.device_pairs);
  if (!kind.ok()) return kind.status();
  const size_t bytes = grads.size() * sizeof(float);
  const int gpu = options.device_pair_gpu;
  std::shared_ptr<void>& device_grads = buffers.grads;
  std::shared_ptr<void>& device_params = buffers.params;
  if (buffers.bytes != bytes) {
    absl::StatusOr<std::shared_ptr<void>> g = (*kind)->Allocate(gpu, bytes);
    absl::StatusOr<std::shared_ptr<void>> p = (*kind)->Allocate(gpu, bytes);
    if (!g.ok()) return g.status();
    if (!p.ok()) return p.status();
    device_grads = *g;
    device_params = *p;
    buffers.bytes = bytes;
  }
  const std::vector<float> poison(grads.size(), std::numeric_limits<float>::quiet_NaN());
  if (absl::Status s = (*kind)->CopyFromHost(gpu, device_grads.get(), grads.data(), bytes);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = (*kind)->CopyFromHost(gpu, device_params.get(), poison.data(), bytes);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<StepResult> result =
      client.StepOnDevice(step, static_cast<const float*>(device_grads.get()),
                          static_cast<float*>(device_params.get()));
  if (!result.ok()) return result;
  if (absl::Status s = (*kind)->CopyToHost(gpu, params.data(), device_params.get(), bytes);
      !s.ok()) {
    return s;
  }
  return result;
}

int Train(const std::string& name) {
  absl::StatusOr<OptimizerConfig> optimizer = OptimizerByName(name);
  if (!optimizer.ok()) {
    fprintf(stderr, "%s\n", optimizer.status().ToString().c_str());
    return 2;
  }
  const std::vector<std::string> servers = absl::StrSplit(absl::GetFlag(FLAGS_servers), ',');
  TrainerClientOptions options;
  options.trainer_rank = absl::GetFlag(FLAGS_rank);
  options.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  options.rpc_timeout = absl::GetFlag(FLAGS_rpc_timeout);
  options.security = ChannelSecurityFromFlags();
  options.replay_steps = absl::GetFlag(FLAGS_replay_steps);
  options.retry_budget = absl::GetFlag(FLAGS_retry_budget);
  options.attach_timeout = absl::GetFlag(FLAGS_retry_budget);
  if (!absl::GetFlag(FLAGS_journal_dir).empty()) {
    options.journal_path = absl::StrCat(absl::GetFlag(FLAGS_journal_dir), "/rank",
                                        options.trainer_rank, ".", name, ".journal");
  }
  options.push_dtype = ParseDType(absl::GetFlag(FLAGS_push_dtype)).value();
  options.pull_dtype = ParseDType(absl::GetFlag(FLAGS_pull_dtype)).value();
  options.shared_memory = absl::GetFlag(FLAGS_shared_memory);
  options.socket_payloads = absl::GetFlag(FLAGS_socket_payloads);
  options.device_pairs = absl::GetFlag(FLAGS_device_pairs);
  options.device_pair_gpu = 0;
  absl::StatusOr<std::unique_ptr<TrainerClient>> client = TrainerClient::Connect(servers, options);
  if (!client.ok()) {
    fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  if (absl::GetFlag(FLAGS_lr) > 0) optimizer->lr = absl::GetFlag(FLAGS_lr);
  ModelSpec spec = SyntheticModelSpec(name, *optimizer, absl::GetFlag(FLAGS_num_trainers));
  absl::StatusOr<Consistency> consistency = ConsistencyFromName(absl::GetFlag(FLAGS_consistency));
  if (!consistency.ok()) {
    fprintf(stderr, "%s\n", consistency.status().ToString().c_str());
    return 2;
  }
  spec.consistency = *consistency;
  spec.staleness = absl::GetFlag(FLAGS_staleness);
  if (const std::string p = absl::GetFlag(FLAGS_partition); !p.empty()) {
    absl::StatusOr<Partition> partition = PartitionFromName(p);
    if (!partition.ok()) {
      fprintf(stderr, "%s\n", partition.status().ToString().c_str());
      return 2;
    }
    spec.partition = *partition;
  }
  const bool dyadic = absl::GetFlag(FLAGS_dyadic);
  // Asynchronous: each push's observed staleness, by step (what the bounded
  // tests assert on).
  std::vector<float> staleness_by_step;
  spec.max_grad_norm = absl::GetFlag(FLAGS_max_grad_norm);
  spec.loss_scaling = absl::GetFlag(FLAGS_loss_scaling);
  spec.loss_scaler.initial_scale = absl::GetFlag(FLAGS_initial_loss_scale);
  spec.loss_scaler.growth_interval = absl::GetFlag(FLAGS_loss_scale_growth_interval);
  std::set<int64_t> plant;
  for (const std::string& s : absl::GetFlag(FLAGS_plant_inf_steps)) plant.insert(std::stoll(s));
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  absl::Status status;
  std::vector<float> params;
  if (options.trainer_rank == 0) {
    const ModelLayout layout = (*client)->LayoutFor(spec).value();
    params = dyadic ? DyadicInitialParams(layout, seed) : SyntheticInitialParams(layout, seed);
    status = (*client)->Register(spec, params);
  } else {
    status = (*client)->Attach(spec);
  }
  // Every rank, rank 0 included, starts from the model's version (0, or
  // where a restored or running job is) as the wire delivers it (rounded
  // when pull_dtype is 16-bit).
  int64_t start = 0;
  std::vector<float> grad;
  absl::Span<float> params_view;
  absl::Span<float> grad_view;
  if (status.ok()) {
    params = (*client)->NewFlatBuffer();
    grad = (*client)->NewFlatBuffer();
    params_view = absl::MakeSpan(params);
    grad_view = absl::MakeSpan(grad);
    if (absl::GetFlag(FLAGS_shared_buffers)) {
      if ((*client)->shared_gradients().empty()) {
        fprintf(stderr, "rank %u: --shared_buffers without shared memory\n", options.trainer_rank);
        return 1;
      }
      params_view = (*client)->shared_parameters();
      grad_view = (*client)->shared_gradients();
    }
    absl::StatusOr<int64_t> version = (*client)->PullToResume(params_view);
    status = version.status();
    if (version.ok()) start = *version;
  }
  if (!status.ok()) {
    fprintf(stderr, "rank %u: %s\n", options.trainer_rank, status.ToString().c_str());
    return 1;
  }
  if (start > 0) {
    fprintf(stderr, "rank %u: model '%s' resumes at version %ld\n", options.trainer_rank,
            name.c_str(), static_cast<long>(start));
  }
  int rollbacks = 0;
  DeviceBuffers device_buffers;  // With --device_buffers.
  // After a call that failed because the job rolled back to a checkpoint:
  // pulls its parameters; the version to go on from (nullopt when the pull
  // failed, said on stderr).
  const auto resume_after_rollback = [&](const absl::Status& why) -> std::optional<int64_t> {
    fprintf(stderr, "rank %u: %s\n", options.trainer_rank, why.ToString().c_str());
    absl::StatusOr<int64_t> pulled = (*client)->PullToResume(params_view);
    if (!pulled.ok()) {
      fprintf(stderr, "rank %u: after the rollback: %s\n", options.trainer_rank,
              pulled.status().ToString().c_str());
      return std::nullopt;
    }
    ++rollbacks;
    return *pulled;
  };
  // (Again from where a rollback during Finish left the job.)
  for (bool ended = false; !ended;) {
    ended = true;
    for (int64_t step = start + 1; step <= absl::GetFlag(FLAGS_steps); ++step) {
      const absl::Time step_start = absl::Now();
      absl::Cleanup pace = [step_start] {
        absl::SleepFor(absl::GetFlag(FLAGS_min_step_time) - (absl::Now() - step_start));
      };
      if (dyadic) {
        DyadicGradient((*client)->layout(), options.trainer_rank, step, seed, grad_view);
      } else {
        SyntheticGradient((*client)->layout(), params_view, options.trainer_rank, step, seed,
                          grad_view);
      }
      if (spec.loss_scaling) {
        const float scale = static_cast<float>((*client)->loss_scale());
        for (float& v : grad_view) v *= scale;
      }
      if (options.trainer_rank == 0 && plant.count(step) > 0) {
        grad_view[PlantedElement((*client)->layout())] = PlantedValue(step);
      }
      if (const std::string change = absl::GetFlag(FLAGS_lr_change); !change.empty()) {
        const std::vector<std::string> parts = absl::StrSplit(change, ':');
        if (std::stoll(parts[0]) == step) {
          OptimizerConfig next = *optimizer;
          next.lr = std::stod(parts[1]);
          if (absl::Status s = (*client)->SetHyperparameters(step, next, LrSchedule()); !s.ok()) {
            fprintf(stderr, "rank %u: %s\n", options.trainer_rank, s.ToString().c_str());
            return 1;
          }
        }
      }
      if (step == absl::GetFlag(FLAGS_fork_child_at_step)) {
        const pid_t child = fork();
        if (child == 0) {
          sleep(300);
          _exit(0);
        }
        std::ofstream(absl::GetFlag(FLAGS_out_dir) + "/forked_child.pid") << child << "\n";
      }
      if (step == absl::GetFlag(FLAGS_die_mid_push_at_step)) {
        // What TrainerClient::Push does up to its first shard, then death.
        absl::StatusOr<std::unique_ptr<PushHistory>> journal =
            PushHistory::Open({name, options.trainer_rank, 0, options.journal_path});
        if (!journal.ok() || !(*journal)
                                  ->Record(step, DType::kFloat32, 1.0, grad_view.data(),
                                           grad_view.size() * sizeof(float))
                                  .ok()) {
          return 1;
        }
        const FlatRange range = (*client)->layout().ShardRange(0);
        v1::PushHeader header;
        header.set_model_id(name);
        header.set_trainer_rank(options.trainer_rank);
        header.set_step(step);
        header.set_num_elements(range.size());
        auto stub = NewStub(servers[0]);
        const grpc::Status pushed = RawPush(
            *stub, &header, {{0, FloatBytes(grad_view.data() + range.begin, range.size())}});
        fprintf(stderr, "rank %u: pushed step %ld to shard 0 only (%s); dying\n",
                options.trainer_rank, static_cast<long>(step), pushed.error_message().c_str());
        _exit(3);
      }
      absl::StatusOr<StepResult> result;
      if (absl::GetFlag(FLAGS_device_buffers)) {
        result = StepOnDevice(**client, options, step, grad_view, params_view, device_buffers);
      } else {
        result = (*client)->Step(step, grad_view, params_view);
      }
      if (!result.ok() && (*client)->rolled_back_to()) {
        // The job went back to a checkpoint: continue from its version.
        std::ofstream(absl::GetFlag(FLAGS_out_dir) + "/" + name + ".rollback_reason")
            << result.status().message();
        std::optional<int64_t> back = resume_after_rollback(result.status());
        if (!back) return 1;
        step = *back;  // The loop goes on with step back + 1.
        continue;
      }
      if (!result.ok()) {
        fprintf(stderr, "rank %u step %ld: %s\n", options.trainer_rank, static_cast<long>(step),
                result.status().ToString().c_str());
        return 1;
      }
      // (Synchronous: rank 0's overflow skips the step for everyone;
      // asynchronous: only rank 0 skips its own.)
      const bool planted =
          plant.count(step) > 0 && (!IsAsynchronous(spec.consistency) || options.trainer_rank == 0);
      if (spec.loss_scaling && result->skipped != planted) {
        fprintf(stderr, "rank %u step %ld: skipped=%d, planted=%d\n", options.trainer_rank,
                static_cast<long>(step), result->skipped, static_cast<int>(planted));
        return 1;
      }
      if (IsAsynchronous(spec.consistency)) {
        staleness_by_step.resize(step + 1, -1);
        staleness_by_step[step] = static_cast<float>(result->staleness);
        continue;
      }
      if (result->version != step) {
        fprintf(stderr, "rank %u pulled version %ld after step %ld\n", options.trainer_rank,
                static_cast<long>(result->version), static_cast<long>(step));
        return 1;
      }
    }
    if (absl::GetFlag(FLAGS_finish)) {
      const std::string go = absl::GetFlag(FLAGS_finish_after_file);
      for (int i = 0; !go.empty() && access(go.c_str(), F_OK) != 0; ++i) {
        if (i == 12000) {
          fprintf(stderr, "rank %u: %s did not appear in 120 s\n", options.trainer_rank,
                  go.c_str());
          return 1;
        }
        absl::SleepFor(absl::Milliseconds(10));
      }
      absl::Status finished = (*client)->Finish(absl::GetFlag(FLAGS_steps));
      if (!finished.ok() && (*client)->rolled_back_to()) {
        std::optional<int64_t> back = resume_after_rollback(finished);
        if (!back) return 1;
        start = *back;
        ended = false;
        continue;
      }
      if (!finished.ok()) {
        fprintf(stderr, "rank %u: Finish: %s\n", options.trainer_rank, finished.ToString().c_str());
        return 1;
      }
      printf("rank %u model %s finished at step %d\n", options.trainer_rank, name.c_str(),
             absl::GetFlag(FLAGS_steps));
      fflush(stdout);
    }
  }
  if (IsAsynchronous(spec.consistency)) {
    // Nothing of this trainer may be missing anywhere once it is gone.
    if (absl::Status s = (*client)->WaitForEveryTrainer(absl::GetFlag(FLAGS_steps)); !s.ok()) {
      fprintf(stderr, "rank %u: %s\n", options.trainer_rank, s.ToString().c_str());
      return 1;
    }
    // The parameters every trainer ends with: all pushes applied.
    if (absl::Status s = (*client)->Pull(0, params_view).status(); !s.ok()) {
      fprintf(stderr, "rank %u: final pull: %s\n", options.trainer_rank, s.ToString().c_str());
      return 1;
    }
    if (absl::Status s = WriteFloats(absl::GetFlag(FLAGS_out_dir) + "/" + name + ".staleness",
                                     staleness_by_step);
        !s.ok()) {
      fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
  }
  printf("rank %u model %s replayed_pushes=%ld failed_attempts=%ld rollbacks=%d\n",
         options.trainer_rank, name.c_str(), static_cast<long>((*client)->replayed_pushes()),
         static_cast<long>((*client)->failed_attempts()), rollbacks);
  fflush(stdout);
  for (const auto& [what, count] :
       {std::pair<std::string, float>{"replayed", (*client)->replayed_pushes()},
        {"rollbacks", rollbacks},
        {"shm_transfers", static_cast<float>((*client)->shared_memory_transfers())},
        {"socket_transfers", static_cast<float>((*client)->socket_transfers())},
        {"pair_transfers", static_cast<float>((*client)->device_pair_transfers())},
        {"device_buffer_transfers", static_cast<float>((*client)->device_buffer_transfers())}}) {
    if (absl::Status s =
            WriteFloats(absl::GetFlag(FLAGS_out_dir) + "/" + name + "." + what, {count});
        !s.ok()) {
      fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
  }
  std::vector<float> failed_by_shard;
  for (size_t i = 0; i < servers.size(); ++i) {
    failed_by_shard.push_back(static_cast<float>((*client)->failed_attempts(i)));
  }
  if (absl::Status s = WriteFloats(absl::GetFlag(FLAGS_out_dir) + "/" + name + ".failed_attempts",
                                   failed_by_shard);
      !s.ok()) {
    fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  const std::string out = absl::GetFlag(FLAGS_out_dir) + "/" + name + ".bin";
  if (absl::Status s = WriteFloats(out, std::vector<float>(params_view.begin(), params_view.end()));
      !s.ok()) {
    fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  // The servers' fp32 master weights too (what a 16-bit pull rounds): a
  // second client of the same rank that pulls fp32.
  TrainerClientOptions fp32_options = options;
  fp32_options.pull_dtype = DType::kFloat32;
  auto masters_client = TrainerClient::Connect(servers, fp32_options);
  std::vector<float> masters;
  absl::Status s = masters_client.ok() ? (*masters_client)->Attach(spec) : masters_client.status();
  if (s.ok()) {
    masters = (*masters_client)->NewFlatBuffer();
    s = (*masters_client)->Pull(absl::GetFlag(FLAGS_steps), absl::MakeSpan(masters)).status();
  }
  if (s.ok()) s = WriteFloats(absl::GetFlag(FLAGS_out_dir) + "/" + name + ".master.bin", masters);
  if (!s.ok()) {
    fprintf(stderr, "masters: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace shardopt::testing

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::vector<std::string> names = absl::StrSplit(absl::GetFlag(FLAGS_models), ',');
  for (const std::string& name : names) {
    if (int rc = shardopt::testing::Train(name); rc != 0) return rc;
  }
  return 0;
}
