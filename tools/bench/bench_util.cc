// shardopt_bench's statistics, number formatting and text table
// (bench_util.h).
#include "tools/bench/bench_util.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_format.h"

namespace shardopt::bench {

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double Min(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::min_element(v.begin(), v.end());
}

double Mean(const std::vector<double>& v) {
  if (v.empty()) return 0;
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

std::string Fixed(double v, int decimals) { return absl::StrFormat("%.*f", decimals, v); }

void Table::AddRow(std::vector<std::string> row) {
  row.resize(header_.size());
  rows_.push_back(std::move(row));
}

void Table::Print() const {
  std::vector<size_t> width(header_.size());
  for (size_t c = 0; c < header_.size(); ++c) {
    width[c] = header_[c].size();
    for (const auto& r : rows_) width[c] = std::max(width[c], r[c].size());
  }
  auto line = [&](const std::vector<std::string>& r) {
    std::string out = "  ";
    for (size_t c = 0; c < r.size(); ++c) {
      if (c > 0) out += "  ";
      const std::string pad(width[c] - r[c].size(), ' ');
      out += c == 0 ? r[c] + pad : pad + r[c];
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    absl::PrintF("%s\n", out.c_str());
  };
  line(header_);
  size_t total = 0;
  for (size_t w : width) total += w;
  absl::PrintF("  %s\n", std::string(total + 2 * (width.size() - 1), '-').c_str());
  for (const auto& r : rows_) line(r);
  std::fflush(stdout);
}

}  // namespace shardopt::bench
