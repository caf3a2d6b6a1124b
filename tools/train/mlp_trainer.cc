// mlp_trainer: one data-parallel trainer process of the shardopt demo job.
//
//   mlp_trainer --servers=127.0.0.1:40001,127.0.0.1:40002 --rank=0 --num_trainers=2
//
// Trains an MLP classifier (mlp.h) on the spirals problem (spirals.h)
// against the shard servers in --servers, as rank --rank of --num_trainers.
// Every rank generates the same dataset and batch schedule from --seed. At
// step k each rank computes the gradient of the mean loss over its own
// contiguous share of global batch k and hands it to TrainerClient::Step,
// which pushes it (the servers average the trainers' gradients and apply
// the optimizer) and pulls the parameters of version k. With equal shares
// the averaged gradient is the full-batch gradient, so the job trains
// exactly as one process with the whole batch would.
//
// Rank 0 registers the model with its initial parameters, prints progress
// and full-dataset evaluations, and at the end exits 3 unless the final
// full-dataset loss is below --max_loss_ratio times the initial one. Other
// ranks attach to the model and stay quiet. Any error exits 1 (2 for bad
// flags) with the cause on stderr.
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/gradient_accumulator.h"
#include "client/security_flags.h"
#include "client/trainer_client.h"
#include "tools/train/batches.h"
#include "tools/train/mlp.h"
#include "tools/train/mlp_init.h"
#include "tools/train/mlp_loss.h"
#include "tools/train/optimizer_choice.h"
#include "tools/train/progress.h"
#include "tools/train/spirals.h"
#include "tools/train/tensor_views.h"

ABSL_FLAG(std::string, servers, "", "Comma-separated shard server addresses, in shard order.");
ABSL_FLAG(uint32_t, rank, 0, "This trainer's rank, in [0, num_trainers).");
ABSL_FLAG(uint32_t, num_trainers, 1, "Number of trainer processes in the job.");
ABSL_FLAG(int, steps, 300, "Optimizer steps to train.");
ABSL_FLAG(int, batch, 256,
          "Global batch size (all trainers together); a multiple of --num_trainers.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the dataset, the batch order and the initial parameters.");
ABSL_FLAG(std::string, optimizer, "adamw", "adamw, adam, sgd (momentum 0.9), adagrad or lion.");
ABSL_FLAG(double, lr, 0,
          "Learning rate; 0 picks the optimizer's default (adamw/adam 1e-2, "
          "sgd 0.1, adagrad 0.05, lion 3e-3).");
ABSL_FLAG(std::string, model_id, "spirals_mlp", "Model id on the servers.");
ABSL_FLAG(int, micro_batches, 1,
          "Split this trainer's share of each batch into this many micro-batches and "
          "accumulate their gradients (client/gradient_accumulator.h); one push per step.");
ABSL_FLAG(std::string, hidden, "64,64", "Hidden layer widths.");
ABSL_FLAG(std::string, activation, "relu", "Hidden activation: relu or tanh.");
ABSL_FLAG(int, log_every, 25, "Rank 0 prints a progress line every this many steps.");
ABSL_FLAG(int, eval_every, 25,
          "Rank 0 evaluates on the full dataset (and prints) every this many steps.");
ABSL_FLAG(double, max_loss_ratio, 0.5,
          "Rank 0 fails unless final loss < max_loss_ratio * initial loss.");
ABSL_FLAG(int, rpc_timeout_s, 30,
          "Deadline of one RPC attempt, and, unless --retry_budget_s, the retry budget of a "
          "call (so a dead peer or server surfaces as an error within about twice this) and of "
          "attaching to the model.");
ABSL_FLAG(int, retry_budget_s, 0,
          "How long a call keeps retrying without progress (a shard or a peer trainer away, "
          "the model not registered yet) before the trainer gives up; 0: --rpc_timeout_s. A "
          "supervisor that replaces a dead "
          "peer only after a delay (a Kubernetes Job's pod backoff, up to 6 min) needs more.");
ABSL_FLAG(std::string, journal_dir, "",
          "Keep this trainer's pushes in DIR/rank<R> (TrainerClientOptions::journal_path), so "
          "that it can be restarted into the running job and shards restarted from older "
          "checkpoints can be given the steps they lost.");
ABSL_FLAG(int, min_step_ms, 0,
          "Pace the job: each step takes at least this long (the rest is slept); the launcher's "
          "--chaos uses it so that its kills land in the middle of the run.");
ABSL_FLAG(int, replay_steps, 0,
          "Keep this many pushed steps in memory for shards restarted from a checkpoint "
          "(without --journal_dir).");

namespace shardopt::train {
namespace {

constexpr int kExitError = 1;
constexpr int kExitBadFlags = 2;
constexpr int kExitNotConverged = 3;

struct JobConfig {
  std::vector<std::string> servers;
  uint32_t rank = 0;
  uint32_t num_trainers = 1;
  int steps = 0;
  int batch = 0;
  uint64_t seed = 0;
  MlpConfig mlp;
  ModelSpec spec;
};

absl::StatusOr<JobConfig> ConfigFromFlags(const Dataset& data) {
  JobConfig job;
  job.servers = absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipEmpty());
  job.rank = absl::GetFlag(FLAGS_rank);
  job.num_trainers = absl::GetFlag(FLAGS_num_trainers);
  job.steps = absl::GetFlag(FLAGS_steps);
  job.batch = absl::GetFlag(FLAGS_batch);
  job.seed = absl::GetFlag(FLAGS_seed);
  if (job.servers.empty()) return absl::InvalidArgumentError("--servers is empty");
  if (job.num_trainers == 0 || job.rank >= job.num_trainers) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rank=", job.rank, " is not below --num_trainers=", job.num_trainers));
  }
  if (job.steps < 1) return absl::InvalidArgumentError("--steps must be at least 1");
  // Unequal shares would make the servers' mean of per-trainer means differ
  // from the full-batch mean, silently reweighting examples.
  if (job.batch < static_cast<int>(job.num_trainers) || job.batch % job.num_trainers != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--batch=", job.batch,
                     " must be a positive multiple of --num_trainers=", job.num_trainers));
  }
  if (absl::GetFlag(FLAGS_retry_budget_s) < 0) {
    return absl::InvalidArgumentError("--retry_budget_s must not be negative");
  }
  if (absl::GetFlag(FLAGS_log_every) < 1 || absl::GetFlag(FLAGS_eval_every) < 1) {
    return absl::InvalidArgumentError("--log_every and --eval_every must be at least 1");
  }

  job.mlp.input_dim = data.num_features;
  job.mlp.num_classes = data.num_classes;
  for (absl::string_view width :
       absl::StrSplit(absl::GetFlag(FLAGS_hidden), ',', absl::SkipEmpty())) {
    int w = 0;
    if (!absl::SimpleAtoi(width, &w)) {
      return absl::InvalidArgumentError(absl::StrCat("--hidden: '", width, "' is not a number"));
    }
    job.mlp.hidden.push_back(w);
  }
  const std::string activation = absl::GetFlag(FLAGS_activation);
  if (activation == "relu") {
    job.mlp.activation = Activation::kRelu;
  } else if (activation == "tanh") {
    job.mlp.activation = Activation::kTanh;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--activation='", activation, "': use relu or tanh"));
  }
  if (absl::Status s = job.mlp.Validate(); !s.ok()) return s;

  absl::StatusOr<OptimizerConfig> optimizer =
      ChooseOptimizer(absl::GetFlag(FLAGS_optimizer), absl::GetFlag(FLAGS_lr));
  if (!optimizer.ok()) return optimizer.status();
  job.spec.model_id = absl::GetFlag(FLAGS_model_id);
  job.spec.tensors = MlpTensorSpecs(job.mlp);
  job.spec.optimizer = *optimizer;
  job.spec.num_trainers = job.num_trainers;
  job.spec.reduction = GradientReduction::kMean;
  return job;
}

std::string Describe(const JobConfig& job, const Dataset& data, const ModelLayout& layout) {
  std::vector<int> widths = {job.mlp.input_dim};
  widths.insert(widths.end(), job.mlp.hidden.begin(), job.mlp.hidden.end());
  widths.push_back(job.mlp.num_classes);
  return absl::StrCat("data: spirals, ", data.num_classes, " classes, ", data.size(),
                      " examples x ", data.num_features, " features (2 signal + ",
                      data.num_features - 2, " noise)\n", "model: MLP ", absl::StrJoin(widths, "-"),
                      " ", job.mlp.activation == Activation::kRelu ? "relu" : "tanh", ", ",
                      layout.used_elements(), " parameters (flat buffer ", layout.total_elements(),
                      " floats, ", layout.shard_count(), " shards of ", layout.ShardSize(0), ")\n",
                      "optimizer: ", job.spec.optimizer.DebugString(), "\n",
                      "job: ", job.num_trainers, " trainers, global batch ", job.batch, " (",
                      job.batch / job.num_trainers, " per trainer), ", job.steps, " steps, seed ",
                      job.seed, ", servers ", absl::StrJoin(job.servers, ","), "\n");
}

MlpMetrics Evaluate(const JobConfig& job, const ModelLayout& layout,
                    const std::vector<float>& params, const Dataset& data) {
  // The binding cannot fail here: the layout was built from this MLP's specs.
  const TensorViews<const float> views =
      TensorViews<const float>::Create(layout, absl::MakeConstSpan(params)).value();
  return EvaluateMlp<float>(job.mlp, BindMlp(job.mlp, views).value(), data);
}

// The model's parameters at version 0, initialised from --seed.
absl::StatusOr<std::vector<float>> InitialParams(const JobConfig& job, TrainerClient& client) {
  absl::StatusOr<ModelLayout> layout = client.LayoutFor(job.spec);
  if (!layout.ok()) return layout.status();
  std::vector<float> params(layout->total_elements(), 0.0f);
  absl::StatusOr<TensorViews<float>> views =
      TensorViews<float>::Create(*layout, absl::MakeSpan(params));
  if (!views.ok()) return views.status();
  absl::StatusOr<MlpTensors<float>> tensors = BindMlp(job.mlp, *views);
  if (!tensors.ok()) return tensors.status();
  InitMlp(job.mlp, *tensors, job.seed);
  return params;
}

// Rank 0 registers freshly initialised parameters; every other rank attaches.
// Then every rank pulls the model's version, rank 0 included: Register on a
// model that already exists with an equal config succeeds and keeps the
// servers' values. A trainer restarted into a running job (or a job
// restored from checkpoints) joins at the version the shards are at, and
// returns it.
absl::StatusOr<int64_t> JoinModel(const JobConfig& job, TrainerClient& client,
                                  std::vector<float>& params) {
  if (job.rank == 0) {
    absl::StatusOr<std::vector<float>> initial = InitialParams(job, client);
    if (!initial.ok()) return initial.status();
    if (absl::Status s = client.Register(job.spec, *initial); !s.ok()) return s;
  } else {
    if (absl::Status s = client.Attach(job.spec); !s.ok()) return s;
  }
  params = client.NewFlatBuffer();
  absl::StatusOr<int64_t> version = client.PullToResume(absl::MakeSpan(params));
  if (!version.ok()) return version.status();
  const int64_t start = *version;
  if (start > job.steps) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model '", job.spec.model_id, "' is already at version ", start, ", past --steps=",
        job.steps, " (left over from an earlier job?); restart the servers or pick another "
        "--model_id"));
  }
  return start;
}

// Runs the job; returns the process exit code after printing why on failure.
int Train(const Dataset& data, const JobConfig& job) {
  const bool leader = job.rank == 0;
  const absl::Time start = absl::Now();
  TrainerClientOptions options;
  options.trainer_rank = job.rank;
  options.rpc_timeout = absl::Seconds(absl::GetFlag(FLAGS_rpc_timeout_s));
  options.security = ChannelSecurityFromFlags();
  // The library's default retry budget (60 s) would keep a trainer whose
  // peer died retrying its blocked pull long after the job is lost, unless
  // a supervisor brings the peer back (then --retry_budget_s).
  const int retry_budget_s = absl::GetFlag(FLAGS_retry_budget_s);
  options.retry_budget = retry_budget_s > 0 ? absl::Seconds(retry_budget_s) : options.rpc_timeout;
  // (Ranks other than 0 wait this long for the model: shards restoring,
  // rank 0 replaced late.)
  options.attach_timeout = options.retry_budget;
  options.replay_steps = absl::GetFlag(FLAGS_replay_steps);
  if (const std::string journal = absl::GetFlag(FLAGS_journal_dir); !journal.empty()) {
    options.journal_path = absl::StrCat(journal, "/rank", job.rank);
  }
  absl::StatusOr<std::unique_ptr<TrainerClient>> client =
      TrainerClient::Connect(job.servers, options);
  std::vector<float> params;
  absl::StatusOr<int64_t> joined =
      client.ok() ? JoinModel(job, **client, params) : absl::StatusOr<int64_t>(client.status());
  if (!joined.ok()) {
    fprintf(stderr, "mlp_trainer rank %u: cannot join the model: %s\n", job.rank,
            joined.status().ToString().c_str());
    return kExitError;
  }
  TrainerClient& trainer = **client;
  const int64_t start_version = *joined;
  const ModelLayout& layout = trainer.layout();

  std::vector<float> grads = trainer.NewFlatBuffer();
  const MlpTensors<const float> param_tensors =
      BindMlp(job.mlp,
              TensorViews<const float>::Create(layout, absl::MakeConstSpan(params)).value())
          .value();
  const MlpTensors<float> grad_tensors =
      BindMlp(job.mlp, TensorViews<float>::Create(layout, absl::MakeSpan(grads)).value()).value();
  const int micro_batches = std::max(1, absl::GetFlag(FLAGS_micro_batches));
  std::vector<float> micro_grads(grads.size(), 0.0f);
  const MlpTensors<float> micro_tensors =
      BindMlp(job.mlp, TensorViews<float>::Create(layout, absl::MakeSpan(micro_grads)).value())
          .value();
  GradientAccumulator accumulator(grads.size());
  BatchSchedule schedule = BatchSchedule::Create(data.size(), job.batch, job.seed).value();

  ProgressReport progress(stdout, absl::Now());
  MlpMetrics initial;
  if (leader) {
    if (start_version == 0) printf("%s", Describe(job, data, layout).c_str());
    // The loss the job started from (also when this trainer joins later).
    absl::StatusOr<std::vector<float>> version0 = InitialParams(job, trainer);
    if (!version0.ok()) {
      fprintf(stderr, "mlp_trainer: %s\n", version0.status().ToString().c_str());
      return kExitError;
    }
    initial = Evaluate(job, layout, *version0, data);
    if (start_version == 0) progress.PrintInitial(initial);
  }
  if (start_version > 0) {
    printf("mlp_trainer rank %u: joined the running job at version %ld\n", job.rank,
           static_cast<long>(start_version));
    fflush(stdout);
  }
  const int log_every = absl::GetFlag(FLAGS_log_every);
  const int eval_every = absl::GetFlag(FLAGS_eval_every);
  const absl::Duration min_step = absl::Milliseconds(absl::GetFlag(FLAGS_min_step_ms));
  // After a call that failed because the job rolled back to a checkpoint
  // every shard holds: pulls its parameters; the version to go on from
  // (nullopt when the pull failed, said on stderr).
  const auto resume_after_rollback = [&](const absl::Status& why) -> std::optional<int64_t> {
    fprintf(stderr, "mlp_trainer rank %u: %s\n", job.rank, why.ToString().c_str());
    absl::StatusOr<int64_t> pulled = trainer.PullToResume(absl::MakeSpan(params));
    if (!pulled.ok()) {
      fprintf(stderr, "mlp_trainer rank %u: after the rollback: %s\n", job.rank,
              pulled.status().ToString().c_str());
      return std::nullopt;
    }
    return *pulled;
  };
  for (int64_t step = start_version + 1;; ++step) {
    if (step > job.steps) {
      // (A job already past --steps, joined late: nothing of it to finish.)
      if (start_version > job.steps) break;
      // The end, saved (TrainerClient::Finish): a shard that restarts from
      // now on comes back at the last step, so no trainer is needed any more.
      absl::Status finished = trainer.Finish(job.steps);
      if (!finished.ok() && trainer.rolled_back_to()) {
        std::optional<int64_t> back = resume_after_rollback(finished);
        if (!back) return kExitError;
        step = *back;  // The loop goes on with step back + 1.
        continue;
      }
      if (!finished.ok()) {
        fprintf(stderr, "mlp_trainer rank %u: at the end: %s\n", job.rank,
                finished.ToString().c_str());
        return kExitError;
      }
      break;
    }
    const absl::Time step_start = absl::Now();
    absl::Cleanup pace = [&] { absl::SleepFor(min_step - (absl::Now() - step_start)); };
    const std::vector<int> batch = schedule.GlobalBatch(step);
    const absl::Span<const int> share = ShareOf(batch, job.rank, job.num_trainers);
    double train_loss = 0;
    if (micro_batches == 1) {
      train_loss = MlpLossAndGradient<float>(job.mlp, param_tensors, data, share, &grad_tensors);
    } else {
      // Contiguous micro-batches of the share; the accumulator weighs each
      // micro-batch's mean-loss gradient by its size.
      for (int m = 0; m < micro_batches; ++m) {
        const size_t begin = share.size() * m / micro_batches;
        const size_t end = share.size() * (m + 1) / micro_batches;
        if (begin == end) continue;
        const absl::Span<const int> micro = share.subspan(begin, end - begin);
        train_loss +=
            MlpLossAndGradient<float>(job.mlp, param_tensors, data, micro, &micro_tensors) *
            static_cast<double>(micro.size()) / share.size();
        if (absl::Status s = accumulator.Add(micro_grads, micro.size()); !s.ok()) {
          fprintf(stderr, "mlp_trainer: %s\n", s.ToString().c_str());
          return kExitError;
        }
      }
      if (absl::Status s = accumulator.Mean(absl::MakeSpan(grads)); !s.ok()) {
        fprintf(stderr, "mlp_trainer: %s\n", s.ToString().c_str());
        return kExitError;
      }
    }
    if (!std::isfinite(train_loss)) {
      fprintf(stderr, "mlp_trainer rank %u: step %ld: the loss is %f; lower --lr\n", job.rank,
              static_cast<long>(step), train_loss);
      return kExitError;
    }
    absl::StatusOr<StepResult> result = trainer.Step(step, grads, absl::MakeSpan(params));
    if (!result.ok() && trainer.rolled_back_to()) {
      // The job went back to a checkpoint every shard holds: go on from there.
      std::optional<int64_t> back = resume_after_rollback(result.status());
      if (!back) return kExitError;
      step = *back;  // The loop goes on with step back + 1.
      continue;
    }
    if (!result.ok()) {
      // A step completes only when every rank has pushed: a timeout here
      // almost always means another trainer is missing, not a slow server.
      const char* hint = absl::IsDeadlineExceeded(result.status())
                             ? " (are all --num_trainers ranks running?)"
                             : "";
      fprintf(stderr, "mlp_trainer rank %u: step %ld: %s%s\n", job.rank, static_cast<long>(step),
              result.status().ToString().c_str(), hint);
      return kExitError;
    }
    if (result->version != step) {
      fprintf(stderr, "mlp_trainer rank %u: pulled version %ld after step %ld\n", job.rank,
              static_cast<long>(result->version), static_cast<long>(step));
      return kExitError;
    }
    progress.RecordStep(result->bytes_pushed + result->bytes_pulled);
    const bool last = step == job.steps;
    const bool evaluate = step % eval_every == 0 || last;
    if (leader && (evaluate || step % log_every == 0)) {
      std::optional<MlpMetrics> eval;
      if (evaluate) eval = Evaluate(job, layout, params, data);
      progress.PrintStep(step, train_loss, eval, absl::Now());
    }
  }

  const absl::Time end = absl::Now();
  const double steps_per_s = progress.TotalStepsPerSecond(end);
  const double mb_per_s = progress.TotalMegabytesPerSecond(end);
  if (!leader) {
    printf("mlp_trainer rank %u: done, %ld steps here in %.2f s (%.1f steps/s, %.2f MB/s)\n",
           job.rank, static_cast<long>(progress.total_steps()), absl::ToDoubleSeconds(end - start),
           steps_per_s, mb_per_s);
    return 0;
  }
  const MlpMetrics final_metrics = Evaluate(job, layout, params, data);
  const double ratio = final_metrics.loss / initial.loss;
  printf(
      "summary: initial loss %.4f acc %.1f%% -> final loss %.4f acc %.1f%% "
      "(%.3fx initial); %ld steps here in %.2f s, %.1f steps/s, %.2f MB/s pushed+pulled\n",
      initial.loss, 100 * initial.accuracy, final_metrics.loss, 100 * final_metrics.accuracy, ratio,
      static_cast<long>(progress.total_steps()), absl::ToDoubleSeconds(end - start), steps_per_s,
      mb_per_s);
  fflush(stdout);  // The summary must precede a verdict on stderr in a shared log.
  const double max_ratio = absl::GetFlag(FLAGS_max_loss_ratio);
  if (!(ratio < max_ratio)) {  // Also catches NaN.
    fprintf(stderr, "FAIL: final loss %.4f is not below %.2f x initial loss %.4f\n",
            final_metrics.loss, max_ratio, initial.loss);
    return kExitNotConverged;
  }
  printf("PASS: final loss %.4f < %.2f x initial loss %.4f\n", final_metrics.loss, max_ratio,
         initial.loss);
  return 0;
}

int Main() {
  absl::StatusOr<Dataset> data = MakeSpirals(SpiralsOptions{}, absl::GetFlag(FLAGS_seed));
  absl::StatusOr<JobConfig> job =
      data.ok() ? ConfigFromFlags(*data) : absl::StatusOr<JobConfig>(data.status());
  if (!job.ok()) {
    fprintf(stderr, "mlp_trainer: %s\n", job.status().ToString().c_str());
    return kExitBadFlags;
  }
  return Train(*data, *job);
}

}  // namespace
}  // namespace shardopt::train

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("shardopt demo trainer: an MLP on spirals, data-parallel");
  absl::ParseCommandLine(argc, argv);
  return shardopt::train::Main();
}
