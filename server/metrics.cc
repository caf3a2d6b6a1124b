#include "server/metrics.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace shardopt {
namespace {

void Observe(ServerMetrics::Histograms& histograms, const std::string& labels, double value,
             std::vector<double> (*buckets)() = LatencyBuckets) {
  auto [it, inserted] = histograms.try_emplace(labels);
  if (inserted) {
    it->second.upper_bounds = buckets();
    it->second.counts.assign(it->second.upper_bounds.size() + 1, 0);
  }
  it->second.Observe(value);
}

// "/shardopt.v1.ShardService/PushGradients" -> service and method labels.
std::string MethodLabels(absl::string_view full_method) {
  absl::string_view path = full_method;
  if (!path.empty() && path.front() == '/') path.remove_prefix(1);
  const size_t slash = path.find('/');
  if (slash == absl::string_view::npos)
    return absl::StrCat(Label("service", ""), ",", Label("method", path));
  return absl::StrCat(Label("service", path.substr(0, slash)), ",",
                      Label("method", path.substr(slash + 1)));
}

std::string ModelTrainer(absl::string_view model, uint32_t rank) {
  return absl::StrCat(Label("model", model), ",",
                      Label("trainer", rank < kMaxTrainerSeries ? absl::StrCat(rank) : "other"));
}

}  // namespace

void HistogramData::Observe(double value) {
  const size_t bucket =
      std::lower_bound(upper_bounds.begin(), upper_bounds.end(), value) - upper_bounds.begin();
  ++counts[bucket];
  sum += value;
  ++count;
}

std::vector<double> LatencyBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
          0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};
}

std::vector<double> CheckpointWriteBuckets() {
  return {0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800};
}

std::string Label(absl::string_view name, absl::string_view value) {
  std::string escaped;
  for (char c : value) {
    if (c == '\\' || c == '"') {
      escaped.push_back('\\');
      escaped.push_back(c);
    } else if (c == '\n') {
      escaped += "\\n";
    } else {
      escaped.push_back(c);
    }
  }
  return absl::StrCat(name, "=\"", escaped, "\"");
}

void ServerMetrics::RecordCall(absl::string_view full_method, absl::string_view code,
                               double seconds) {
  const std::string method = MethodLabels(full_method);
  absl::MutexLock lock(&mu_);
  ++values_.calls[absl::StrCat(method, ",", Label("code", code))];
  Observe(values_.call_seconds, method, seconds);
}

void ServerMetrics::RecordPush(absl::string_view model, uint32_t rank, absl::string_view outcome) {
  const std::string labels =
      absl::StrCat(ModelTrainer(model, rank), ",", Label("outcome", outcome));
  absl::MutexLock lock(&mu_);
  ++values_.pushes[labels];
}

void ServerMetrics::RecordPushRefused(absl::string_view model, uint32_t rank,
                                      absl::string_view code) {
  const std::string labels = absl::StrCat(ModelTrainer(model, rank), ",", Label("code", code));
  absl::MutexLock lock(&mu_);
  ++values_.pushes_refused[labels];
}

void ServerMetrics::RecordPushAbandoned(absl::string_view model, uint32_t rank) {
  const std::string labels = ModelTrainer(model, rank);
  absl::MutexLock lock(&mu_);
  ++values_.pushes_abandoned[labels];
}

void ServerMetrics::RecordPull(absl::string_view model) {
  const std::string labels = Label("model", model);
  absl::MutexLock lock(&mu_);
  ++values_.pulls[labels];
}

void ServerMetrics::RecordCheckpoint(absl::string_view model, bool ok, double seconds) {
  const std::string labels = Label("model", model);
  absl::MutexLock lock(&mu_);
  ++values_.checkpoints[absl::StrCat(labels, ",", Label("result", ok ? "ok" : "failed"))];
  if (ok) Observe(values_.checkpoint_seconds, labels, seconds, CheckpointWriteBuckets);
}

ServerMetrics::Values ServerMetrics::Read() const {
  absl::MutexLock lock(&mu_);
  return values_;
}

}  // namespace shardopt
