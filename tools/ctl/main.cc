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
//
//   shardoptctl checkpoint --servers=a,b,c --model=ID (--dir=DIR | --periodic) [--step=N]
//   shardoptctl export --checkpoint=DIR --out=FILE.safetensors [--optimizer_state]
//   shardoptctl import --safetensors=FILE --checkpoint=TEMPLATE_DIR --out=NEW_DIR
//
// See tools/ctl/checkpoint_commands.h.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "client/security_flags.h"
#include "tools/ctl/checkpoint_commands.h"
#include "tools/ctl/commands.h"
#include "tools/ctl/health_command.h"

ABSL_FLAG(std::string, servers, "", "Comma-separated shard server addresses.");
ABSL_FLAG(std::string, model, "", "Model id (inspect).");
ABSL_FLAG(std::string, tensor, "", "Only this tensor's statistics (inspect).");
ABSL_FLAG(uint64_t, offset, 0, "First range-local element of the value slice (inspect).");
ABSL_FLAG(uint32_t, length, 8, "Number of values in the slice (inspect).");
ABSL_FLAG(bool, json, false, "Print the InspectResponse as JSON (inspect).");
ABSL_FLAG(double, timeout_s, -1, "Deadline of each call, in seconds (default 5; checkpoint: 600).");
ABSL_FLAG(std::string, dir, "", "Checkpoint directory to write (checkpoint).");
ABSL_FLAG(int64_t, step, -1, "Version to save (checkpoint); -1: the latest version of any shard.");
ABSL_FLAG(bool, periodic, false,
          "Save into the servers' own periodic checkpoints (their --checkpoint_dir, the ones a "
          "restart restores) instead of --dir (checkpoint).");
ABSL_FLAG(std::string, checkpoint, "", "Committed checkpoint directory to read (export, import).");
ABSL_FLAG(std::string, out, "",
          "Safetensors file to write (export) or checkpoint directory to write (import).");
ABSL_FLAG(std::string, safetensors, "", "Safetensors file to read (import).");
ABSL_FLAG(bool, optimizer_state, false,
          "Also export the optimizer state, as optimizer.<slot>.<tensor> (export).");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "shardoptctl status --servers=a,b | shardoptctl inspect --servers=a --model=ID");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    fprintf(
        stderr,
        "usage: shardoptctl (status|health|inspect|checkpoint) --servers=host:port,... [flags]\n"
        "       shardoptctl export --checkpoint=DIR --out=FILE.safetensors\n"
        "       shardoptctl import --safetensors=FILE --checkpoint=DIR --out=NEW_DIR\n");
    return 2;
  }
  const std::string command = args[1];
  // --tls_ca_file, --tls_cert_file, --tls_key_file, --tls_server_name,
  // --auth_token_file: the trainers' flags (client/security_flags.h).
  absl::StatusOr<shardopt::ChannelFactory> channels =
      shardopt::ChannelFactory::Create(shardopt::ChannelSecurityFromFlags());
  if (!channels.ok()) {
    fprintf(stderr, "shardoptctl: %s\n", channels.status().ToString().c_str());
    return 2;
  }
  shardopt::ctl::CheckpointOptions checkpoint;
  checkpoint.channels = *channels;
  checkpoint.servers = absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipEmpty());
  checkpoint.model = absl::GetFlag(FLAGS_model);
  checkpoint.step = absl::GetFlag(FLAGS_step);
  checkpoint.optimizer_state = absl::GetFlag(FLAGS_optimizer_state);
  if (command == "export" || command == "import") {
    checkpoint.directory = absl::GetFlag(FLAGS_checkpoint);
    if (command == "export") {
      checkpoint.safetensors = absl::GetFlag(FLAGS_out);
      return shardopt::ctl::Export(checkpoint, stdout);
    }
    checkpoint.safetensors = absl::GetFlag(FLAGS_safetensors);
    checkpoint.out = absl::GetFlag(FLAGS_out);
    return shardopt::ctl::Import(checkpoint, stdout);
  }
  shardopt::ctl::CommandOptions options;
  options.channels = *channels;
  options.servers = absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipEmpty());
  options.model = absl::GetFlag(FLAGS_model);
  options.tensor = absl::GetFlag(FLAGS_tensor);
  options.offset = absl::GetFlag(FLAGS_offset);
  options.length = absl::GetFlag(FLAGS_length);
  options.json = absl::GetFlag(FLAGS_json);
  // (-1: not given; checkpoints have a default of their own.)
  const double timeout_s = absl::GetFlag(FLAGS_timeout_s);
  options.timeout = absl::Seconds(timeout_s < 0 ? 5 : timeout_s);
  if (options.servers.empty()) {
    fprintf(stderr, "shardoptctl: --servers is required\n");
    return 2;
  }
  if (command == "status") return shardopt::ctl::Status(options, stdout);
  if (command == "health") return shardopt::ctl::Health(options, stdout);
  if (command == "checkpoint") {
    checkpoint.directory = absl::GetFlag(FLAGS_dir);
    checkpoint.periodic = absl::GetFlag(FLAGS_periodic);
    if (timeout_s >= 0) checkpoint.timeout = options.timeout;
    return shardopt::ctl::Checkpoint(checkpoint, stdout);
  }
  if (command == "inspect") return shardopt::ctl::Inspect(options, stdout);
  fprintf(
      stderr,
      "shardoptctl: unknown command '%s' (status, health, inspect, checkpoint, export, import)\n",
      command.c_str());
  return 2;
}
