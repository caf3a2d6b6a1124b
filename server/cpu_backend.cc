#include "server/cpu_backend.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/dtype_convert.h"

namespace shardopt {

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(const OptimizerConfig& optimizer,
                                                               uint32_t num_trainers,
                                                               std::vector<float> initial_params,
                                                               ThreadPool* pool,
                                                               std::vector<RangeTensor> tensors) {
  if (absl::Status s = CheckTrustTensorOrder(optimizer.kind, tensors); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<Optimizer>> opt =
      Optimizer::Create(optimizer, initial_params.size(), std::move(tensors));
  if (!opt.ok()) return opt.status();
  return std::unique_ptr<CpuBackend>(
      new CpuBackend(std::move(initial_params), std::move(*opt), num_trainers, pool));
}

CpuBackend::CpuBackend(std::vector<float> params, std::unique_ptr<Optimizer> optimizer,
                       uint32_t num_trainers, ThreadPool* pool)
    : pool_(pool),
      params_(std::move(params)),
      optimizer_(std::move(optimizer)),
      staging_(num_trainers, std::vector<float>(params_.size())) {
  if (!optimizer_->measures_trust()) return;
  const std::vector<RangeTensor>& pieces = optimizer_->tensors();
  for (size_t i = 0; i < pieces.size(); ++i) {
    const uint64_t end = pieces[i].offset + pieces[i].size;
    for (uint64_t begin = pieces[i].offset; begin < end; begin += kTrustPartElements) {
      trust_parts_.push_back(TrustPart{i, begin, std::min(end, begin + kTrustPartElements)});
    }
  }
}

absl::StatusOr<size_t> CpuBackend::Stage(uint32_t rank, uint64_t offset, const void* data,
                                         DType dtype, size_t count) {
  return ConvertToFloatAndFindNonFinite(data, count, dtype, staging_[rank].data() + offset);
}

float* CpuBackend::HostStaging(uint32_t rank, uint64_t offset, uint64_t count) {
  if (rank >= staging_.size() || offset > params_.size() || count > params_.size() - offset) {
    return nullptr;
  }
  return staging_[rank].data() + offset;
}

absl::Status CpuBackend::CheckRange(uint64_t begin, uint64_t end) const {
  return CheckRangeElements(begin, end, params_.size());
}

absl::Status CpuBackend::CheckWholeRange(uint64_t begin, uint64_t end) const {
  if (begin != 0 || end != params_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        OptimizerKindName(optimizer_->config().kind), " updates whole tensors: elements [", begin,
        ", ", end, ") are not the whole range of ", params_.size()));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::CheckOwnNormsSuffice() const {
  if (!optimizer_->needs_trust_norms()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "lamb on the flat partition updates with tensor norms from every shard (the step's "
      "decision), not from this shard's pieces alone");
}

absl::Status CpuBackend::UpdateWholeTensors(int64_t step, const float* gradient) {
  if (absl::Status s = CheckOwnNormsSuffice(); !s.ok()) return s;
  if (optimizer_->measures_trust()) {
    const std::vector<TrustPartial> own = MeasureParts(step, gradient, 1.0f);
    std::vector<TensorNorms> norms;
    for (const TrustPartial& p : own) {
      if (norms.size() <= p.tensor_index) norms.resize(p.tensor_index + 1);
      norms[p.tensor_index] = {p.weight_squares.Rounded(), p.update_squares.Rounded()};
    }
    UpdateParts(step, gradient, norms);
    return absl::OkStatus();
  }
  float* const params = params_.data();
  pool_->ParallelFor(optimizer_->tensors().size(), 1, [&](size_t begin, size_t end) {
    for (size_t t = begin; t < end; ++t) optimizer_->UpdateTensor(step, params, gradient, t);
  });
  return absl::OkStatus();
}

std::vector<TrustPartial> CpuBackend::MeasureParts(int64_t step, const float* gradient,
                                                   float multiplier) {
  const std::vector<RangeTensor>& pieces = optimizer_->tensors();
  std::vector<TrustPartial> of_part(trust_parts_.size());
  const float* const params = params_.data();
  pool_->ParallelFor(trust_parts_.size(), 1, [&](size_t begin, size_t end) {
    for (size_t k = begin; k < end; ++k) {
      const TrustPart& part = trust_parts_[k];
      optimizer_->MeasureTrust(step, params, gradient, multiplier, part.piece, part.begin, part.end,
                               &of_part[k]);
    }
  });
  // (Exact sums: merging in any grouping gives the same bits.)
  std::vector<TrustPartial> of_piece(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    of_piece[i].tensor_index = pieces[i].index;
    of_piece[i].whole_tensor = pieces[i].whole;
  }
  for (size_t k = 0; k < trust_parts_.size(); ++k) {
    TrustPartial& into = of_piece[trust_parts_[k].piece];
    into.weight_squares.Add(of_part[k].weight_squares);
    into.update_squares.Add(of_part[k].update_squares);
  }
  return of_piece;
}

void CpuBackend::UpdateParts(int64_t step, const float* gradient,
                             absl::Span<const TensorNorms> norms) {
  const std::vector<RangeTensor>& pieces = optimizer_->tensors();
  float* const params = params_.data();
  pool_->ParallelFor(trust_parts_.size(), 1, [&](size_t begin, size_t end) {
    for (size_t k = begin; k < end; ++k) {
      const TrustPart& part = trust_parts_[k];
      optimizer_->UpdateWithTrust(step, params, gradient, part.piece, part.begin, part.end,
                                  norms[pieces[part.piece].index]);
    }
  });
}

void CpuBackend::MultiplyGradient(float multiplier, uint32_t rank) {
  if (multiplier == 1.0f) return;
  float* const g = staging_[rank].data();
  pool_->ParallelFor(params_.size(), kGrainElements, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) g[i] *= multiplier;
  });
}

absl::StatusOr<std::vector<TrustPartial>> CpuBackend::MeasureTrust(int64_t step,
                                                                   const OptimizerConfig& config,
                                                                   float multiplier) {
  if (!optimizer_->measures_trust()) {
    return absl::UnimplementedError(
        absl::StrCat(OptimizerKindName(optimizer_->config().kind), " has no trust ratio"));
  }
  if (absl::Status s = optimizer_->SetConfig(config); !s.ok()) return s;
  return MeasureParts(step, staging_[0].data(), multiplier);
}

absl::Status CpuBackend::UpdateWithTrust(int64_t step, const OptimizerConfig& config,
                                         float multiplier, absl::Span<const TensorNorms> norms) {
  if (!optimizer_->measures_trust()) {
    return absl::UnimplementedError(
        absl::StrCat(OptimizerKindName(optimizer_->config().kind), " has no trust ratio"));
  }
  for (const RangeTensor& piece : optimizer_->tensors()) {
    if (piece.index >= norms.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("no norms for tensor ", piece.index, " (", norms.size(), " given)"));
    }
  }
  if (absl::Status s = optimizer_->SetConfig(config); !s.ok()) return s;
  MultiplyGradient(multiplier);
  UpdateParts(step, staging_[0].data(), norms);
  return absl::OkStatus();
}

absl::Status CpuBackend::Apply(int64_t step, bool mean, const OptimizerConfig& config) {
  return ApplyRange(step, mean, config, 0, params_.size());
}

absl::Status CpuBackend::ApplyRange(int64_t step, bool mean, const OptimizerConfig& config,
                                    uint64_t first, uint64_t last) {
  if (absl::Status s = CheckRange(first, last); !s.ok()) return s;
  if (absl::Status s = optimizer_->SetConfig(config); !s.ok()) return s;
  if (optimizer_->needs_whole_tensors()) {
    if (absl::Status s = CheckWholeRange(first, last); !s.ok()) return s;
    if (absl::Status s = CheckOwnNormsSuffice(); !s.ok()) return s;
    if (absl::Status s = ReduceRange(mean, first, last); !s.ok()) return s;
    return UpdateWholeTensors(step, staging_[0].data());
  }
  const size_t trainers = staging_.size();
  const bool divide = mean && trainers > 1;
  const float divisor = static_cast<float>(trainers);
  float* const sum = staging_[0].data();
  float* const params = params_.data();
  pool_->ParallelFor(last - first, kGrainElements, [&](size_t begin, size_t end) {
    begin += first;
    end += first;
    for (size_t block = begin; block < end; block += kBlockElements) {
      const size_t block_end = std::min(end, block + kBlockElements);
      for (size_t t = 1; t < trainers; ++t) {
        const float* __restrict other = staging_[t].data();
        for (size_t i = block; i < block_end; ++i) sum[i] += other[i];
      }
      if (divide) {
        for (size_t i = block; i < block_end; ++i) sum[i] /= divisor;
      }
      optimizer_->Update(step, params, sum, block, block_end);
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::ApplyOneRange(uint32_t rank, int64_t step, const OptimizerConfig& config,
                                       float multiplier, uint64_t first, uint64_t last) {
  if (rank >= staging_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("no staging for trainer ", rank));
  }
  if (absl::Status s = CheckRange(first, last); !s.ok()) return s;
  if (absl::Status s = optimizer_->SetConfig(config); !s.ok()) return s;
  float* const gradient = staging_[rank].data();
  if (optimizer_->needs_whole_tensors()) {
    if (absl::Status s = CheckWholeRange(first, last); !s.ok()) return s;
    MultiplyGradient(multiplier, rank);
    return UpdateWholeTensors(step, gradient);
  }
  UpdateBlocks(step, gradient, multiplier, first, last);
  return absl::OkStatus();
}

void CpuBackend::UpdateBlocks(int64_t step, float* gradient, float multiplier, uint64_t first,
                              uint64_t last) {
  float* const params = params_.data();
  pool_->ParallelFor(last - first, kGrainElements, [&](size_t begin, size_t end) {
    begin += first;
    end += first;
    for (size_t block = begin; block < end; block += kBlockElements) {
      const size_t block_end = std::min(end, block + kBlockElements);
      if (multiplier != 1.0f) {
        for (size_t i = block; i < block_end; ++i) gradient[i] *= multiplier;
      }
      optimizer_->Update(step, params, gradient, block, block_end);
    }
  });
}

absl::Status CpuBackend::Reduce(bool mean) { return ReduceRange(mean, 0, params_.size()); }

absl::Status CpuBackend::ReduceRange(bool mean, uint64_t first, uint64_t last) {
  if (absl::Status s = CheckRange(first, last); !s.ok()) return s;
  const size_t trainers = staging_.size();
  const float divisor = static_cast<float>(trainers);
  float* const sum = staging_[0].data();
  pool_->ParallelFor(last - first, kGrainElements, [&](size_t begin, size_t end) {
    begin += first;
    end += first;
    for (size_t t = 1; t < trainers; ++t) {
      const float* __restrict other = staging_[t].data();
      for (size_t i = begin; i < end; ++i) sum[i] += other[i];
    }
    if (mean && trainers > 1) {
      for (size_t i = begin; i < end; ++i) sum[i] /= divisor;
    }
  });
  return absl::OkStatus();
}

absl::StatusOr<double> CpuBackend::SumOfSquares(float scale) {
  const size_t n = params_.size();
  std::vector<double> blocks((n + kNormBlockElements - 1) / kNormBlockElements, 0.0);
  if (absl::Status s = SumOfSquaresBlocks(scale, 0, n, blocks.data()); !s.ok()) return s;
  double total = 0;
  for (double s : blocks) total += s;
  return total;
}

absl::Status CpuBackend::SumOfSquaresBlocks(float scale, uint64_t first, uint64_t last,
                                            double* block_sums) {
  if (absl::Status s = CheckRange(first, last); !s.ok()) return s;
  if (first % kNormBlockElements != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("norm blocks start at multiples of ", kNormBlockElements, ", not at ", first));
  }
  const float* const g = staging_[0].data();
  const size_t first_block = first / kNormBlockElements;
  const size_t blocks = (last - first + kNormBlockElements - 1) / kNormBlockElements;
  pool_->ParallelFor(blocks, 1, [&](size_t begin, size_t end) {
    for (size_t b = begin; b < end; ++b) {
      double s = 0;
      const size_t block_begin = (first_block + b) * kNormBlockElements;
      const size_t block_end = std::min<size_t>(last, block_begin + kNormBlockElements);
      for (size_t i = block_begin; i < block_end; ++i) {
        const double x = static_cast<double>(g[i] * scale);
        s += x * x;
      }
      block_sums[b] = s;
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::Update(int64_t step, const OptimizerConfig& config, float multiplier) {
  return UpdateRange(step, config, multiplier, 0, params_.size());
}

absl::Status CpuBackend::UpdateRange(int64_t step, const OptimizerConfig& config, float multiplier,
                                     uint64_t first, uint64_t last) {
  if (absl::Status s = CheckRange(first, last); !s.ok()) return s;
  if (absl::Status s = optimizer_->SetConfig(config); !s.ok()) return s;
  float* const g = staging_[0].data();
  if (optimizer_->needs_whole_tensors()) {
    if (absl::Status s = CheckWholeRange(first, last); !s.ok()) return s;
    if (absl::Status s = CheckOwnNormsSuffice(); !s.ok()) return s;
    MultiplyGradient(multiplier);
    return UpdateWholeTensors(step, g);
  }
  UpdateBlocks(step, g, multiplier, first, last);
  return absl::OkStatus();
}

const float* CpuBackend::HostParameters(uint64_t offset, uint64_t count) const {
  if (offset > params_.size() || count > params_.size() - offset) return nullptr;
  return params_.data() + offset;
}

absl::Status CpuBackend::Read(uint64_t offset, uint64_t count, float* out) {
  if (absl::Status s = CheckElementsInRange("elements", offset, count, params_.size()); !s.ok()) {
    return s;
  }
  std::memcpy(out, params_.data() + offset, count * sizeof(float));
  return absl::OkStatus();
}

absl::Status CpuBackend::CheckSlot(int slot, uint64_t offset, uint64_t count) const {
  if (slot < 0 || static_cast<size_t>(slot) >= optimizer_->slot_names().size()) {
    return absl::OutOfRangeError(absl::StrCat("the optimizer has no state slot ", slot));
  }
  return CheckElementsInRange("slot elements", offset, count, params_.size());
}

absl::Status CpuBackend::ReadSlot(int slot, uint64_t offset, uint64_t count, float* out) {
  if (absl::Status s = CheckSlot(slot, offset, count); !s.ok()) return s;
  optimizer_->ReadSlot(slot, offset, count, out);
  return absl::OkStatus();
}

absl::Status CpuBackend::WriteSlot(int slot, uint64_t offset, uint64_t count, const float* in) {
  if (absl::Status s = CheckSlot(slot, offset, count); !s.ok()) return s;
  return optimizer_->WriteSlot(slot, offset, count, in);
}

}  // namespace shardopt
