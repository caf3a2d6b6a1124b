// shardoptctl's checkpoint commands:
//   checkpoint  every shard of a running model saves the same step to a
//               directory (the Checkpoint RPC, called on all shards at once);
//   export      a committed checkpoint's parameters (and, with
//               --optimizer_state, its optimizer state) as one safetensors
//               file that PyTorch's safetensors loader reads by tensor name;
//   import      a safetensors file (parameters, optionally optimizer state)
//               made into a one-part checkpoint of a model described by a
//               template checkpoint; servers restore it on any shard count.
// Exit codes as in commands.h.
#ifndef SHARDOPT_TOOLS_CTL_CHECKPOINT_COMMANDS_H_
#define SHARDOPT_TOOLS_CTL_CHECKPOINT_COMMANDS_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/channel_security.h"

namespace shardopt::ctl {

struct CheckpointOptions {
  std::vector<std::string> servers;  // checkpoint: every shard, in shard order.
  std::string model;                 // checkpoint
  std::string directory;             // checkpoint: where; export/import: the checkpoint read.
  int64_t step = -1;                 // checkpoint: -1 = the shards' latest version.
  // checkpoint: into the servers' periodic checkpoints (CheckpointRequest.
  // periodic) instead of `directory`.
  bool periodic = false;
  std::string safetensors;           // export: written; import: read.
  std::string out;                   // import: the checkpoint directory written.
  bool optimizer_state = false;      // export: include the optimizer slots.
  absl::Duration timeout = absl::Minutes(10);
  ChannelFactory channels;  // Plaintext or TLS, and the bearer token.
};

// Names of the tensors in an exported file: parameters by their own name,
// optimizer slots as "optimizer.<slot>.<tensor>" (slot in PyTorch's terms).
std::string OptimizerStateTensorName(const std::string& slot, const std::string& tensor);

int Checkpoint(const CheckpointOptions& options, FILE* out);
int Export(const CheckpointOptions& options, FILE* out);
int Import(const CheckpointOptions& options, FILE* out);

}  // namespace shardopt::ctl

#endif  // SHARDOPT_TOOLS_CTL_CHECKPOINT_COMMANDS_H_
