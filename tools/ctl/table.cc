#include "tools/ctl/table.h"

#include <algorithm>

namespace shardopt::ctl {

void Table::Print(FILE* out) const {
  std::vector<size_t> widths;
  for (const auto& row : rows_) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  for (const auto& row : rows_) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(widths[c] - row[c].size() + 2, ' ');
    }
    fprintf(out, "%s\n", line.c_str());
  }
}

}  // namespace shardopt::ctl
