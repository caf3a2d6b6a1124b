// DeviceTwins: during TrainerClient::StepOnDevice, which host buffers (the
// client's mirrors of a GPU trainer's gradient and parameters) have a twin
// in device memory, so that the device-pair transports send the gradient
// from the device and receive the parameters there, instead of through
// host memory (client/device_pair_transport.h).
//
// Contract: Set() before the step's calls, Clear() after; in between the
// gradient mirror holds exactly what its twin holds (the client copied it),
// so either may be sent. A pull received into a parameter twin is recorded
// (Written; every pull attempt first clears its range, Unwritten, so the
// last one wins), and the client copies every other part of the parameter
// mirror to the device after the step. Outside a step nothing has a twin
// (a replayed push from history goes through host memory). Thread-safe.
#ifndef SHARDOPT_CLIENT_DEVICE_TWINS_H_
#define SHARDOPT_CLIENT_DEVICE_TWINS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/layout.h"

namespace shardopt {

class DeviceTwins {
 public:
  void Set(const float* host_grads, const float* device_grads, float* host_params,
           float* device_params, size_t count) {
    absl::MutexLock lock(&mu_);
    host_grads_ = host_grads;
    device_grads_ = device_grads;
    host_params_ = host_params;
    device_params_ = device_params;
    count_ = count;
    written_.clear();
  }
  // The ranges of the parameters written on the device since Set().
  std::vector<FlatRange> Clear() {
    absl::MutexLock lock(&mu_);
    host_grads_ = nullptr;
    host_params_ = nullptr;
    count_ = 0;
    return std::move(written_);
  }
  // The device twin of `bytes` of the gradient mirror at `host`, or nullptr.
  const void* GradientTwin(const void* host, size_t bytes) {
    absl::MutexLock lock(&mu_);
    const std::optional<size_t> at = Within(host_grads_, host, bytes);
    return at ? reinterpret_cast<const char*>(device_grads_) + *at : nullptr;
  }
  // The device twin of `bytes` of the parameter mirror at `host`, or
  // nullptr; the caller that writes it calls Written with the same span.
  void* ParameterTwin(const void* host, size_t bytes) {
    absl::MutexLock lock(&mu_);
    const std::optional<size_t> at = Within(host_params_, host, bytes);
    return at ? reinterpret_cast<char*>(device_params_) + *at : nullptr;
  }
  void Written(const void* host, size_t bytes) {
    absl::MutexLock lock(&mu_);
    if (std::optional<size_t> at = Within(host_params_, host, bytes)) {
      written_.push_back(FlatRange{*at / sizeof(float), (*at + bytes) / sizeof(float)});
    }
  }
  // Before any pull of [host, host + bytes): what an earlier attempt wrote
  // on the device is no longer the range's newest (a later pull may land in
  // the host mirror).
  void Unwritten(const void* host, size_t bytes) {
    absl::MutexLock lock(&mu_);
    const std::optional<size_t> at = Within(host_params_, host, bytes);
    if (!at) return;
    const FlatRange range{*at / sizeof(float), (*at + bytes) / sizeof(float)};
    std::vector<FlatRange> kept;
    for (const FlatRange& w : written_) {
      // (Pulls cover whole shard ranges: written spans never straddle one.)
      if (w.end <= range.begin || w.begin >= range.end) kept.push_back(w);
    }
    written_.swap(kept);
  }
  // Pushes sent from a gradient twin and pulls received into a parameter
  // twin (what the pair transports count).
  void CountTransfer() { transfers_.fetch_add(1, std::memory_order_relaxed); }
  int64_t transfers() const { return transfers_.load(std::memory_order_relaxed); }

 private:
  // The byte offset of [host, host + bytes) within the buffer at `base`.
  std::optional<size_t> Within(const void* base, const void* host, size_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (base == nullptr) return std::nullopt;
    const auto b = reinterpret_cast<uintptr_t>(base);
    const auto h = reinterpret_cast<uintptr_t>(host);
    if (h < b || h - b > count_ * sizeof(float) || bytes > count_ * sizeof(float) - (h - b)) {
      return std::nullopt;
    }
    return static_cast<size_t>(h - b);
  }

  absl::Mutex mu_;
  const float* host_grads_ ABSL_GUARDED_BY(mu_) = nullptr;
  const float* device_grads_ ABSL_GUARDED_BY(mu_) = nullptr;
  float* host_params_ ABSL_GUARDED_BY(mu_) = nullptr;
  float* device_params_ ABSL_GUARDED_BY(mu_) = nullptr;
  size_t count_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<FlatRange> written_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> transfers_{0};
};

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_DEVICE_TWINS_H_
