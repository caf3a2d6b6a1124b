#include "server/cuda/device.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/cuda/cuda_status.h"

namespace shardopt {
namespace gpu {
namespace {

cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

std::string GpuList(const std::vector<GpuInfo>& gpus) {
  return absl::StrJoin(gpus, "; ", [](std::string* out, const GpuInfo& g) {
    absl::StrAppend(out, g.DebugString());
  });
}

}  // namespace

std::string GpuInfo::DebugString() const {
  return absl::StrFormat("cuda:%d %s (sm_%d%d, %d SMs, %.1f GiB%s)", index, name,
                         compute_capability_major, compute_capability_minor, multiprocessors,
                         static_cast<double>(total_memory_bytes) / (1 << 30),
                         usable ? "" : ", not usable by this build");
}

absl::StatusOr<std::vector<GpuInfo>> QueryGpus() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    // Clear the error so that it does not surface at an unrelated later check.
    (void)cudaGetLastError();
    std::string why = err != cudaSuccess
                          ? absl::StrCat(cudaGetErrorName(err), " (", cudaGetErrorString(err), ")")
                          : std::string("the driver reports 0 GPUs");
    std::string hint;
    if (err == cudaErrorInsufficientDriver) {
      hint =
          "; no usable NVIDIA driver (libcuda.so.1) was found, or it is older than this "
          "build's CUDA runtime";
    } else if (err == cudaErrorNoDevice || count == 0) {
      hint = "; check CUDA_VISIBLE_DEVICES and nvidia-smi";
    }
    return absl::UnavailableError(absl::StrCat("no CUDA GPU available: ", why, hint));
  }
  std::vector<GpuInfo> gpus;
  gpus.reserve(count);
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop;
    SHARDOPT_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, i));
    GpuInfo g;
    g.index = i;
    g.name = prop.name;
    g.compute_capability_major = prop.major;
    g.compute_capability_minor = prop.minor;
    g.multiprocessors = prop.multiProcessorCount;
    g.total_memory_bytes = prop.totalGlobalMem;
    g.l2_cache_bytes = static_cast<size_t>(prop.l2CacheSize);
    char bus_id[32] = {0};
    if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), i) == cudaSuccess) {
      g.pci_bus_id = bus_id;
    } else {
      (void)cudaGetLastError();
    }
    g.usable = prop.major >= kMinComputeCapabilityMajor;
    gpus.push_back(std::move(g));
  }
  return gpus;
}

std::string DeviceSpec::ToString() const {
  switch (kind) {
    case Kind::kCpu:
      return "cpu";
    case Kind::kAuto:
      return "auto";
    case Kind::kCuda:
      return absl::StrCat("cuda:", index);
  }
  return "?";
}

absl::StatusOr<DeviceSpec> ParseDeviceSpec(absl::string_view text) {
  DeviceSpec spec;
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "cpu") {
    spec.kind = DeviceSpec::Kind::kCpu;
    return spec;
  }
  if (lower == "auto") {
    spec.kind = DeviceSpec::Kind::kAuto;
    return spec;
  }
  if (lower == "cuda") {
    spec.kind = DeviceSpec::Kind::kCuda;
    spec.index = 0;
    return spec;
  }
  const std::string prefix = "cuda:";
  if (lower.size() > prefix.size() && lower.compare(0, prefix.size(), prefix) == 0) {
    const std::string digits = lower.substr(prefix.size());
    bool all_digits = digits.size() <= 4;
    for (char c : digits) all_digits = all_digits && c >= '0' && c <= '9';
    int index = -1;
    if (all_digits && absl::SimpleAtoi(digits, &index) && index >= 0 && index <= 1023) {
      spec.kind = DeviceSpec::Kind::kCuda;
      spec.index = index;
      return spec;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "invalid device \"", text, "\": expected cpu, auto, cuda or cuda:N (N = 0, 1, ...)"));
}

absl::StatusOr<GpuInfo> SelectDevice(absl::string_view text) {
  absl::StatusOr<DeviceSpec> spec = ParseDeviceSpec(text);
  if (!spec.ok()) return spec.status();
  if (spec->kind == DeviceSpec::Kind::kCpu) {
    return absl::InvalidArgumentError("device \"cpu\" is not a GPU: nothing to select");
  }
  absl::StatusOr<std::vector<GpuInfo>> gpus = QueryGpus();
  if (!gpus.ok()) return gpus.status();
  const GpuInfo* chosen = nullptr;
  if (spec->kind == DeviceSpec::Kind::kAuto) {
    for (const GpuInfo& g : *gpus) {
      if (g.usable) {
        chosen = &g;
        break;
      }
    }
    if (chosen == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("no usable CUDA GPU: this build runs on compute capability ",
                       kMinComputeCapabilityMajor, ".0 and later; found: ", GpuList(*gpus)));
    }
  } else {
    if (spec->index >= static_cast<int>(gpus->size())) {
      return absl::NotFoundError(absl::StrCat("no GPU ", spec->ToString(), ": ", gpus->size(),
                                              " found: ", GpuList(*gpus)));
    }
    chosen = &(*gpus)[spec->index];
    if (!chosen->usable) {
      return absl::FailedPreconditionError(
          absl::StrCat(chosen->DebugString(), ": this build runs on compute capability ",
                       kMinComputeCapabilityMajor, ".0 and later (sm_90 code, compute_90 PTX)"));
    }
  }
  SHARDOPT_CUDA_RETURN_IF_ERROR(cudaSetDevice(chosen->index));
  // Creates the runtime context now, so that "device busy / prohibited" shows here.
  SHARDOPT_CUDA_RETURN_IF_ERROR(cudaFree(nullptr));
  return *chosen;
}

absl::Status SetCurrentDevice(int index) {
  SHARDOPT_CUDA_RETURN_IF_ERROR(cudaSetDevice(index));
  return absl::OkStatus();
}

absl::Status SynchronizeStream(void* stream) {
  SHARDOPT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(AsStream(stream)));
  return absl::OkStatus();
}

absl::Status CopyToDevice(void* device_dst, const void* host_src, size_t bytes, void* stream) {
  if (bytes == 0) return absl::OkStatus();
  SHARDOPT_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, AsStream(stream)));
  return absl::OkStatus();
}

absl::Status CopyToHost(void* host_dst, const void* device_src, size_t bytes, void* stream) {
  if (bytes == 0) return absl::OkStatus();
  SHARDOPT_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, AsStream(stream)));
  return absl::OkStatus();
}

absl::Status CopyDeviceToDevice(void* device_dst, const void* device_src, size_t bytes,
                                void* stream) {
  if (bytes == 0) return absl::OkStatus();
  SHARDOPT_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(device_dst, device_src, bytes, cudaMemcpyDeviceToDevice, AsStream(stream)));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// DeviceBuffer

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  if (bytes == 0) return DeviceBuffer();
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // An allocation failure is not sticky; clear it.
    return CudaStatus(err, absl::StrCat("cudaMalloc(", bytes, " bytes)"));
  }
  return DeviceBuffer(p, bytes);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { Reset(); }

void DeviceBuffer::Reset() {
  if (data_ != nullptr) (void)cudaFree(data_);
  data_ = nullptr;
  bytes_ = 0;
}

absl::Status DeviceBuffer::Upload(const void* host_src, size_t bytes, size_t offset) {
  if (offset > bytes_ || bytes > bytes_ - offset) {
    return absl::OutOfRangeError(
        absl::StrCat("Upload of ", bytes, " bytes at ", offset, " into a buffer of ", bytes_));
  }
  if (bytes == 0) return absl::OkStatus();
  SHARDOPT_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(static_cast<char*>(data_) + offset, host_src, bytes, cudaMemcpyHostToDevice));
  // From pageable memory cudaMemcpy may return once the data is staged, before
  // the DMA lands; work on a non-blocking stream would not wait for it.
  SHARDOPT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cudaStreamLegacy));
  return absl::OkStatus();
}

absl::Status DeviceBuffer::Download(void* host_dst, size_t bytes, size_t offset) const {
  if (offset > bytes_ || bytes > bytes_ - offset) {
    return absl::OutOfRangeError(
        absl::StrCat("Download of ", bytes, " bytes at ", offset, " from a buffer of ", bytes_));
  }
  if (bytes == 0) return absl::OkStatus();
  // Waits for the work of every stream (the kernels of non-blocking streams
  // included) before copying.
  SHARDOPT_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  SHARDOPT_CUDA_RETURN_IF_ERROR(cudaMemcpy(host_dst, static_cast<const char*>(data_) + offset,
                                           bytes, cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

absl::Status DeviceBuffer::Fill(uint8_t byte_value, size_t bytes, size_t offset) {
  if (offset > bytes_ || bytes > bytes_ - offset) {
    return absl::OutOfRangeError(
        absl::StrCat("Fill of ", bytes, " bytes at ", offset, " in a buffer of ", bytes_));
  }
  if (bytes == 0) return absl::OkStatus();
  SHARDOPT_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());  // as Download: after all streams
  SHARDOPT_CUDA_RETURN_IF_ERROR(cudaMemset(static_cast<char*>(data_) + offset, byte_value, bytes));
  SHARDOPT_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// PinnedBuffer

absl::StatusOr<PinnedBuffer> PinnedBuffer::Allocate(size_t bytes) {
  if (bytes == 0) return PinnedBuffer();
  void* p = nullptr;
  const cudaError_t err = cudaMallocHost(&p, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return CudaStatus(err, absl::StrCat("cudaMallocHost(", bytes, " bytes)"));
  }
  return PinnedBuffer(p, bytes);
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() { Reset(); }

void PinnedBuffer::Reset() {
  if (data_ != nullptr) (void)cudaFreeHost(data_);
  data_ = nullptr;
  bytes_ = 0;
}

// ---------------------------------------------------------------------------
// Stream

absl::StatusOr<Stream> Stream::Create() {
  cudaStream_t s = nullptr;
  SHARDOPT_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return Stream(static_cast<void*>(s));
}

Stream::Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    Reset();
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

Stream::~Stream() { Reset(); }

void Stream::Reset() {
  if (stream_ != nullptr) (void)cudaStreamDestroy(AsStream(stream_));
  stream_ = nullptr;
}

}  // namespace gpu
}  // namespace shardopt
