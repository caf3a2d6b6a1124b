// shardopt_bench's gradients, parameters and SGD configuration (workload.h).
#include "tools/bench/workload.h"

namespace shardopt::bench {

float GradientAt(size_t i) { return static_cast<float>(static_cast<int>(i % 251) - 125) * 1e-3f; }

float ParamAt(size_t i) { return static_cast<float>(static_cast<int>(i % 97) - 48) * 1e-2f; }

void FillGradients(std::vector<float>& g) {
  for (size_t i = 0; i < g.size(); ++i) g[i] = GradientAt(i);
}

void FillParams(std::vector<float>& p) {
  for (size_t i = 0; i < p.size(); ++i) p[i] = ParamAt(i);
}

OptimizerConfig BenchSgd() { return OptimizerConfig::Sgd(1e-4); }

}  // namespace shardopt::bench
