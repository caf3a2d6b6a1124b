#include "server/metrics_page.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shardopt {
namespace {

// Doubles as the text format wants them: the shortest form of up to 17
// digits that reads back as the same double (so counters print whole).
std::string Number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  for (int digits = 15; digits < 17; ++digits) {
    std::string text = absl::StrFormat("%.*g", digits, v);
    if (std::strtod(text.c_str(), nullptr) == v) return text;
  }
  return absl::StrFormat("%.17g", v);
}

class Page {
 public:
  void Family(absl::string_view name, absl::string_view type, absl::string_view help) {
    absl::StrAppend(&text_, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
  }
  void Sample(absl::string_view name, absl::string_view labels, double value) {
    absl::StrAppend(&text_, name, labels.empty() ? "" : "{", labels, labels.empty() ? "" : "}", " ",
                    Number(value), "\n");
  }
  void Counters(absl::string_view name, absl::string_view help,
                const ServerMetrics::Counters& counters) {
    Family(name, "counter", help);
    for (const auto& [labels, value] : counters) Sample(name, labels, static_cast<double>(value));
  }
  void Histograms(absl::string_view name, absl::string_view help,
                  const ServerMetrics::Histograms& histograms) {
    Family(name, "histogram", help);
    for (const auto& [labels, h] : histograms) {
      const std::string prefix = labels.empty() ? "" : absl::StrCat(labels, ",");
      uint64_t cumulative = 0;
      for (size_t i = 0; i < h.counts.size(); ++i) {
        cumulative += h.counts[i];
        const std::string le = i < h.upper_bounds.size() ? Number(h.upper_bounds[i]) : "+Inf";
        Sample(absl::StrCat(name, "_bucket"), absl::StrCat(prefix, Label("le", le)),
               static_cast<double>(cumulative));
      }
      Sample(absl::StrCat(name, "_sum"), labels, h.sum);
      Sample(absl::StrCat(name, "_count"), labels, static_cast<double>(h.count));
    }
  }
  // One gauge (or counter) per model, from `value_of`.
  template <typename Fn>
  void PerModel(absl::string_view name, absl::string_view type, absl::string_view help,
                const std::vector<ModelGauges>& models, Fn value_of) {
    Family(name, type, help);
    for (const ModelGauges& m : models) Sample(name, Label("model", m.model_id), value_of(m));
  }
  // One gauge per (model, trainer rank), for the first kMaxTrainerSeries
  // ranks of each model.
  template <typename Fn>
  void PerTrainer(absl::string_view name, absl::string_view help,
                  const std::vector<ModelGauges>& models, Fn value_of) {
    Family(name, "gauge", help);
    for (const ModelGauges& m : models) {
      for (size_t r = 0; r < std::min<size_t>(m.trainers.size(), kMaxTrainerSeries); ++r) {
        Sample(name,
               absl::StrCat(Label("model", m.model_id), ",", Label("trainer", absl::StrCat(r))),
               value_of(m, m.trainers[r]));
      }
    }
  }
  std::string Take() { return std::move(text_); }

 private:
  std::string text_;
};

}  // namespace

std::string RenderMetricsPage(const ServerMetrics::Values& counters, const ServerGauges& server,
                              const std::vector<ModelGauges>& models) {
  Page page;
  page.Family("shardopt_shard_info", "gauge", "This server's shard index, shard count and device.");
  page.Sample("shardopt_shard_info",
              absl::StrCat(Label("shard_index", absl::StrCat(server.shard_index)), ",",
                           Label("shard_count", absl::StrCat(server.shard_count)), ",",
                           Label("device", server.device)),
              1);
  page.Family("shardopt_uptime_seconds", "gauge", "Seconds since the server started.");
  page.Sample("shardopt_uptime_seconds", "", server.uptime_seconds);
  page.Family("shardopt_state_budget_bytes", "gauge", "--max_state_mib in bytes.");
  page.Sample("shardopt_state_budget_bytes", "", static_cast<double>(server.state_budget_bytes));

  page.Counters("shardopt_rpc_handled_total", "Calls finished, by service, method and status code.",
                counters.calls);
  page.Histograms("shardopt_rpc_duration_seconds",
                  "Time from a call's start to its status, by service and method.",
                  counters.call_seconds);
  page.Counters("shardopt_pushes_total",
                "Gradient pushes answered OK, by model, trainer rank and outcome.",
                counters.pushes);
  page.Counters("shardopt_pushes_refused_total",
                "Pushes naming a registered model and a valid trainer rank that were refused "
                "(nothing staged), by status code.",
                counters.pushes_refused);
  page.Counters("shardopt_pushes_abandoned_total",
                "Pushes that broke off or stalled before their end (nothing staged).",
                counters.pushes_abandoned);
  page.Counters("shardopt_pulls_total", "Parameter pulls answered OK, by model.", counters.pulls);
  page.Counters("shardopt_checkpoints_total",
                "Checkpoint parts this shard wrote (periodic and requested), by result.",
                counters.checkpoints);
  page.Histograms("shardopt_checkpoint_write_seconds",
                  "Time to write and sync this shard's part of a checkpoint.",
                  counters.checkpoint_seconds);

  page.PerModel("shardopt_model_version", "gauge",
                "The newest version applied (the step; asynchronous models: the pushes applied).",
                models, [](const ModelGauges& m) { return static_cast<double>(m.version); });
  page.PerModel("shardopt_steps_applied_total", "counter",
                "Optimizer updates this server applied (from 0 at its start, across rollbacks).",
                models,
                [](const ModelGauges& m) { return static_cast<double>(m.steps_applied_here); });
  page.PerModel("shardopt_steps_skipped_total", "counter",
                "Steps this server skipped for inf/NaN gradients (from 0 at its start).", models,
                [](const ModelGauges& m) { return static_cast<double>(m.steps_skipped_here); });
  page.PerModel("shardopt_model_optimizer_steps", "gauge",
                "The model's optimizer updates (Inspect's optimizer_steps: a restore or rollback "
                "sets it back).",
                models, [](const ModelGauges& m) { return static_cast<double>(m.steps_applied); });
  page.PerModel("shardopt_model_skipped_steps", "gauge",
                "The model's skipped steps (Inspect's skipped_steps).", models,
                [](const ModelGauges& m) { return static_cast<double>(m.steps_skipped); });
  page.PerModel(
      "shardopt_gradient_bytes_received_total", "counter",
      "Gradient payload bytes received in committed pushes.", models,
      [](const ModelGauges& m) { return static_cast<double>(m.gradient_bytes_received); });
  page.PerModel("shardopt_parameter_bytes_sent_total", "counter",
                "Parameter payload bytes sent in pulls.", models,
                [](const ModelGauges& m) { return static_cast<double>(m.parameter_bytes_sent); });
  page.Family("shardopt_state_bytes", "gauge",
              "Model state held, by kind (parameters, optimizer_state, staging).");
  for (const ModelGauges& m : models) {
    const std::string model = Label("model", m.model_id);
    page.Sample("shardopt_state_bytes", absl::StrCat(model, ",", Label("kind", "parameters")),
                static_cast<double>(m.parameter_bytes));
    page.Sample("shardopt_state_bytes", absl::StrCat(model, ",", Label("kind", "optimizer_state")),
                static_cast<double>(m.optimizer_state_bytes));
    page.Sample("shardopt_state_bytes", absl::StrCat(model, ",", Label("kind", "staging")),
                static_cast<double>(m.staging_bytes));
  }
  page.PerModel("shardopt_loss_scale", "gauge", "Loss scale of the last decided step.", models,
                [](const ModelGauges& m) { return m.loss_scale; });
  page.PerModel("shardopt_grad_norm", "gauge",
                "Global gradient norm of the last decided step (with gradient control).", models,
                [](const ModelGauges& m) { return m.grad_norm; });
  page.PerModel("shardopt_last_lr", "gauge", "Learning rate of the last applied step.", models,
                [](const ModelGauges& m) { return m.last_lr; });
  page.PerModel(
      "shardopt_newest_committed_checkpoint_step", "gauge",
      "Step of the newest committed checkpoint (-1: none).", models,
      [](const ModelGauges& m) { return static_cast<double>(m.newest_committed_checkpoint); });

  page.PerTrainer("shardopt_trainer_last_pushed_step",
                  "Highest step whose push this shard committed, per trainer.", models,
                  [](const ModelGauges&, const TrainerGauges& t) {
                    return static_cast<double>(t.last_pushed_step);
                  });
  page.PerTrainer("shardopt_trainer_lag_steps",
                  "Steps a trainer's last push is behind the most advanced trainer's.", models,
                  [](const ModelGauges& m, const TrainerGauges& t) {
                    int64_t newest = 0;
                    for (const TrainerGauges& u : m.trainers) {
                      newest = std::max(newest, u.last_pushed_step);
                    }
                    return static_cast<double>(newest - t.last_pushed_step);
                  });
  page.PerTrainer(
      "shardopt_trainer_seconds_since_last_push",
      "Seconds since a trainer's last committed push (-1: none since the restore).", models,
      [](const ModelGauges&, const TrainerGauges& t) { return t.seconds_since_last_push; });
  return page.Take();
}

}  // namespace shardopt
