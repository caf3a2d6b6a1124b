// ForwardingBackend: a test UpdateBackend that hands every call a backend
// must answer to another backend (a CpuBackend), so that a test's backend
// overrides only what it changes (a copy of its own, a source written
// during Stage). The optional methods keep UpdateBackend's defaults unless
// the test overrides them.
#ifndef SHARDOPT_SERVER_FORWARDING_BACKEND_TESTING_H_
#define SHARDOPT_SERVER_FORWARDING_BACKEND_TESTING_H_

#include <memory>
#include <string>
#include <utility>

#include "server/update_backend.h"

namespace shardopt::testing {

class ForwardingBackend : public UpdateBackend {
 public:
  explicit ForwardingBackend(std::unique_ptr<UpdateBackend> inner) : inner_(std::move(inner)) {}
  std::string device() const override { return inner_->device(); }
  absl::StatusOr<size_t> Stage(uint32_t rank, uint64_t offset, const void* data, DType dtype,
                               size_t count) override {
    return inner_->Stage(rank, offset, data, dtype, count);
  }
  absl::Status FinishStaging(uint32_t rank) override { return inner_->FinishStaging(rank); }
  absl::Status Apply(int64_t step, bool mean, const OptimizerConfig& config) override {
    return inner_->Apply(step, mean, config);
  }
  absl::Status Reduce(bool mean) override { return inner_->Reduce(mean); }
  absl::StatusOr<double> SumOfSquares(float scale) override { return inner_->SumOfSquares(scale); }
  absl::Status Update(int64_t step, const OptimizerConfig& config, float multiplier) override {
    return inner_->Update(step, config, multiplier);
  }
  absl::Status Read(uint64_t offset, uint64_t count, float* out) override {
    return inner_->Read(offset, count, out);
  }
  absl::Status ReadSlot(int slot, uint64_t offset, uint64_t count, float* out) override {
    return inner_->ReadSlot(slot, offset, count, out);
  }
  absl::Status WriteSlot(int slot, uint64_t offset, uint64_t count, const float* in) override {
    return inner_->WriteSlot(slot, offset, count, in);
  }
  uint64_t parameter_bytes() const override { return inner_->parameter_bytes(); }
  uint64_t optimizer_state_bytes() const override { return inner_->optimizer_state_bytes(); }
  uint64_t staging_bytes() const override { return inner_->staging_bytes(); }

 protected:
  UpdateBackend& inner() { return *inner_; }

 private:
  std::unique_ptr<UpdateBackend> inner_;
};

}  // namespace shardopt::testing

#endif  // SHARDOPT_SERVER_FORWARDING_BACKEND_TESTING_H_
