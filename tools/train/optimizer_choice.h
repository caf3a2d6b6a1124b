// OptimizerChoice: the --optimizer / --lr flags of the trainer as an
// OptimizerConfig.
//
// Each name maps to PyTorch's defaults for that optimizer (see
// common/optimizer_config.h) except the learning rate, whose default here
// is one that trains the spirals MLP in a few hundred full-size steps
// (PyTorch's 1e-3 for Adam(W) is too timid for a 300-step demo), and SGD,
// which gets momentum 0.9 because plain SGD needs thousands of steps here.
#ifndef SHARDOPT_TOOLS_TRAIN_OPTIMIZER_CHOICE_H_
#define SHARDOPT_TOOLS_TRAIN_OPTIMIZER_CHOICE_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/optimizer_config.h"

namespace shardopt::train {

// `name` is adamw, adam, sgd, adagrad or lion; lr <= 0 selects the default above.
// INVALID_ARGUMENT for an unknown name or a config torch.optim would reject.
absl::StatusOr<OptimizerConfig> ChooseOptimizer(absl::string_view name, double lr);

}  // namespace shardopt::train

#endif  // SHARDOPT_TOOLS_TRAIN_OPTIMIZER_CHOICE_H_
