// ServerMetrics: the counters and histograms a shard server keeps for its
// /metrics page (server/metrics_page.h renders them, with the per-model
// gauges read from each model at scrape time).
//
// What is counted here is what no model's state records: calls by method
// and status code with their latency, pushes by outcome, pushes refused or
// abandoned (per trainer, so that a client disturbing a trainer's pushes
// shows), pulls, checkpoint writes and failures with their duration.
// Label sets stay bounded: methods are the server's own, models are the
// registered ones and trainers their ranks, the first kMaxTrainerSeries of
// them by name (the rest as trainer="other"). Thread-safe.
#ifndef SHARDOPT_SERVER_METRICS_H_
#define SHARDOPT_SERVER_METRICS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace shardopt {

// Cumulative buckets of observed values, as Prometheus histograms hold them.
struct HistogramData {
  std::vector<double> upper_bounds;  // Ascending; +Inf is implied.
  std::vector<uint64_t> counts;      // Per bucket (not cumulative), last one +Inf.
  double sum = 0;
  uint64_t count = 0;
  void Observe(double value);
};

// Ranks with series of their own per model; a model of more trainers (up to
// 4096) would otherwise add thousands of series to every scrape.
inline constexpr uint32_t kMaxTrainerSeries = 256;

// Latency buckets in seconds: 100 us to 60 s.
std::vector<double> LatencyBuckets();
// A checkpoint part's write, in seconds: 0.1 s to 30 min (a few GiB to a
// shared filesystem; the shutdown grace period is sized from it).
std::vector<double> CheckpointWriteBuckets();

class ServerMetrics {
 public:
  // Label text -> value, e.g. `method="PushGradients",code="OK"` -> 12.
  using Counters = std::map<std::string, uint64_t>;
  using Histograms = std::map<std::string, HistogramData>;

  // One finished call of any service (`full_method` as gRPC names it,
  // "/pkg.Service/Method"), with its status code name and duration.
  void RecordCall(absl::string_view full_method, absl::string_view code, double seconds);
  // A push that committed or was answered without staging (outcome as the
  // proto names it, lower case: "accepted", "duplicate", ...).
  void RecordPush(absl::string_view model, uint32_t rank, absl::string_view outcome);
  // A push of a known trainer refused with `code` (nothing staged).
  void RecordPushRefused(absl::string_view model, uint32_t rank, absl::string_view code);
  // A push of a known trainer that broke off or stalled before it ended.
  void RecordPushAbandoned(absl::string_view model, uint32_t rank);
  void RecordPull(absl::string_view model);
  void RecordCheckpoint(absl::string_view model, bool ok, double seconds);

  struct Values {
    Counters calls;                 // service, method, code
    Histograms call_seconds;        // service, method
    Counters pushes;                // model, trainer, outcome
    Counters pushes_refused;        // model, trainer, code
    Counters pushes_abandoned;      // model, trainer
    Counters pulls;                 // model
    Counters checkpoints;           // model, result
    Histograms checkpoint_seconds;  // model
  };
  Values Read() const;

 private:
  mutable absl::Mutex mu_;
  Values values_ ABSL_GUARDED_BY(mu_);
};

// `name="value"` with the value escaped as the text format wants.
std::string Label(absl::string_view name, absl::string_view value);

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_METRICS_H_
