#include "tools/train/mlp_init.h"

#include <algorithm>
#include <cmath>

#include "tools/train/random.h"

namespace shardopt::train {

void InitMlp(const MlpConfig& config, const MlpTensors<float>& params, uint64_t seed) {
  SplitMix64 rng(seed);
  const double gain = config.activation == Activation::kRelu ? std::sqrt(2.0) : 5.0 / 3.0;
  for (int l = 0; l < config.num_layers(); ++l) {
    const int fan_in = config.fan_in(l), fan_out = config.fan_out(l);
    const bool output = l + 1 == config.num_layers();
    const double bound = output ? 1.0 / std::sqrt(fan_in) : gain * std::sqrt(3.0 / fan_in);
    float* w = params.weight[l];
    for (int i = 0; i < fan_in * fan_out; ++i) {
      w[i] = static_cast<float>(rng.Uniform(-bound, bound));
    }
    std::fill(params.bias[l], params.bias[l] + fan_out, 0.0f);
  }
}

}  // namespace shardopt::train
