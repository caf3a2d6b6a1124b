// shardopt_bench's measuring and printing tools, shared by its sections:
// the clock, repeated timing, mean/median/min, fixed-point formatting and a
// plain text table.
#ifndef SHARDOPT_TOOLS_BENCH_BENCH_UTIL_H_
#define SHARDOPT_TOOLS_BENCH_BENCH_UTIL_H_

#include <chrono>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace shardopt::bench {

using Clock = std::chrono::steady_clock;

constexpr size_t kMiB = size_t{1} << 20;

// Seconds since `t0`.
double Since(Clock::time_point t0);

// 0 for an empty vector.
double Median(std::vector<double> v);
double Min(const std::vector<double>& v);
double Mean(const std::vector<double>& v);

// Runs `fn` once untimed, then timed until `budget_s` has passed and at least
// `min_reps` runs were made (at most `max_reps`). Returns the per-run seconds.
template <typename Fn>
std::vector<double> TimeRepeated(double budget_s, int min_reps, int max_reps, Fn&& fn) {
  fn();
  std::vector<double> times;
  const Clock::time_point start = Clock::now();
  while (static_cast<int>(times.size()) < max_reps &&
         (static_cast<int>(times.size()) < min_reps || Since(start) < budget_s)) {
    const Clock::time_point t0 = Clock::now();
    fn();
    times.push_back(Since(t0));
  }
  return times;
}

// `v` with `decimals` digits after the point.
std::string Fixed(double v, int decimals);

// A plain text table: the first column left-aligned, the others right-aligned.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void AddRow(std::vector<std::string> row);
  // To stdout, indented by two spaces, then flushed.
  void Print() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace shardopt::bench

#endif  // SHARDOPT_TOOLS_BENCH_BENCH_UTIL_H_
