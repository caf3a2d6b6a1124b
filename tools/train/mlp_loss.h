// The forward pass and hand-written backward pass of an Mlp (mlp.h) under
// mean softmax cross-entropy, and full-dataset evaluation.
//
// Contract: MlpLossAndGradient returns the mean loss over the examples
// `indices` of `data` and, when `grads` is non-null, writes (overwrites, never
// accumulates) the exact gradient of that mean into every tensor of `grads`.
// `indices` must be non-empty. The arithmetic runs in T: float in trainers,
// double for the finite-difference tests. Loss sums are kept in double either
// way, so a loss over thousands of examples does not drift with T. Pure
// functions: concurrent calls are safe when their `grads` differ.
#ifndef SHARDOPT_TOOLS_TRAIN_MLP_LOSS_H_
#define SHARDOPT_TOOLS_TRAIN_MLP_LOSS_H_

#include "absl/types/span.h"
#include "tools/train/dataset.h"
#include "tools/train/mlp.h"

namespace shardopt::train {

template <typename T>
double MlpLossAndGradient(const MlpConfig& config, const MlpTensors<const T>& params,
                          const Dataset& data, absl::Span<const int> indices,
                          const MlpTensors<T>* grads);

struct MlpMetrics {
  double loss = 0;      // Mean cross-entropy (nats).
  double accuracy = 0;  // Fraction whose largest logit is the label.
};

// Forward pass only, over every example of `data`.
template <typename T>
MlpMetrics EvaluateMlp(const MlpConfig& config, const MlpTensors<const T>& params,
                       const Dataset& data);

}  // namespace shardopt::train

#endif  // SHARDOPT_TOOLS_TRAIN_MLP_LOSS_H_
