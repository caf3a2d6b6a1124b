// Table: left-aligned text columns sized to their widest cell.
#ifndef SHARDOPT_TOOLS_CTL_TABLE_H_
#define SHARDOPT_TOOLS_CTL_TABLE_H_

#include <cstdio>
#include <string>
#include <vector>

namespace shardopt::ctl {

class Table {
 public:
  explicit Table(std::vector<std::string> header) : rows_{std::move(header)} {}
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void Print(FILE* out) const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace shardopt::ctl

#endif  // SHARDOPT_TOOLS_CTL_TABLE_H_
