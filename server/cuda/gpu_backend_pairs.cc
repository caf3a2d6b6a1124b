// GpuBackend's part of the device data plane (UpdateBackend::OwnStaging and
// co.): an NCCL pair receives a push straight into the trainer's device
// staging, a kernel checks it there, and pulls are read device to device
// into the pair's buffer.
#include <algorithm>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/cuda/gpu_backend.h"
#include "server/cuda/gradient_control.h"

namespace shardopt {

void* GpuBackend::OwnStaging(uint32_t rank, uint64_t offset, uint64_t count) {
  if (rank >= lanes_.size() || offset > size_ || count > size_ - offset) return nullptr;
  return staging(rank) + offset;
}

absl::StatusOr<UpdateBackend::StagedScan> GpuBackend::ScanStaged(
    uint32_t rank, uint64_t offset, uint64_t count, absl::Span<const FlatRange> must_be_zero) {
  if (OwnStaging(rank, offset, count) == nullptr) {
    return absl::OutOfRangeError(absl::StrCat("staged elements [", offset, ", ", offset + count,
                                              ") of trainer ", rank, " are outside the range"));
  }
  if (absl::Status s = gpu::SetCurrentDevice(device_index_); !s.ok()) return s;
  // found[0], found[1], then the spans relative to the scanned elements.
  std::vector<unsigned long long> host = {count, std::numeric_limits<unsigned long long>::max()};
  for (const FlatRange& span : must_be_zero) {
    if (span.begin < offset || span.end > offset + count) {
      return absl::OutOfRangeError(absl::StrCat("padding [", span.begin, ", ", span.end,
                                                ") lies outside the scanned elements"));
    }
    host.push_back(span.begin - offset);
    host.push_back(span.end - offset);
  }
  const size_t bytes = host.size() * sizeof(unsigned long long);
  absl::MutexLock lock(&scan_mu_);
  if (scan_buffer_.size() < bytes) {
    // Grown rarely (room for 4K padding spans, then doubling): the old
    // buffer's cudaFree waits for every kernel of the process, the pairs'
    // NCCL transfers in flight included.
    absl::StatusOr<gpu::DeviceBuffer> buffer =
        gpu::DeviceBuffer::Allocate(std::max({bytes, 2 * scan_buffer_.size(), size_t{64} << 10}));
    if (!buffer.ok()) return buffer.status();
    scan_buffer_ = *std::move(buffer);
  }
  auto* device = scan_buffer_.as<unsigned long long>();
  void* stream = lanes_[rank].stream.get();
  if (absl::Status s = gpu::CopyToDevice(device, host.data(), bytes, stream); !s.ok()) return s;
  if (absl::Status s = gpu::ScanReceived(staging(rank) + offset, count, device + 2,
                                         must_be_zero.size(), device, stream);
      !s.ok()) {
    return s;
  }
  unsigned long long found[2];
  if (absl::Status s = gpu::CopyToHost(found, device, sizeof(found), stream); !s.ok()) return s;
  if (absl::Status s = lanes_[rank].stream.Synchronize(); !s.ok()) return s;
  StagedScan scan;
  scan.first_non_finite = found[0];
  if (found[1] != std::numeric_limits<unsigned long long>::max()) {
    scan.first_nonzero = offset + found[1];
  }
  return scan;
}

absl::Status GpuBackend::ReadStaged(uint32_t rank, uint64_t offset, uint64_t count, float* out) {
  if (OwnStaging(rank, offset, count) == nullptr) {
    return absl::OutOfRangeError(absl::StrCat("staged elements [", offset, ", ", offset + count,
                                              ") of trainer ", rank, " are outside the range"));
  }
  if (absl::Status s = gpu::SetCurrentDevice(device_index_); !s.ok()) return s;
  return gpu::CopyToHost(out, staging(rank) + offset, count * sizeof(float));
}

absl::Status GpuBackend::ReadOwn(uint64_t offset, uint64_t count, float* own_out) {
  if (absl::Status s = gpu::SetCurrentDevice(device_index_); !s.ok()) return s;
  if (absl::Status s = CheckRange("elements", offset, count); !s.ok()) return s;
  // Waited for: the pair sends from `own_out` on a stream of its own, and the
  // caller's read lock must cover the copy.
  if (absl::Status s = gpu::CopyDeviceToDevice(own_out, params_.as<float>() + offset,
                                               count * sizeof(float), read_stream_.get());
      !s.ok()) {
    return s;
  }
  return read_stream_.Synchronize();
}

}  // namespace shardopt
