// The commands of shardoptctl, writing human-readable tables to `out`.
// Each returns the process exit code: 0 when every server answered, 1 when
// some did not (their rows say why), 2 for bad usage (an unknown flag or a
// value of the wrong type ends shardoptctl in Abseil's parser, with 1).
#ifndef SHARDOPT_TOOLS_CTL_COMMANDS_H_
#define SHARDOPT_TOOLS_CTL_COMMANDS_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/channel_security.h"

namespace shardopt::ctl {

struct CommandOptions {
  std::vector<std::string> servers;
  std::string model;
  std::string tensor;
  uint64_t offset = 0;
  uint32_t length = 8;
  bool json = false;
  absl::Duration timeout = absl::Seconds(5);
  ChannelFactory channels;  // Plaintext or TLS, and the bearer token.
};

int Status(const CommandOptions& options, FILE* out);
int Inspect(const CommandOptions& options, FILE* out);

}  // namespace shardopt::ctl

#endif  // SHARDOPT_TOOLS_CTL_COMMANDS_H_
