// GpuBackend's Muon: the matrices' scratch, and the step
// (server/optim/muon.cc's formulas; see gpu_backend.h).
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "server/cuda/fused_optimizers.h"
#include "server/cuda/gpu_backend.h"
#include "server/cuda/muon_kernels.h"
#include "server/optim/muon_workspace.h"

namespace shardopt {

absl::Status GpuBackend::AllocateMuonScratch() {
  MuonWorkspace workspace;
  for (const GpuMatrix& m : matrices_) workspace.Add(m.rows, m.cols);
  // (At least one element each: no zero-byte device allocations.)
  const uint64_t largest = std::max<uint64_t>(1, workspace.matrix_elements);
  const uint64_t largest_gram = std::max<uint64_t>(1, workspace.gram_elements);
  for (auto [buffer, elements] :
       {std::pair{&muon_x_, largest}, std::pair{&muon_y_, largest},
        std::pair{&muon_gram_, largest_gram}, std::pair{&muon_poly_, largest_gram}}) {
    absl::StatusOr<gpu::DeviceBuffer> made = gpu::DeviceBuffer::Allocate(elements * sizeof(float));
    if (!made.ok()) return made.status();
    *buffer = *std::move(made);
  }
  return absl::OkStatus();
}

absl::Status GpuBackend::RefuseRangesOfWholeTensors() const {
  if (cublas_ != nullptr) {
    return absl::FailedPreconditionError("muon updates whole matrices: no range calls");
  }
  if (lamb_ != nullptr) {
    return absl::FailedPreconditionError("lamb updates whole tensors: no range calls");
  }
  if (adafactor_ != nullptr) {
    return absl::FailedPreconditionError("adafactor updates whole tensors: no range calls");
  }
  return absl::OkStatus();
}

absl::Status GpuBackend::RefreshBf16CopyAndWait() {
  absl::MutexLock bf16_lock(&bf16_mu_);
  if (bf16_ready_.load()) {
    if (absl::Status s = gpu::ConvertToBf16(params_.as<float>(), params_bf16_.as<uint16_t>(), size_,
                                            apply_stream_.get());
        !s.ok()) {
      return s;
    }
  }
  return apply_stream_.Synchronize();
}

absl::Status GpuBackend::MuonStep(const OptimizerConfig& c) {
  if (absl::Status s = gpu::SetCurrentDevice(device_index_); !s.ok()) return s;
  void* const stream = apply_stream_.get();
  const float keep = static_cast<float>(1.0 - c.momentum);
  const float momentum = static_cast<float>(c.momentum);
  const float a = static_cast<float>(c.ns_a), b = static_cast<float>(c.ns_b),
              cc = static_cast<float>(c.ns_c);
  std::vector<double> block_sums;
  for (const GpuMatrix& matrix : matrices_) {
    const size_t rows = matrix.rows, cols = matrix.cols, size = rows * cols;
    if (size == 0) continue;
    // The update before orthogonalisation, laid out m x n with m <= n.
    const bool transpose = rows > cols;
    const size_t m = transpose ? cols : rows;
    const size_t n = transpose ? rows : cols;
    float* x = muon_x_.as<float>();
    float* y = muon_y_.as<float>();
    float* const gram = muon_gram_.as<float>();
    float* const poly = muon_poly_.as<float>();
    float* const params = params_.as<float>() + matrix.offset;
    if (absl::Status s =
            gpu::MuonMomentum(staging(0) + matrix.offset, slots_[0].as<float>() + matrix.offset, x,
                              rows, cols, keep, momentum, c.nesterov, transpose, stream);
        !s.ok()) {
      return s;
    }
    // Its norm in double, block sums added in order on the host (block_sums_
    // holds a block per kNormBlockElements of the range: enough).
    block_sums.resize((size + kNormBlockElements - 1) / kNormBlockElements);
    if (absl::Status s = BlockSumsToHost(x, size, 1.0f, 0, block_sums.data()); !s.ok()) return s;
    double squares = 0;
    for (double sum : block_sums) squares += sum;
    const float norm = std::max(static_cast<float>(std::sqrt(squares)), static_cast<float>(c.eps));
    if (absl::Status s = gpu::DivideInPlace(x, size, norm, stream); !s.ok()) return s;
    for (int k = 0; k < c.ns_steps; ++k) {
      // gram = X X^T; poly = b gram + c gram gram; y = a X + poly X.
      if (absl::Status s = cublas_->Sgemm(false, true, m, m, n, 1.0f, x, n, x, n, 0.0f, gram, m);
          !s.ok()) {
        return s;
      }
      if (absl::Status s = gpu::CopyDeviceToDevice(poly, gram, m * m * sizeof(float), stream);
          !s.ok()) {
        return s;
      }
      if (absl::Status s = cublas_->Sgemm(false, false, m, m, m, cc, gram, m, gram, m, b, poly, m);
          !s.ok()) {
        return s;
      }
      if (absl::Status s = gpu::CopyDeviceToDevice(y, x, size * sizeof(float), stream); !s.ok()) {
        return s;
      }
      if (absl::Status s = cublas_->Sgemm(false, false, m, n, m, 1.0f, poly, m, x, n, a, y, n);
          !s.ok()) {
        return s;
      }
      std::swap(x, y);
    }
    const double ratio = c.adjust_lr == MuonAdjustLr::kOriginal
                             ? std::sqrt(std::max(1.0, static_cast<double>(rows) / cols))
                             : 0.2 * std::sqrt(static_cast<double>(std::max(rows, cols)));
    const float decay = static_cast<float>(1.0 - c.lr * c.weight_decay);
    const float neg_lr = static_cast<float>(-c.lr * ratio);
    if (absl::Status s = gpu::MuonApply(params, x, rows, cols, transpose, decay, neg_lr, stream);
        !s.ok()) {
      return s;
    }
  }
  return RefreshBf16CopyAndWait();
}

}  // namespace shardopt
