// shardoptctl: look at a running shardopt cluster.
//
//   shardoptctl status  --servers=host:port,host:port,...
//   shardoptctl inspect --servers=host:port --model=ID [--tensor=NAME]
//                       [--offset=N --length=N] [--json]
//
// `status` prints one table row per shard server (health, device, uptime)
// and one per (model, shard) (range, version, ranks pushed, bytes); it exits
// 1 if any server does not answer. `inspect` prints one model's state on
// each given shard: per-tensor statistics and a slice of values (or the raw
// InspectResponse as JSON with --json, as grpcurl would).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "tools/ctl/commands.h"

ABSL_FLAG(std::string, servers, "", "Comma-separated shard server addresses.");
ABSL_FLAG(std::string, model, "", "Model id (inspect).");
ABSL_FLAG(std::string, tensor, "", "Only this tensor's statistics (inspect).");
ABSL_FLAG(uint64_t, offset, 0, "First range-local element of the value slice (inspect).");
ABSL_FLAG(uint32_t, length, 8, "Number of values in the slice (inspect).");
ABSL_FLAG(bool, json, false, "Print the InspectResponse as JSON (inspect).");
ABSL_FLAG(double, timeout_s, 5, "Deadline of each call, in seconds.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "shardoptctl status --servers=a,b | shardoptctl inspect --servers=a --model=ID");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    fprintf(stderr, "usage: shardoptctl (status|inspect) --servers=host:port,... [flags]\n");
    return 2;
  }
  const std::string command = args[1];
  shardopt::ctl::CommandOptions options;
  options.servers = absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipEmpty());
  options.model = absl::GetFlag(FLAGS_model);
  options.tensor = absl::GetFlag(FLAGS_tensor);
  options.offset = absl::GetFlag(FLAGS_offset);
  options.length = absl::GetFlag(FLAGS_length);
  options.json = absl::GetFlag(FLAGS_json);
  options.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  if (options.servers.empty()) {
    fprintf(stderr, "shardoptctl: --servers is required\n");
    return 2;
  }
  if (command == "status") return shardopt::ctl::Status(options, stdout);
  if (command == "inspect") return shardopt::ctl::Inspect(options, stdout);
  fprintf(stderr, "shardoptctl: unknown command '%s' (status, inspect)\n", command.c_str());
  return 2;
}
