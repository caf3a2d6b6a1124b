#include "server/step_timeline.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shardopt {
namespace {

// "a..b" over the recorded (non-negative) values of one column.
std::string Span(const std::vector<RangeTimes>& ranges, double RangeTimes::*field) {
  double lo = -1, hi = -1;
  for (const RangeTimes& r : ranges) {
    const double v = r.*field;
    if (v < 0) continue;
    lo = lo < 0 ? v : std::min(lo, v);
    hi = std::max(hi, v);
  }
  if (lo < 0) return "-";
  return absl::StrFormat("%.1f..%.1f", lo, hi);
}

std::string Ms(double v) { return v < 0 ? "-" : absl::StrFormat("%.1f", v); }

}  // namespace

bool StepTimes::pulled() const {
  return !ranges.empty() && std::all_of(ranges.begin(), ranges.end(),
                                        [](const RangeTimes& r) { return r.pulled_ms >= 0; });
}

std::string StepTimes::Describe() const {
  std::string out = absl::StrCat("step ", step, " (ms from its first push): ", ranges.size(),
                                 " ranges arrived ", Span(ranges, &RangeTimes::arrived_ms),
                                 ", updated ", Span(ranges, &RangeTimes::updated_ms), ", pulled ",
                                 Span(ranges, &RangeTimes::pulled_ms), "; last push committed at ",
                                 Ms(committed_ms), "; per range arrived/updated/pulled:");
  for (size_t i = 0; i < ranges.size(); ++i) {
    absl::StrAppend(&out, " ", i, ":", Ms(ranges[i].arrived_ms), "/", Ms(ranges[i].updated_ms), "/",
                    Ms(ranges[i].pulled_ms));
  }
  return out;
}

StepTimeline::StepTimeline(size_t ranges, std::function<void(const StepTimes&)> finished)
    : ranges_(ranges), finished_(std::move(finished)) {}

StepTimeline::Open* StepTimeline::Find(int64_t step) {
  if (current_ && current_->times.step == step) return &*current_;
  if (previous_ && previous_->times.step == step) return &*previous_;
  return nullptr;
}

double StepTimeline::Ms(const Open& open, absl::Time now) const {
  return absl::ToDoubleMilliseconds(now - open.start);
}

void StepTimeline::PushBegan(int64_t step, absl::Time now) {
  std::optional<StepTimes> done;
  {
    absl::MutexLock lock(&mu_);
    if (Find(step) != nullptr) return;
    if (current_) done = current_->times;
    previous_ = std::move(current_);
    current_ = Open{StepTimes{step, -1, std::vector<RangeTimes>(ranges_)}, now};
  }
  if (done && finished_) finished_(*done);
}

void StepTimeline::Arrived(int64_t step, size_t range, absl::Time now) {
  absl::MutexLock lock(&mu_);
  Open* open = Find(step);
  if (open == nullptr || range >= ranges_) return;
  RangeTimes& r = open->times.ranges[range];
  if (r.arrived_ms < 0) r.arrived_ms = Ms(*open, now);
}

void StepTimeline::Updated(int64_t step, size_t range, absl::Time now) {
  absl::MutexLock lock(&mu_);
  Open* open = Find(step);
  if (open == nullptr || range >= ranges_) return;
  open->times.ranges[range].updated_ms = Ms(*open, now);
}

void StepTimeline::Committed(int64_t step, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (Open* open = Find(step)) open->times.committed_ms = Ms(*open, now);
}

void StepTimeline::Pulled(int64_t version, size_t first, size_t last, absl::Time now) {
  absl::MutexLock lock(&mu_);
  Open* open = Find(version);
  if (open == nullptr) return;
  for (size_t i = first; i < last && i < ranges_; ++i) {
    RangeTimes& r = open->times.ranges[i];
    if (r.pulled_ms < 0) r.pulled_ms = Ms(*open, now);
  }
}

std::optional<StepTimes> StepTimeline::NewestPulled() const {
  absl::MutexLock lock(&mu_);
  if (current_ && current_->times.pulled()) return current_->times;
  if (previous_ && previous_->times.pulled()) return previous_->times;
  return std::nullopt;
}

}  // namespace shardopt
