// Conversions between Python values and the C++ client's types for the
// _shardopt module (shardopt_module.cc): statuses to Python exceptions,
// buffers to float views, keyword arguments and dicts to option structs,
// results to dicts. A bad Python value raises ValueError; a bad status
// travels as StatusException, which the module turns into its class.
#ifndef SHARDOPT_PYTHON_PY_CONVERSIONS_H_
#define SHARDOPT_PYTHON_PY_CONVERSIONS_H_

#include <pybind11/pybind11.h>

#include <cstddef>
#include <exception>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/channel_security.h"
#include "client/trainer_client.h"
#include "common/dtype.h"
#include "common/layout.h"
#include "common/loss_scaler.h"
#include "common/optimizer_config.h"

namespace shardopt {
namespace py_binding {

namespace py = pybind11;

// Python exception classes, one per status code, created at import.
struct Exceptions {
  py::object base;
  std::map<absl::StatusCode, py::object> by_code;
};
Exceptions& GetExceptions();

// Carries a non-OK status out of a binding; translated to the Python class.
struct StatusException : std::exception {
  absl::Status status;
  explicit StatusException(absl::Status s) : status(std::move(s)) {}
  const char* what() const noexcept override { return "shardopt status"; }
};

void ThrowIfError(const absl::Status& status);
template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  ThrowIfError(value.status());
  return std::move(*value);
}

// A writable or read-only float32 view of a Python buffer of `size` floats.
struct FloatBuffer {
  py::buffer_info info;
  float* data = nullptr;
};
FloatBuffer RequestFloats(const py::buffer& buffer, size_t size, bool writable, const char* what);

// "float32", "bfloat16" or "float16".
DType DTypeFromName(const std::string& name);

// The optimizer from keyword arguments in torch.optim's names.
OptimizerConfig OptimizerFromKwargs(const std::string& name, const py::dict& kw);
// The inverse: `config`'s hyperparameters as shardopt.torch's keyword
// arguments for its kind (torch.optim's names; Adafactor's eps1 < 0 as
// None, Muon's adjust_lr as None or "match_rms_adamw").
py::dict OptimizerToKwargs(const OptimizerConfig& config);

// Dynamic loss scaling from keyword arguments in LossScalerOptions' names;
// ValueError for a name it does not have.
LossScalerOptions LossScalerFromKwargs(const py::dict& kw);

// [(name, shape, offset, size)] of `layout`'s tensors.
std::vector<py::tuple> Placements(const ModelLayout& layout);

// The StepResult's fields by name.
py::dict StepResultToDict(const StepResult& r);

// ChannelSecurity from a dict of its field names; ValueError for another key.
ChannelSecurity SecurityFromDict(const py::dict& security);

}  // namespace py_binding
}  // namespace shardopt

#endif  // SHARDOPT_PYTHON_PY_CONVERSIONS_H_
