// InitMlp: the initial parameters rank 0 registers with the servers.
//
// Hidden layers get Kaiming-uniform weights with the activation's gain
// (sqrt(2) for ReLU, 5/3 for tanh), so activations keep their scale through
// the layers. The output layer gets PyTorch's nn.Linear default bound,
// 1/sqrt(fan_in): small logits, so the initial loss starts near ln(classes)
// rather than at some large, seed-dependent value. Biases start at zero.
//
// Contract: writes every element of every tensor in `params` (padding is
// untouched), deterministically from `seed`.
#ifndef SHARDOPT_TOOLS_TRAIN_MLP_INIT_H_
#define SHARDOPT_TOOLS_TRAIN_MLP_INIT_H_

#include <cstdint>

#include "tools/train/mlp.h"

namespace shardopt::train {

void InitMlp(const MlpConfig& config, const MlpTensors<float>& params, uint64_t seed);

}  // namespace shardopt::train

#endif  // SHARDOPT_TOOLS_TRAIN_MLP_INIT_H_
