// device_pair_bench: the device data plane against the gRPC stream and the
// payload socket, side by side in one run. A shard server runs as a child
// process (`--server`, with `--device` and `--device_pairs=<kind>`; its own
// NCCL_HOSTID, so that NCCL takes the two processes on one GPU for two
// hosts); this process is one trainer. Each round times push + SGD update +
// pull of one fp32 tensor of each size on each plane, in turn; the table
// gives medians over the rounds and GB/s of push and pull bytes together.
//
//   device_pair_bench --server=PATH --device=cuda:0 --kind=nccl
//   device_pair_bench --server=PATH --device=cpu --kind=loopback
//
// The trainer's buffers are host memory by default: over NCCL they go
// through each pair's device buffer (one host-device copy each way on the
// trainer's side), as a CPU trainer of a GPU shard does. With
// --device_buffers they are in the pairs' memory, as a GPU trainer's: the
// pairs plane sends and receives them in place (StepOnDevice), the others
// copy them to and from the host around each step.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/trainer_client.h"
#include "common/device_pair.h"
#include "common/layout.h"
#include "common/nccl/loopback_environment.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/workload.h"

ABSL_FLAG(std::string, server, "", "The shardopt_server binary.");
ABSL_FLAG(std::string, device, "cpu", "The server's --device.");
ABSL_FLAG(std::string, kind, "loopback", "The device pairs' kind: nccl or loopback.");
ABSL_FLAG(int, gpu, 0, "This trainer's CUDA device for NCCL pairs.");
ABSL_FLAG(std::vector<std::string>, sizes_mib, std::vector<std::string>({"64", "256"}),
          "Tensor sizes in MiB.");
ABSL_FLAG(int, rounds, 3, "Interleaved rounds.");
ABSL_FLAG(double, seconds_per_case, 2.0, "Timed seconds per plane and size in each round.");
ABSL_FLAG(bool, device_buffers, false,
          "The trainer's gradient and parameters in the pairs' memory (a GPU's for nccl), as a "
          "GPU trainer's: the pairs plane steps with StepOnDevice, the others copy the gradient "
          "to the host before the step and the parameters back after it (timed too).");

extern char** environ;

namespace shardopt::bench {
namespace {

// The server as a child process; stopped (SIGTERM, then SIGKILL) on exit.
class ServerChild {
 public:
  static absl::StatusOr<std::unique_ptr<ServerChild>> Start() {
    char dir_template[] = "/tmp/device_pair_bench.XXXXXX";
    if (mkdtemp(dir_template) == nullptr) return absl::InternalError("mkdtemp failed");
    const std::string port_file = absl::StrCat(dir_template, "/port");
    std::vector<std::string> args = {absl::GetFlag(FLAGS_server),
                                     "--listen=127.0.0.1:0",
                                     "--port_file=" + port_file,
                                     "--device=" + absl::GetFlag(FLAGS_device),
                                     "--device_pairs=" + absl::GetFlag(FLAGS_kind),
                                     "--noshared_memory"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // (Its own NCCL host; this process sets its own before any NCCL call.)
    nccl::UseNcclOverLoopback();
    setenv("NCCL_HOSTID", "device-pair-bench-shard", 1);
    pid_t pid = 0;
    const int spawned = posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ);
    setenv("NCCL_HOSTID", "device-pair-bench-trainer", 1);
    if (spawned != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot start ", args[0], ": ", std::strerror(spawned)));
    }
    auto child = std::unique_ptr<ServerChild>(new ServerChild(pid));
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    for (;;) {
      std::ifstream in(port_file);
      std::string port;
      if (in >> port && !port.empty()) {
        child->address_ = absl::StrCat("127.0.0.1:", port);
        return child;
      }
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        child->pid_ = -1;
        return absl::FailedPreconditionError("the server exited at start (see its log above)");
      }
      if (absl::Now() > give_up) return absl::DeadlineExceededError("the server did not start");
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  ~ServerChild() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    for (int i = 0; i < 100 && waitpid(pid_, nullptr, WNOHANG) == 0; ++i) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  const std::string& address() const { return address_; }

 private:
  explicit ServerChild(pid_t pid) : pid_(pid) {}
  pid_t pid_;
  std::string address_;
};

struct Plane {
  const char* name;
  bool socket;
  bool pairs;
};
constexpr Plane kPlanes[] = {
    {"grpc", false, false}, {"socket", true, false}, {"pairs", false, true}};

// Seconds per step of `mib` on `plane` (a warm-up step first); checks the
// plane carried every transfer.
absl::StatusOr<std::vector<double>> TimePlane(const std::string& address, int mib,
                                              const Plane& plane, int round) {
  TrainerClientOptions options;
  options.shared_memory = false;
  options.socket_payloads = plane.socket;
  options.device_pairs = plane.pairs ? absl::GetFlag(FLAGS_kind) : "off";
  options.device_pair_gpu = absl::GetFlag(FLAGS_gpu);
  absl::StatusOr<std::unique_ptr<TrainerClient>> client =
      TrainerClient::Connect({address}, options);
  if (!client.ok()) return client.status();
  ModelSpec spec;
  spec.model_id = absl::StrCat("bench_", mib, "_", plane.name, "_", round);
  const int64_t elements = static_cast<int64_t>(mib) * (kMiB / sizeof(float));
  spec.tensors = {TensorSpec{"w", {elements}, DType::kFloat32}};
  spec.optimizer = BenchSgd();
  spec.num_trainers = 1;
  absl::StatusOr<ModelLayout> layout = ModelLayout::Create(spec.tensors, spec.alignment, 1);
  if (!layout.ok()) return layout.status();
  std::vector<float> params(layout->total_elements()), grads(layout->total_elements());
  FillParams(params);
  FillGradients(grads);
  if (absl::Status s = (*client)->Register(spec, params); !s.ok()) return s;
  // A GPU trainer's buffers, when asked for: in the pairs' memory.
  const bool on_device = absl::GetFlag(FLAGS_device_buffers);
  const int gpu = absl::GetFlag(FLAGS_gpu);
  const size_t bytes = grads.size() * sizeof(float);
  absl::StatusOr<const DevicePairKind*> kind = FindDevicePairKind(absl::GetFlag(FLAGS_kind));
  if (!kind.ok()) return kind.status();
  std::shared_ptr<void> device_grads, device_params;
  if (on_device) {
    absl::StatusOr<std::shared_ptr<void>> g = (*kind)->Allocate(gpu, bytes);
    absl::StatusOr<std::shared_ptr<void>> p = (*kind)->Allocate(gpu, bytes);
    if (!g.ok()) return g.status();
    if (!p.ok()) return p.status();
    device_grads = *g;
    device_params = *p;
    if (absl::Status s = (*kind)->CopyFromHost(gpu, device_grads.get(), grads.data(), bytes);
        !s.ok()) {
      return s;
    }
  }
  int64_t step = 0;
  absl::Status failed;
  const auto note = [&](absl::Status s) {
    if (!s.ok() && failed.ok()) failed = s;
  };
  const auto one = [&] {
    if (!on_device) {
      note((*client)->Step(++step, grads, absl::MakeSpan(params)).status());
    } else if (plane.pairs) {
      note((*client)
               ->StepOnDevice(++step, static_cast<const float*>(device_grads.get()),
                              static_cast<float*>(device_params.get()))
               .status());
    } else {
      note((*kind)->CopyToHost(gpu, grads.data(), device_grads.get(), bytes));
      note((*client)->Step(++step, grads, absl::MakeSpan(params)).status());
      note((*kind)->CopyFromHost(gpu, device_params.get(), params.data(), bytes));
    }
  };
  one();
  std::vector<double> times = TimeRepeated(absl::GetFlag(FLAGS_seconds_per_case), 3, 1000, one);
  if (!failed.ok()) return failed;
  const int64_t carried = plane.pairs    ? (*client)->device_pair_transfers()
                          : plane.socket ? (*client)->socket_transfers()
                                         : 0;
  if ((plane.pairs || plane.socket) && carried < 2 * step) {
    return absl::InternalError(
        absl::StrCat("only ", carried, " of ", 2 * step, " transfers went over the ", plane.name));
  }
  if (on_device && plane.pairs && (*client)->device_buffer_transfers() < 2 * step) {
    return absl::InternalError(absl::StrCat("only ", (*client)->device_buffer_transfers(), " of ",
                                            2 * step,
                                            " transfers moved from or into the device "
                                            "buffers themselves"));
  }
  return times;
}

int Run() {
  if (absl::GetFlag(FLAGS_server).empty()) {
    std::fprintf(stderr, "--server names no shardopt_server\n");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<ServerChild>> server = ServerChild::Start();
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return 1;
  }
  std::vector<int> sizes;
  for (const std::string& s : absl::GetFlag(FLAGS_sizes_mib)) sizes.push_back(std::stoi(s));
  absl::PrintF(
      "device pairs (%s) vs gRPC streams vs payload sockets: push + SGD update + pull,\n"
      "1 trainer (this process, %s buffers), 1 shard (--device=%s, its own process),\n"
      "%d interleaved rounds; GB/s counts push and pull bytes\n",
      absl::GetFlag(FLAGS_kind), absl::GetFlag(FLAGS_device_buffers) ? "device" : "host",
      absl::GetFlag(FLAGS_device), absl::GetFlag(FLAGS_rounds));
  Table table({"size", "plane", "steps", "median ms", "min ms", "GB/s", "vs grpc"});
  for (int mib : sizes) {
    std::vector<std::vector<double>> per_plane(std::size(kPlanes));
    for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
      for (size_t p = 0; p < std::size(kPlanes); ++p) {
        absl::StatusOr<std::vector<double>> t =
            TimePlane((*server)->address(), mib, kPlanes[p], round);
        if (!t.ok()) {
          std::fprintf(stderr, "%d MiB, %s: %s\n", mib, kPlanes[p].name,
                       t.status().ToString().c_str());
          return 1;
        }
        per_plane[p].insert(per_plane[p].end(), t->begin(), t->end());
      }
    }
    const double grpc = Median(per_plane[0]);
    for (size_t p = 0; p < std::size(kPlanes); ++p) {
      const double median = Median(per_plane[p]);
      const double gbps = 2.0 * mib * kMiB / median / 1e9;
      table.AddRow({absl::StrCat(mib, " MiB"), kPlanes[p].name, absl::StrCat(per_plane[p].size()),
                    Fixed(median * 1e3, 2), Fixed(Min(per_plane[p]) * 1e3, 2), Fixed(gbps, 3),
                    Fixed(grpc / median, 2) + "x"});
    }
  }
  table.Print();
  return 0;
}

}  // namespace
}  // namespace shardopt::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return shardopt::bench::Run();
}
