// device_support.h for builds with CUDA.
#include "absl/strings/str_cat.h"
#include "server/cuda/device.h"
#include "server/cuda/gpu_backend.h"
#include "server/device_support.h"
#include "server/optim/optimizer.h"

namespace shardopt {

absl::StatusOr<DeviceSelection> SelectShardDevice(absl::string_view device, bool fallback_to_cpu) {
  absl::StatusOr<gpu::DeviceSpec> spec = gpu::ParseDeviceSpec(device);
  if (!spec.ok()) return spec.status();
  DeviceSelection cpu{-1, "cpu", ""};
  if (spec->kind == gpu::DeviceSpec::Kind::kCpu) return cpu;
  absl::StatusOr<gpu::GpuInfo> gpu = gpu::SelectDevice(device);
  if (gpu.ok()) return DeviceSelection{gpu->index, gpu->DebugString(), "", gpu->total_memory_bytes};
  if (spec->kind == gpu::DeviceSpec::Kind::kAuto) {
    cpu.note = absl::StrCat("no usable GPU: ", gpu.status().message());
    return cpu;
  }
  if (!fallback_to_cpu) {
    return absl::Status(gpu.status().code(),
                        absl::StrCat("--device=", device, ": ", gpu.status().message()));
  }
  cpu.note = absl::StrCat("--device=", device, " is not usable (", gpu.status().message(),
                          "); falling back to the CPU as asked");
  return cpu;
}

absl::StatusOr<std::unique_ptr<UpdateBackend>> MakeGpuBackend(int gpu_index,
                                                              const ModelShardOptions& options,
                                                              const std::vector<float>& initial) {
  // The shard's tensors, as ModelShard::CpuBackendFactory gives them to the
  // CPU backend: LAMB's pieces (whole, or on the flat partition pieces,
  // updated with norms from every shard), the other whole-tensor
  // optimizers' whole tensors.
  std::vector<RangeTensor> tensors;
  if (options.optimizer.kind == OptimizerKind::kLamb) {
    tensors = TensorPiecesOfShard(options.layout, options.shard_index);
  } else if (NeedsWholeTensors(options.optimizer.kind)) {
    absl::StatusOr<std::vector<RangeTensor>> whole =
        WholeTensorsOfShard(options.layout, options.shard_index);
    if (!whole.ok()) return whole.status();
    for (const RangeTensor& t : *whole) {
      if (absl::Status s = CheckOptimizerFitsTensor(
              options.optimizer.kind, options.layout.tensors()[t.index].spec.name, t.shape);
          !s.ok()) {
        return s;
      }
    }
    tensors = *std::move(whole);
  }
  absl::StatusOr<std::unique_ptr<GpuBackend>> backend = GpuBackend::Create(
      gpu_index, options.optimizer, options.num_trainers, initial, std::move(tensors));
  if (!backend.ok()) return backend.status();
  return std::unique_ptr<UpdateBackend>(std::move(*backend));
}

}  // namespace shardopt
