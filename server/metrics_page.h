// The /metrics page of a shard server in the Prometheus text exposition
// format (version 0.0.4): the counters of ServerMetrics plus gauges read
// from every hosted model when the page is scraped. The per-model numbers
// are the ones Inspect answers (the same snapshot), so the two agree.
#ifndef SHARDOPT_SERVER_METRICS_PAGE_H_
#define SHARDOPT_SERVER_METRICS_PAGE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "server/metrics.h"

namespace shardopt {

struct TrainerGauges {
  int64_t last_pushed_step = 0;
  double seconds_since_last_push = -1;  // -1: unknown (after a restore).
};

struct ModelGauges {
  std::string model_id;
  int64_t version = 0;
  int64_t steps_applied = 0;  // Optimizer updates (skips excluded): the model's.
  int64_t steps_skipped = 0;
  int64_t steps_applied_here = 0;  // Of those, this server's (HostedModel::AppliedHere).
  int64_t steps_skipped_here = 0;
  uint64_t gradient_bytes_received = 0;
  uint64_t parameter_bytes_sent = 0;
  uint64_t parameter_bytes = 0;
  uint64_t optimizer_state_bytes = 0;
  uint64_t staging_bytes = 0;
  double loss_scale = 1;  // Of the last decided step.
  double grad_norm = 0;   // Of the last decided step (with gradient control).
  double last_lr = 0;
  int64_t newest_committed_checkpoint = -1;
  std::vector<TrainerGauges> trainers;  // By rank.
};

struct ServerGauges {
  uint32_t shard_index = 0;
  uint32_t shard_count = 1;
  std::string device;
  double uptime_seconds = 0;
  uint64_t state_budget_bytes = 0;
};

std::string RenderMetricsPage(const ServerMetrics::Values& counters, const ServerGauges& server,
                              const std::vector<ModelGauges>& models);

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_METRICS_PAGE_H_
