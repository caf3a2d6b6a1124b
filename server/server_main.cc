#include "server/server_main.h"

#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/layout.h"
#include "common/logging.h"
#include "common/secret_files.h"
#include "server/access_control.h"
#include "server/device_support.h"
#include "server/listen_check.h"
#include "server/malloc_tuning.h"
#include "server/shard_server.h"
#include "server/shutdown_signals.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "Address to listen on; port 0 picks a free port (see --port_file).");
ABSL_FLAG(uint32_t, shard_index, 0, "This server's shard index, in [0, shard_count).");
ABSL_FLAG(uint32_t, shard_count, 1, "Number of shards the models are split into.");
ABSL_FLAG(std::string, device, "auto",
          "Where model state lives and updates run: cpu, cuda:N, or auto (the first usable "
          "GPU, else the CPU).");
ABSL_FLAG(bool, device_fallback_to_cpu, false,
          "With --device=cuda:N: use the CPU (with a warning) when that GPU is not usable, "
          "instead of exiting.");
ABSL_FLAG(int, threads, 0, "Optimizer threads; 0 = number of CPUs.");
ABSL_FLAG(std::string, port_file, "",
          "If set, the bound port is written to this file (atomically) once serving.");
ABSL_FLAG(int, pull_chunk_kib, 1024,
          "KiB of parameters per PullParameters message, in [1, 32768]. Clients must accept "
          "messages this large plus a few bytes (gRPC's default limit is 4 MiB).");
ABSL_FLAG(int64_t, pipeline_range_elements, int64_t{1} << 20,
          "Elements per range of a pipelined step: a range is updated as soon as every "
          "trainer's gradient of it has arrived, and pulls stream it at once (results are "
          "bit-identical to whole steps). 0 = whole steps. Rounded up to a multiple of 16 "
          "(of 65536 with gradient clipping or loss scaling).");
ABSL_FLAG(bool, step_timeline, false,
          "Debug aid: log, as each step ends, when each of its ranges arrived, was updated and "
          "was first pulled; Inspect returns the newest such step (step_timeline).");
ABSL_FLAG(bool, shared_memory, true,
          "Let trainers on this host (same user, same network namespace) move gradients and "
          "parameters through shared memory instead of the gRPC stream; --noshared_memory: "
          "always the stream.");
ABSL_FLAG(bool, payload_socket, true,
          "Let trainers that reach this server over plaintext move gradients and parameters "
          "over a plain TCP connection to a port of the --listen host (ServerInfo names it) "
          "instead of the gRPC stream; never with TLS. --nopayload_socket: always the stream.");
ABSL_FLAG(int, payload_socket_port, 0,
          "The payload socket's TCP port (for firewalls); 0: a free one. A port that cannot be "
          "bound leaves the server without a payload socket (logged).");
ABSL_FLAG(std::string, device_pairs, "off",
          "Device pairs trainers may open (the device data plane: push and pull bytes straight "
          "into and out of the memory the models live in, gRPC keeping every call): 'nccl' "
          "(NCCL between GPUs; a server on a GPU), 'loopback' (host memory over a Unix socket, "
          "the same protocol for a server on the CPU), or 'off'.");
ABSL_FLAG(int, stream_idle_timeout_s, 60,
          "Cancel push and register streams that send nothing for this many seconds "
          "(0 = never).");
ABSL_FLAG(int, max_threads, 1024,
          "Most threads gRPC may use for calls; calls beyond get RESOURCE_EXHAUSTED.");
ABSL_FLAG(uint64_t, max_state_mib, 0,
          "Refuse registrations past this much model state (parameters, optimizer slots, "
          "per-trainer staging) in MiB; 0 = 3/4 of physical memory, or of the GPU's memory "
          "when the state is on a GPU.");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "Periodic checkpoints (with --checkpoint_every) go to DIR/<model_id>/step-<N>/. "
          "A directory every shard of the job can write (shared filesystem).");
ABSL_FLAG(int64_t, checkpoint_every, 0,
          "Save every model at each version that is a multiple of this (0 = off).");
ABSL_FLAG(int, checkpoint_keep, 0,
          "Keep this many committed periodic checkpoints per model and remove older ones "
          "(each shard its own files); 0 keeps all. Keep at least 2: a shard that dies while "
          "writing one restarts from the one before.");
ABSL_FLAG(std::string, checkpoint_request_root, "",
          "If set, Checkpoint requests (shardoptctl checkpoint, state_dict()) may only name "
          "directories inside this one (PERMISSION_DENIED otherwise); empty: any directory this "
          "server may write.");
ABSL_FLAG(std::string, restore_from, "",
          "Before serving, load models from this checkpoint directory, or from the latest "
          "committed checkpoint of each model under this --checkpoint_dir-style root (none "
          "there is fine: start empty). The checkpoint may come from any shard count.");
ABSL_FLAG(std::string, restore_partition, "",
          "With --restore_from: flat or whole_tensors, the partition restored models take "
          "(trainers then register with it); empty keeps the saved one.");

ABSL_FLAG(std::string, metrics_listen, "",
          "HOST:PORT for plain HTTP: /metrics (Prometheus text format) and /healthz (200 while "
          "serving, else 503). Empty: none.");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM certificate chain: serve TLS instead of plaintext (with --tls_key_file).");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file.");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "PEM CA certificates: require every client to present a certificate they signed "
          "(mutual TLS). Needs --tls_cert_file.");
ABSL_FLAG(std::string, auth_token_file, "",
          "File of `trainer TOKEN` / `readonly TOKEN` lines: every call must carry "
          "`authorization: Bearer TOKEN`; read-only tokens may call only Inspect, GetServerInfo "
          "and health. Empty: no tokens needed.");

namespace shardopt {
namespace {

// Reads the TLS and token flags into `options`; false (logged) on a bad one.
bool ReadSecurityFlags(FileEnv* env, ShardServerOptions* options) {
  const std::string cert = absl::GetFlag(FLAGS_tls_cert_file);
  const std::string key = absl::GetFlag(FLAGS_tls_key_file);
  const std::string client_ca = absl::GetFlag(FLAGS_tls_client_ca_file);
  if (cert.empty() != key.empty() || (!client_ca.empty() && cert.empty())) {
    LogError("--tls_cert_file and --tls_key_file go together, and --tls_client_ca_file needs them");
    return false;
  }
  for (const auto& [path, pem] :
       {std::pair{cert, &options->tls_cert_pem}, std::pair{key, &options->tls_key_pem},
        std::pair{client_ca, &options->tls_client_ca_pem}}) {
    if (path.empty()) continue;
    absl::StatusOr<std::string> contents = ReadFileToString(env, path);
    if (!contents.ok()) {
      LogError("%s", contents.status().ToString());
      return false;
    }
    *pem = *std::move(contents);
  }
  if (!key.empty()) WarnIfSecretReadableByOthers(env, "--tls_key_file", key);
  const std::string tokens = absl::GetFlag(FLAGS_auth_token_file);
  if (!tokens.empty()) {
    absl::StatusOr<std::string> contents = ReadFileToString(env, tokens);
    absl::StatusOr<AccessControl> access = contents.ok()
                                               ? AccessControl::FromTokenFileContents(*contents)
                                               : absl::StatusOr<AccessControl>(contents.status());
    if (!access.ok()) {
      LogError("--auth_token_file=%s: %s", tokens, access.status().ToString());
      return false;
    }
    options->access = *std::move(access);
    WarnIfSecretReadableByOthers(env, "--auth_token_file", tokens);
    if (options->tls_cert_pem.empty()) {
      LogWarning(
          "--auth_token_file without --tls_cert_file: tokens travel in plaintext; use TLS "
          "unless the network is private");
    }
  }
  return true;
}

// The program from the parsed flags to the end of the shutdown.
int Serve(const std::function<FileEnv*()>& file_env, ShutdownSignals& shutdown_signals) {
  ShardServerOptions options;
  options.shard_index = absl::GetFlag(FLAGS_shard_index);
  options.shard_count = absl::GetFlag(FLAGS_shard_count);
  if (options.shard_count == 0 || options.shard_index >= options.shard_count) {
    LogError("--shard_index=%d must be below --shard_count=%d", options.shard_index,
             options.shard_count);
    return 2;
  }
  absl::StatusOr<DeviceSelection> device =
      SelectShardDevice(absl::GetFlag(FLAGS_device), absl::GetFlag(FLAGS_device_fallback_to_cpu));
  if (!device.ok()) {
    // (The hint is for a device that is not usable, not a name that is wrong.)
    LogError("%s%s", device.status().ToString(),
             absl::IsInvalidArgument(device.status())
                 ? ""
                 : " (use --device=cpu, or --device_fallback_to_cpu)");
    return 2;
  }
  if (!device->note.empty()) {
    LogWarning("--device=%s: %s; updating on the CPU", absl::GetFlag(FLAGS_device), device->note);
  }
  LogInfo("model state and updates on %s", device->description);
  options.gpu_index = device->gpu_index;
  options.threads = absl::GetFlag(FLAGS_threads);
  if (options.threads < 0) {
    LogError("--threads=%d: give a count, or 0 for the number of CPUs", options.threads);
    return 2;
  }
  if (options.threads == 0) {
    options.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  const int pull_chunk_kib = absl::GetFlag(FLAGS_pull_chunk_kib);
  if (pull_chunk_kib < 1 || pull_chunk_kib > 32768) {
    LogError("--pull_chunk_kib=%d is not in [1, 32768]", pull_chunk_kib);
    return 2;
  }
  options.pull_chunk_bytes = static_cast<size_t>(pull_chunk_kib) << 10;
  const int64_t pipeline_range = absl::GetFlag(FLAGS_pipeline_range_elements);
  if (pipeline_range < 0) {
    LogError("--pipeline_range_elements=%d is negative", pipeline_range);
    return 2;
  }
  options.pipeline_range_elements = static_cast<uint64_t>(pipeline_range);
  options.step_timeline = absl::GetFlag(FLAGS_step_timeline);
  options.shared_memory = absl::GetFlag(FLAGS_shared_memory);
  options.payload_socket = absl::GetFlag(FLAGS_payload_socket);
  const int payload_port = absl::GetFlag(FLAGS_payload_socket_port);
  if (payload_port < 0 || payload_port > 65535) {
    LogError("--payload_socket_port=%d is not a TCP port", payload_port);
    return 2;
  }
  options.payload_socket_port = static_cast<uint16_t>(payload_port);
  options.device_pairs = absl::GetFlag(FLAGS_device_pairs);
  if (options.device_pairs != "off" && options.device_pairs != "nccl" &&
      options.device_pairs != "loopback") {
    LogError("--device_pairs=%s: one of nccl, loopback, off", options.device_pairs);
    return 2;
  }
  if (options.device_pairs == "nccl" && device->gpu_index < 0) {
    LogError("--device_pairs=nccl needs the models on a GPU (--device=%s chose the CPU)",
             absl::GetFlag(FLAGS_device));
    return 2;
  }
  if (options.device_pairs == "loopback" && device->gpu_index >= 0) {
    LogError("--device_pairs=loopback carries host memory; the models are on %s",
             device->description);
    return 2;
  }
  if (absl::GetFlag(FLAGS_stream_idle_timeout_s) < 0 || absl::GetFlag(FLAGS_max_threads) < 4) {
    LogError("--stream_idle_timeout_s=%d must be 0 (never) or more, --max_threads=%d at least 4",
             absl::GetFlag(FLAGS_stream_idle_timeout_s), absl::GetFlag(FLAGS_max_threads));
    return 2;
  }
  options.stream_idle_timeout = absl::Seconds(absl::GetFlag(FLAGS_stream_idle_timeout_s));
  options.max_threads = absl::GetFlag(FLAGS_max_threads);

  const uint64_t max_state_mib = absl::GetFlag(FLAGS_max_state_mib);
  if (max_state_mib > (~uint64_t{0} >> 20)) {
    LogError("--max_state_mib=%d is too large", max_state_mib);
    return 2;
  }
  options.max_state_bytes = max_state_mib << 20;
  if (options.max_state_bytes == 0 && device->gpu_index >= 0) {
    // The state lives in the GPU's memory; host RAM holds only small pinned
    // staging buffers.
    options.max_state_bytes = device->memory_bytes / 4 * 3;
  } else if (options.max_state_bytes == 0) {
    const uint64_t physical = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                              static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    options.max_state_bytes = physical / 4 * 3;
  }

  options.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  options.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  if (options.checkpoint_every < 0 ||
      (options.checkpoint_every > 0) != !options.checkpoint_dir.empty()) {
    LogError("--checkpoint_every (> 0) and --checkpoint_dir go together");
    return 2;
  }
  options.restore_from = absl::GetFlag(FLAGS_restore_from);
  if (const std::string p = absl::GetFlag(FLAGS_restore_partition); !p.empty()) {
    absl::StatusOr<Partition> partition = PartitionFromName(p);
    if (!partition.ok()) {
      LogError("--restore_partition: %s", std::string(partition.status().message()));
      return 2;
    }
    options.restore_partition = *partition;
  }
  options.checkpoint_keep = absl::GetFlag(FLAGS_checkpoint_keep);
  if (options.checkpoint_keep < 0 || options.checkpoint_keep == 1) {
    // With one, a shard that died while writing the newest could find its
    // peers have already removed the one it restarts from.
    LogError("--checkpoint_keep must be 0 (keep all) or at least 2");
    return 2;
  }
  FileEnv* const env = file_env ? file_env() : FileEnv::Default();
  options.file_env = env;
  if (!ReadSecurityFlags(env, &options)) return 2;
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.checkpoint_request_root = absl::GetFlag(FLAGS_checkpoint_request_root);
  if (!options.checkpoint_dir.empty()) {
    // Else each periodic checkpoint would fail, one log line each, while the
    // job trained on without a point to come back to.
    if (absl::Status s = CheckDirectoryWritable(env, options.checkpoint_dir); !s.ok()) {
      LogError("--checkpoint_dir=%s cannot hold checkpoints: %s", options.checkpoint_dir,
               s.ToString());
      return 2;
    }
  }
  // A port file left by an earlier run would read as this one's port until
  // this one writes its own.
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    if (absl::Status s = env->RemoveFile(port_file); !s.ok() && !absl::IsNotFound(s)) {
      LogError("cannot replace --port_file: %s", s.ToString());
      return 2;
    }
  }

  const std::string listen = absl::GetFlag(FLAGS_listen);
  absl::StatusOr<std::unique_ptr<ShardServer>> server = ShardServer::Start(listen, options);
  if (!server.ok()) {
    LogError("%s", server.status().ToString());
    return 1;
  }
  // (Listening from here: a signal now asks for the graceful shutdown.)
  shutdown_signals.MarkServing();
  if (!port_file.empty()) {
    if (absl::Status s = WriteFileAtomically(env, port_file, absl::StrCat((*server)->port(), "\n"));
        !s.ok()) {
      LogError("cannot write --port_file: %s", s.ToString());
      return 1;
    }
  }
  LogInfo(
      "shard %d of %d serving on port %d (%s, %s%s), device %s, %d CPU threads, "
      "state budget %d MiB%s",
      options.shard_index, options.shard_count, (*server)->port(), listen,
      options.tls_cert_pem.empty() ? "plaintext"
                                   : (options.tls_client_ca_pem.empty() ? "TLS" : "mutual TLS"),
      options.access.enabled() ? ", bearer tokens" : "",
      device->gpu_index < 0 ? "cpu" : absl::StrCat("cuda:", device->gpu_index), options.threads,
      options.max_state_bytes >> 20,
      (*server)->metrics_port() > 0 ? absl::StrCat(", metrics on port ", (*server)->metrics_port())
                                    : "");

  if (!options.access.enabled() && !OnlyThisMachineReaches(listen)) {
    LogWarning(
        "listening on %s without --auth_token_file: anyone who reaches it may train, "
        "roll back and write checkpoints%s",
        listen,
        options.checkpoint_request_root.empty()
            ? " anywhere this user can write (no --checkpoint_request_root)"
            : "");
  }

  const int signal_number = shutdown_signals.WaitForFirst();
  LogInfo("received %s; shutting down (another signal 1 s or more later ends the process at once)",
          strsignal(signal_number));
  (*server)->Shutdown(absl::Seconds(5));
  (*server)->Wait();
  LogInfo("stopped");
  return 0;
}

}  // namespace

int RunShardServer(int argc, char** argv, const std::function<FileEnv*()>& file_env) {
  absl::SetProgramUsageMessage("shardopt optimizer-shard server");
  absl::ParseCommandLine(argc, argv);
  SetLogTag(absl::StrCat("shardopt_server[", absl::GetFlag(FLAGS_shard_index), "]"));

  if (!TuneMallocForLargeMessages()) {
    LogWarning("glibc refused the malloc settings for large messages");
  }
  return RunWithShutdownSignals(
      [&](ShutdownSignals& shutdown_signals) { return Serve(file_env, shutdown_signals); });
}

}  // namespace shardopt
