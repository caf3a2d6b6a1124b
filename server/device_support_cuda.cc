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
  std::vector<GpuMatrix> matrices;
  if (options.optimizer.kind == OptimizerKind::kMuon) {
    // The shard's tensors, as the CPU backend gets them (each whole).
    absl::StatusOr<std::vector<RangeTensor>> tensors =
        WholeTensorsOfShard(options.layout, options.shard_index);
    if (!tensors.ok()) return tensors.status();
    for (const RangeTensor& t : *tensors) {
      if (absl::Status s = CheckOptimizerFitsTensor(
              options.optimizer.kind, options.layout.tensors()[t.index].spec.name, t.shape);
          !s.ok()) {
        return s;
      }
      matrices.push_back(GpuMatrix{t.offset, static_cast<uint64_t>(t.shape[0]),
                                   static_cast<uint64_t>(t.shape[1])});
    }
  }
  std::vector<gpu::LambPiece> lamb_pieces;
  if (options.optimizer.kind == OptimizerKind::kLamb) {
    // LAMB also updates pieces of tensors, with norms from every shard (as
    // ModelShard::CpuBackendFactory gives them to the CPU backend).
    for (const RangeTensor& t : TensorPiecesOfShard(options.layout, options.shard_index)) {
      lamb_pieces.push_back(gpu::LambPiece{t.offset, t.size, t.index, t.whole, t.start});
    }
  }
  absl::StatusOr<std::unique_ptr<GpuBackend>> backend =
      GpuBackend::Create(gpu_index, options.optimizer, options.num_trainers, initial,
                         std::move(matrices), std::move(lamb_pieces));
  if (!backend.ok()) return backend.status();
  return std::unique_ptr<UpdateBackend>(std::move(*backend));
}

}  // namespace shardopt
