// StepTimeline: a debug record (--step_timeline) of when each range of a
// pipelined step arrived (every trainer's gradient of it in, so its work
// could start), was updated, and was first pulled at the step's version, in
// milliseconds from the step's first admitted push; and when the last push
// of the step was committed. It shows whether push, update and pull overlap
// and where a step's time goes. Thread-safe; ModelShard feeds it.
#ifndef SHARDOPT_SERVER_STEP_TIMELINE_H_
#define SHARDOPT_SERVER_STEP_TIMELINE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shardopt {

struct RangeTimes {
  double arrived_ms = -1;  // -1: not (yet).
  double updated_ms = -1;
  double pulled_ms = -1;
};

struct StepTimes {
  int64_t step = 0;
  double committed_ms = -1;  // The last push of the step committed.
  std::vector<RangeTimes> ranges;

  // Every range pulled at least once.
  bool pulled() const;
  // One line: the spans of each column, then every range's three times.
  std::string Describe() const;
};

class StepTimeline {
 public:
  // `ranges`: the shard's range count. `finished` receives each step's
  // record once the next step begins (the daemon logs it).
  StepTimeline(size_t ranges, std::function<void(const StepTimes&)> finished);

  void PushBegan(int64_t step, absl::Time now);
  void Arrived(int64_t step, size_t range, absl::Time now);
  void Updated(int64_t step, size_t range, absl::Time now);
  void Committed(int64_t step, absl::Time now);
  // Ranges [first, last) were read at `version`.
  void Pulled(int64_t version, size_t first, size_t last, absl::Time now);

  // The newest step whose every range was pulled, if any.
  std::optional<StepTimes> NewestPulled() const;

 private:
  struct Open {
    StepTimes times;
    absl::Time start;
  };
  Open* Find(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double Ms(const Open& open, absl::Time now) const;

  const size_t ranges_;
  const std::function<void(const StepTimes&)> finished_;
  mutable absl::Mutex mu_;
  std::optional<Open> current_ ABSL_GUARDED_BY(mu_);
  std::optional<Open> previous_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_STEP_TIMELINE_H_
