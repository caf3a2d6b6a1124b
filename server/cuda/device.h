// GPU discovery, device selection and device / pinned host memory.
//
// Plain C++: no CUDA types (streams are `void*`, i.e. a cudaStream_t; nullptr
// is the legacy default stream). Everything that can fail returns
// absl::Status; nothing here aborts.
//
// Device selection is what `--device=auto|cpu|cuda:N` needs:
//   ParseDeviceSpec("cpu" | "auto" | "cuda" | "cuda:N")  -- syntax only, no CUDA call.
//   SelectDevice("auto")    the first usable GPU (see GpuInfo::usable), made
//                           current for the calling thread; UNAVAILABLE with
//                           the reason when there is none (no driver, no GPU,
//                           only GPUs this build has no code for), so that a
//                           server can fall back to the CPU.
//   SelectDevice("cuda:N")  exactly GPU N: NOT_FOUND when there is no such
//                           GPU, FAILED_PRECONDITION when it is not usable,
//                           UNAVAILABLE when there is no driver or no GPU.
// cudaSetDevice is per host thread: threads that launch work must select the
// device themselves (SetCurrentDevice).
#ifndef SHARDOPT_SERVER_CUDA_DEVICE_H_
#define SHARDOPT_SERVER_CUDA_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardopt {
namespace gpu {

// This build carries sm_90 machine code and compute_90 PTX: it runs on
// compute capability 9.0 (H100, H200) and, through the driver's PTX JIT, on
// later GPUs; not on earlier ones.
inline constexpr int kMinComputeCapabilityMajor = 9;

struct GpuInfo {
  int index = -1;  // CUDA device ordinal: "cuda:<index>".
  std::string name;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  int multiprocessors = 0;
  size_t total_memory_bytes = 0;
  size_t l2_cache_bytes = 0;
  std::string pci_bus_id;
  bool usable = false;              // compute capability >= kMinComputeCapabilityMajor.0.
  std::string DebugString() const;  // "cuda:0 NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)"
};

// Every GPU the CUDA runtime sees. UNAVAILABLE (with CUDA's reason and a hint)
// when no driver is loaded or there is no GPU; an empty vector never.
absl::StatusOr<std::vector<GpuInfo>> QueryGpus();

struct DeviceSpec {
  enum class Kind { kCpu, kAuto, kCuda };
  Kind kind = Kind::kAuto;
  int index = -1;                // kCuda only; "cuda" alone is cuda:0.
  std::string ToString() const;  // "cpu", "auto", "cuda:3".
};

// INVALID_ARGUMENT for anything but "cpu", "auto", "cuda", "cuda:N" (N a
// decimal number without sign, at most 1023).
absl::StatusOr<DeviceSpec> ParseDeviceSpec(absl::string_view text);

// "auto" / "cuda" / "cuda:N" as described at the top; "cpu" is
// INVALID_ARGUMENT (no GPU to select). On success the GPU is the calling
// thread's current device and its runtime context is initialised.
absl::StatusOr<GpuInfo> SelectDevice(absl::string_view spec);

// cudaSetDevice for the calling thread.
absl::Status SetCurrentDevice(int index);

// Waits for the work queued on `stream` (nullptr: the legacy default stream)
// and returns any error it raised, kernel faults included.
absl::Status SynchronizeStream(void* stream = nullptr);

// cudaMemcpyAsync on `stream`; for host memory that is not pinned the copy is
// synchronous with respect to the host. Pinned memory (PinnedBuffer) makes
// it asynchronous: keep the buffers alive until the stream is synchronised.
absl::Status CopyToDevice(void* device_dst, const void* host_src, size_t bytes,
                          void* stream = nullptr);
absl::Status CopyToHost(void* host_dst, const void* device_src, size_t bytes,
                        void* stream = nullptr);
absl::Status CopyDeviceToDevice(void* device_dst, const void* device_src, size_t bytes,
                                void* stream = nullptr);

// A RAII owner of device memory (cudaMalloc / cudaFree). Move-only. The
// memory is uninitialised. cudaMalloc returns 256-byte-aligned memory.
class DeviceBuffer {
 public:
  // On the calling thread's current device. RESOURCE_EXHAUSTED when it does
  // not fit. 0 bytes gives an empty buffer (data() == nullptr).
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes);

  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

  // Synchronous copies of [offset, offset + bytes) of this buffer, complete
  // on return (Download first waits for all work on the device, Upload for
  // its own DMA); OUT_OF_RANGE if that is not inside the buffer.
  absl::Status Upload(const void* host_src, size_t bytes, size_t offset = 0);
  absl::Status Download(void* host_dst, size_t bytes, size_t offset = 0) const;
  // cudaMemset of [offset, offset + bytes) to `byte_value`, after all work on
  // the device and complete on return.
  absl::Status Fill(uint8_t byte_value, size_t bytes, size_t offset = 0);

  // Frees now (errors are ignored: there is nothing a caller could do).
  void Reset();

 private:
  DeviceBuffer(void* data, size_t bytes) : data_(data), bytes_(bytes) {}
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// A RAII owner of page-locked host memory (cudaMallocHost / cudaFreeHost),
// for asynchronous copies. Move-only, uninitialised.
class PinnedBuffer {
 public:
  static absl::StatusOr<PinnedBuffer> Allocate(size_t bytes);

  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  void Reset();

 private:
  PinnedBuffer(void* data, size_t bytes) : data_(data), bytes_(bytes) {}
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// A RAII CUDA stream (cudaStreamCreateWithFlags(cudaStreamNonBlocking)).
class Stream {
 public:
  static absl::StatusOr<Stream> Create();
  Stream() = default;
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  void* get() const { return stream_; }  // A cudaStream_t.
  absl::Status Synchronize() const { return SynchronizeStream(stream_); }
  void Reset();

 private:
  explicit Stream(void* stream) : stream_(stream) {}
  void* stream_ = nullptr;
};

}  // namespace gpu
}  // namespace shardopt

#endif  // SHARDOPT_SERVER_CUDA_DEVICE_H_
