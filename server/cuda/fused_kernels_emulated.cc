#include "server/cuda/fused_kernels_emulated.h"

#include <algorithm>
#include <atomic>

#include "server/cuda/fused_kernel_body.h"
#include "server/cuda/fused_kernels.h"

namespace shardopt {
namespace gpu {
namespace internal {
namespace {

std::atomic<size_t> grid_threads_override{0};

// Runs thread(tid, threads) for every thread of the simulated grid.
template <typename F>
cudaError_t RunGrid(size_t work_items, F thread) {
  constexpr size_t kBlock = kThreadsPerBlock;
  size_t threads = grid_threads_override.load();
  if (threads == 0) {
    const size_t resident = size_t{132} * 6 * kBlock;
    threads = std::min(resident, (work_items + kBlock - 1) / kBlock * kBlock);
  }
  threads = std::max(kBlock, (threads + kBlock - 1) / kBlock * kBlock);
  for (size_t tid = 0; tid < threads; ++tid) thread(tid, threads);
  return cudaSuccess;
}

template <bool kVec, bool kBf16>
cudaError_t Sgd(const SgdArgs& a) {
  return RunGrid(body::WorkItems(a.range), [&](size_t tid, size_t threads) {
    if (a.momentum_buffer != nullptr) {
      body::SgdThread<kVec, kBf16, true>(a, tid, threads);
    } else {
      body::SgdThread<kVec, kBf16, false>(a, tid, threads);
    }
  });
}

template <bool kVec, bool kBf16>
cudaError_t Adam(const AdamArgs& a) {
  return RunGrid(body::WorkItems(a.range), [&](size_t tid, size_t threads) {
    if (a.max_exp_avg_sq != nullptr) {
      body::AdamThread<kVec, kBf16, true>(a, tid, threads);
    } else {
      body::AdamThread<kVec, kBf16, false>(a, tid, threads);
    }
  });
}

template <bool kVec, bool kBf16>
cudaError_t Adagrad(const AdagradArgs& a) {
  return RunGrid(body::WorkItems(a.range), [&](size_t tid, size_t threads) {
    body::AdagradThread<kVec, kBf16>(a, tid, threads);
  });
}

template <bool kVec, bool kBf16>
cudaError_t Lion(const LionArgs& a) {
  return RunGrid(body::WorkItems(a.range), [&](size_t tid, size_t threads) {
    body::LionThread<kVec, kBf16>(a, tid, threads);
  });
}

}  // namespace

void SetEmulatedGridThreads(size_t threads) { grid_threads_override.store(threads); }

cudaError_t LaunchSgd(const SgdArgs& a, cudaStream_t) {
  const bool bf16 = a.params_bf16 != nullptr;
  if (a.range.vectorized) return bf16 ? Sgd<true, true>(a) : Sgd<true, false>(a);
  return bf16 ? Sgd<false, true>(a) : Sgd<false, false>(a);
}

cudaError_t LaunchAdam(const AdamArgs& a, cudaStream_t) {
  const bool bf16 = a.params_bf16 != nullptr;
  if (a.range.vectorized) return bf16 ? Adam<true, true>(a) : Adam<true, false>(a);
  return bf16 ? Adam<false, true>(a) : Adam<false, false>(a);
}

cudaError_t LaunchAdagrad(const AdagradArgs& a, cudaStream_t) {
  const bool bf16 = a.params_bf16 != nullptr;
  if (a.range.vectorized) return bf16 ? Adagrad<true, true>(a) : Adagrad<true, false>(a);
  return bf16 ? Adagrad<false, true>(a) : Adagrad<false, false>(a);
}

cudaError_t LaunchLion(const LionArgs& a, cudaStream_t) {
  const bool bf16 = a.params_bf16 != nullptr;
  if (a.range.vectorized) return bf16 ? Lion<true, true>(a) : Lion<true, false>(a);
  return bf16 ? Lion<false, true>(a) : Lion<false, false>(a);
}

cudaError_t LaunchConvertToBf16(const float* src, uint16_t* dst, const RangeArgs& range,
                                cudaStream_t) {
  return RunGrid(body::WorkItems(range), [&](size_t tid, size_t threads) {
    if (range.vectorized) {
      body::ConvertThread<true>(src, dst, range, tid, threads);
    } else {
      body::ConvertThread<false>(src, dst, range, tid, threads);
    }
  });
}

cudaError_t LaunchFill(float* dst, float value, size_t n, cudaStream_t) {
  return RunGrid(
      n, [&](size_t tid, size_t threads) { body::FillThread(dst, value, n, tid, threads); });
}

}  // namespace internal
}  // namespace gpu
}  // namespace shardopt
