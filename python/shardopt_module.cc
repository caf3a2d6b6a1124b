// _shardopt: the Python face of the C++ TrainerClient (client/trainer_client.h).
//
// Tensor data crosses as Python buffers (numpy arrays, torch tensors through
// .numpy()): contiguous little-endian float32 buffers of the layout's size
// are read and written in place, without copies; anything else is refused
// with ValueError (TypeError for objects that are no buffer). Calls that wait on the network
// release the GIL; a mutex keeps one Client's calls apart (the C++ client is not thread-safe).
// Every error the C++ side reports becomes a Python exception: shardopt.ShardoptError (a
// RuntimeError) or one of its subclasses named after the gRPC status code (InvalidArgumentError is
// also a ValueError, NotFoundError a LookupError, UnavailableError a ConnectionError, ...), with
// the code in its `code` attribute.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/shared_memory_route.h"
#include "client/trainer_client.h"
#include "common/dtype.h"
#include "common/optimizer_config.h"

namespace py = pybind11;

namespace shardopt {
namespace {

// Python exception classes, one per status code, created at import.
struct Exceptions {
  py::object base;
  std::map<absl::StatusCode, py::object> by_code;
};
Exceptions& GetExceptions() {
  static Exceptions* exceptions = new Exceptions();
  return *exceptions;
}

// Carries a non-OK status out of a binding; translated to the Python class.
struct StatusException : std::exception {
  absl::Status status;
  explicit StatusException(absl::Status s) : status(std::move(s)) {}
  const char* what() const noexcept override { return "shardopt status"; }
};

void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) throw StatusException(status);
}
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
FloatBuffer RequestFloats(const py::buffer& buffer, size_t size, bool writable, const char* what) {
  FloatBuffer out;
  out.info = buffer.request(writable);
  if (out.info.format != py::format_descriptor<float>::format() ||
      out.info.itemsize != sizeof(float)) {
    throw py::value_error(
        absl::StrCat(what, " must hold float32 values (got format '", out.info.format, "')"));
  }
  // C-contiguous, any shape: the strides must be those of a packed array.
  py::ssize_t expected = sizeof(float);
  for (py::ssize_t d = out.info.ndim - 1; d >= 0; --d) {
    if (out.info.shape[d] > 1 && out.info.strides[d] != expected) {
      throw py::value_error(absl::StrCat(what,
                                         " is not contiguous: pass a contiguous buffer "
                                         "(tensor.contiguous(), numpy.ascontiguousarray)"));
    }
    expected *= out.info.shape[d];
  }
  if (static_cast<size_t>(out.info.size) != size) {
    throw py::value_error(absl::StrCat(what, " has ", out.info.size,
                                       " elements; the model's flat layout has ", size));
  }
  out.data = static_cast<float*>(out.info.ptr);
  return out;
}

DType DTypeFromName(const std::string& name) {
  for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    if (name == DTypeName(d)) return d;
  }
  throw py::value_error(absl::StrCat("unknown dtype '", name, "' (float32, bfloat16, float16)"));
}

// The optimizer from keyword arguments in torch.optim's names.
OptimizerConfig OptimizerFromKwargs(const std::string& name, const py::dict& kw) {
  auto get = [&](const char* key, double fallback) {
    return kw.contains(key) ? kw[key].cast<double>() : fallback;
  };
  auto flag = [&](const char* key) { return kw.contains(key) && kw[key].cast<bool>(); };
  OptimizerConfig c;
  if (name == "sgd") {
    c = OptimizerConfig::Sgd(get("lr", 1e-3));
    c.momentum = get("momentum", 0);
    c.dampening = get("dampening", 0);
    c.nesterov = flag("nesterov");
  } else if (name == "adam" || name == "adamw") {
    c = name == "adam" ? OptimizerConfig::Adam(get("lr", 1e-3))
                       : OptimizerConfig::AdamW(get("lr", 1e-3));
    if (kw.contains("betas")) {
      auto betas = kw["betas"].cast<std::pair<double, double>>();
      c.beta1 = betas.first;
      c.beta2 = betas.second;
    }
    c.eps = get("eps", 1e-8);
    c.amsgrad = flag("amsgrad");
  } else if (name == "adagrad") {
    c = OptimizerConfig::Adagrad(get("lr", 1e-2));
    c.lr_decay = get("lr_decay", 0);
    c.initial_accumulator_value = get("initial_accumulator_value", 0);
    c.eps = get("eps", 1e-10);
  } else if (name == "lion") {
    c = OptimizerConfig::Lion(get("lr", 1e-4));
    if (kw.contains("betas")) {
      auto betas = kw["betas"].cast<std::pair<double, double>>();
      c.beta1 = betas.first;
      c.beta2 = betas.second;
    }
  } else if (name == "lamb") {
    c = OptimizerConfig::Lamb(get("lr", 1e-3));
    if (kw.contains("betas")) {
      auto betas = kw["betas"].cast<std::pair<double, double>>();
      c.beta1 = betas.first;
      c.beta2 = betas.second;
    }
    c.eps = get("eps", 1e-6);
    c.min_trust_ratio = get("min_trust_ratio", 0.01);
    c.max_trust_ratio = get("max_trust_ratio", 10.0);
    c.bias_correction = !kw.contains("bias_correction") || kw["bias_correction"].cast<bool>();
  } else if (name == "adafactor") {
    c = OptimizerConfig::Adafactor(get("lr", 1e-2));
    c.beta2_decay = get("beta2_decay", -0.8);
    if (kw.contains("eps")) {
      // torch.optim.Adafactor's eps=(eps1, eps2), eps1 None: machine epsilon.
      auto eps = kw["eps"].cast<std::pair<py::object, double>>();
      c.eps1 = eps.first.is_none() ? -1.0 : eps.first.cast<double>();
      c.eps2 = eps.second;
    }
    c.clip_threshold = get("d", 1.0);
  } else if (name == "muon") {
    c = OptimizerConfig::Muon(get("lr", 1e-3));
    c.momentum = get("momentum", 0.95);
    c.nesterov = !kw.contains("nesterov") || kw["nesterov"].cast<bool>();
    if (kw.contains("ns_coefficients")) {
      auto abc = kw["ns_coefficients"].cast<std::tuple<double, double, double>>();
      c.ns_a = std::get<0>(abc);
      c.ns_b = std::get<1>(abc);
      c.ns_c = std::get<2>(abc);
    }
    c.eps = get("eps", 1e-7);
    if (kw.contains("ns_steps")) c.ns_steps = kw["ns_steps"].cast<int>();
    if (kw.contains("adjust_lr_fn") && !kw["adjust_lr_fn"].is_none()) {
      const std::string fn = kw["adjust_lr_fn"].cast<std::string>();
      if (fn == "match_rms_adamw") {
        c.adjust_lr = MuonAdjustLr::kMatchRmsAdamW;
      } else if (fn != "original") {
        throw py::value_error(absl::StrCat("unknown adjust_lr_fn '", fn,
                                           "' (None, 'original' or 'match_rms_adamw')"));
      }
    }
  } else {
    throw py::value_error(absl::StrCat(
        "unknown optimizer '", name, "' (sgd, adam, adamw, adagrad, lion, lamb, adafactor, muon)"));
  }
  c.weight_decay = get("weight_decay", name == "adamw"  ? 1e-2
                                       : name == "lamb" ? 0.01
                                       : name == "muon" ? 0.1
                                                        : 0);
  c.maximize = flag("maximize");
  ThrowIfError(c.Validate());
  return c;
}

// Dynamic loss scaling from keyword arguments in LossScalerOptions' names;
// ValueError for a name it does not have.
LossScalerOptions LossScalerFromKwargs(const py::dict& kw) {
  LossScalerOptions o;
  for (const auto& [key, value] : kw) {
    const std::string name = key.cast<std::string>();
    if (name == "initial_scale") {
      o.initial_scale = value.cast<double>();
    } else if (name == "min_scale") {
      o.min_scale = value.cast<double>();
    } else if (name == "max_scale") {
      o.max_scale = value.cast<double>();
    } else if (name == "growth_factor") {
      o.growth_factor = value.cast<double>();
    } else if (name == "backoff_factor") {
      o.backoff_factor = value.cast<double>();
    } else if (name == "growth_interval") {
      o.growth_interval = value.cast<int64_t>();
    } else if (name == "hysteresis") {
      o.hysteresis = value.cast<int64_t>();
    } else {
      throw py::value_error(
          absl::StrCat("unknown loss scaler option '", name,
                       "' (initial_scale, min_scale, max_scale, growth_factor, backoff_factor, "
                       "growth_interval, hysteresis)"));
    }
  }
  ThrowIfError(o.Validate());
  return o;
}

// [(name, shape, offset, size)] of `layout`'s tensors.
std::vector<py::tuple> Placements(const ModelLayout& layout) {
  std::vector<py::tuple> out;
  for (const TensorPlacement& t : layout.tensors()) {
    out.push_back(py::make_tuple(t.spec.name, t.spec.shape, t.offset, t.size));
  }
  return out;
}

py::dict StepResultToDict(const StepResult& r) {
  py::dict d;
  d["step"] = r.step;
  d["version"] = r.version;
  d["skipped"] = r.skipped;
  d["grad_norm"] = r.grad_norm;
  d["clip_coef"] = r.clip_coef;
  d["loss_scale"] = r.loss_scale;
  d["lr"] = r.lr;
  d["duplicate_pushes"] = r.duplicate_pushes;
  d["replayed_pushes"] = r.replayed_pushes;
  d["bytes_pushed"] = r.bytes_pushed;
  d["bytes_pulled"] = r.bytes_pulled;
  d["bytes_pushed_early"] = r.bytes_pushed_early;
  d["staleness"] = r.staleness;
  d["shard_versions"] = r.shard_versions;
  return d;
}

// ChannelSecurity from a dict of its field names; ValueError for another key.
ChannelSecurity SecurityFromDict(const py::dict& security) {
  ChannelSecurity s;
  const std::vector<std::pair<const char*, std::string*>> fields = {
      {"tls_ca_file", &s.tls_ca_file},   {"tls_cert_file", &s.tls_cert_file},
      {"tls_key_file", &s.tls_key_file}, {"tls_server_name", &s.tls_server_name},
      {"auth_token", &s.auth_token},     {"auth_token_file", &s.auth_token_file}};
  for (const auto& [key, value] : security) {
    const std::string name = py::str(key);
    auto field =
        std::find_if(fields.begin(), fields.end(), [&](const auto& f) { return name == f.first; });
    if (field == fields.end()) {
      throw py::value_error("unknown security option '" + name +
                            "' (tls_ca_file, tls_cert_file, tls_key_file, tls_server_name, "
                            "auth_token, auth_token_file)");
    }
    *field->second = py::str(value);
  }
  return s;
}

// A flat buffer in a client's shared segment, holding the segment.
struct SharedBufferView {
  std::shared_ptr<const TrainerSegment> segment;
  float* data;
};

// One trainer of one model (see TrainerClient).
class Client {
 public:
  Client(std::vector<std::string> servers, uint32_t rank, double rpc_timeout_s,
         double retry_budget_s, int replay_steps, std::string journal_path,
         const std::string& push_dtype, const std::string& pull_dtype, const py::dict& security,
         bool shared_memory, bool socket_payloads, std::string device_pairs, int device_pair_gpu) {
    TrainerClientOptions options;
    options.shared_memory = shared_memory;
    options.socket_payloads = socket_payloads;
    options.device_pairs = std::move(device_pairs);
    options.device_pair_gpu = device_pair_gpu;
    options.security = SecurityFromDict(security);
    options.trainer_rank = rank;
    options.rpc_timeout = absl::Seconds(rpc_timeout_s);
    options.retry_budget = absl::Seconds(retry_budget_s);
    options.attach_timeout = absl::Seconds(retry_budget_s);
    options.replay_steps = replay_steps;
    options.journal_path = std::move(journal_path);
    options.push_dtype = DTypeFromName(push_dtype);
    options.pull_dtype = DTypeFromName(pull_dtype);
    client_ = ValueOrThrow(TrainerClient::Connect(servers, options));
  }

  // Registers (with `initial`, a flat buffer of the layout) or attaches.
  void Register(const std::string& model_id,
                const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors,
                const std::string& optimizer, const py::dict& hyperparameters,
                uint32_t num_trainers, double max_grad_norm, const py::object& initial,
                const py::object& loss_scaler, const std::string& consistency, int64_t staleness,
                const std::string& partition) {
    ModelSpec spec;
    spec.consistency = ValueOrThrow(ConsistencyFromName(consistency));
    spec.staleness = staleness;
    spec.partition = ValueOrThrow(PartitionFromName(partition));
    spec.model_id = model_id;
    for (const auto& [name, shape] : tensors) spec.tensors.push_back({name, shape});
    spec.optimizer = OptimizerFromKwargs(optimizer, hyperparameters);
    spec.num_trainers = num_trainers;
    spec.max_grad_norm = max_grad_norm;
    if (!loss_scaler.is_none()) {
      spec.loss_scaling = true;
      spec.loss_scaler = LossScalerFromKwargs(loss_scaler.cast<py::dict>());
    }
    if (initial.is_none()) {
      {
        py::gil_scoped_release release;
        std::lock_guard<std::mutex> serial(mu_);
        ThrowIfError(client_->Attach(spec));
      }
      registered_ = true;
      return;
    }
    const ModelLayout layout = ValueOrThrow(client_->LayoutFor(spec));
    FloatBuffer values =
        RequestFloats(initial.cast<py::buffer>(), layout.total_elements(), false, "initial values");
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> serial(mu_);
      ThrowIfError(
          client_->Register(spec, absl::MakeConstSpan(values.data, layout.total_elements())));
    }
    registered_ = true;
  }

  // [(name, shape, offset, size)] of the registered layout.
  std::vector<py::tuple> Layout() const { return Placements(Checked().layout()); }
  uint64_t TotalElements() const { return Checked().layout().total_elements(); }

  py::dict Step(int64_t step, const py::buffer& grads, const py::buffer& params) {
    return RunStep(step, grads, params, &TrainerClient::Step);
  }

  // See TrainerClient::BeginStreamedPush. `grads` must stay alive (and in
  // place) until finish_streamed_step or cancel_streamed_push.
  void BeginStreamedPush(int64_t step, const py::buffer& grads) {
    const size_t n = Checked().layout().total_elements();
    FloatBuffer g = RequestFloats(grads, n, false, "gradient buffer");
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> serial(mu_);
    ThrowIfError(client_->BeginStreamedPush(step, absl::MakeConstSpan(g.data, n)));
  }
  // From backward hooks: no lock beyond the client's own.
  void MarkGradientReady(uint64_t begin, uint64_t end) { client_->MarkGradientReady(begin, end); }
  py::dict FinishStreamedStep(int64_t step, const py::buffer& grads, const py::buffer& params) {
    return RunStep(step, grads, params, &TrainerClient::FinishStreamedStep);
  }
  void CancelStreamedPush() {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> serial(mu_);
    client_->CancelStreamedPush();
  }
  int64_t streamed_pushes() const { return client_->streamed_pushes(); }
  int64_t streamed_pushes_changed() const { return client_->streamed_pushes_changed(); }
  uint64_t streamed_bytes_sent() const { return client_->streamed_bytes_sent(); }

  // Step or FinishStreamedStep on the two flat buffers, without the GIL.
  using StepFn = absl::StatusOr<StepResult> (TrainerClient::*)(
      int64_t, absl::Span<const float>, absl::Span<float>);
  py::dict RunStep(int64_t step, const py::buffer& grads, const py::buffer& params, StepFn fn) {
    const size_t n = Checked().layout().total_elements();
    FloatBuffer g = RequestFloats(grads, n, false, "gradient buffer");
    FloatBuffer p = RequestFloats(params, n, true, "parameter buffer");
    StepResult result;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> serial(mu_);
      result = ValueOrThrow(
          (client_.get()->*fn)(step, absl::MakeConstSpan(g.data, n), absl::MakeSpan(p.data, n)));
    }
    return StepResultToDict(result);
  }

  // See TrainerClient::StepOnDevice: `grads` and `params` are addresses
  // (torch's data_ptr()) of layout().total_elements() floats each in the
  // device pairs' memory, alive and unchanged by the caller until it returns.
  py::dict StepOnDevice(int64_t step, uintptr_t grads, uintptr_t params) {
    Checked();
    if (grads == 0 || params == 0) throw py::value_error("step_on_device: a null buffer address");
    StepResult result;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> serial(mu_);
      result = ValueOrThrow(client_->StepOnDevice(step, reinterpret_cast<const float*>(grads),
                                                  reinterpret_cast<float*>(params)));
    }
    return StepResultToDict(result);
  }

  int64_t Pull(int64_t min_version, const py::buffer& params) {
    const size_t n = Checked().layout().total_elements();
    FloatBuffer p = RequestFloats(params, n, true, "parameter buffer");
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> serial(mu_);
    return ValueOrThrow(client_->Pull(min_version, absl::MakeSpan(p.data, n)));
  }

  int64_t PullToResume(const py::buffer& params) {
    const size_t n = Checked().layout().total_elements();
    FloatBuffer p = RequestFloats(params, n, true, "parameter buffer");
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> serial(mu_);
    return ValueOrThrow(client_->PullToResume(absl::MakeSpan(p.data, n)));
  }

  std::string Checkpoint(const std::string& directory, int64_t step) {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> serial(mu_);
    return ValueOrThrow(client_->Checkpoint(directory, step));
  }

  std::vector<std::string> InspectJson() {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> serial(mu_);
    return ValueOrThrow(client_->InspectJson());
  }

  void SetHyperparameters(int64_t effective_step, const std::string& optimizer,
                          const py::dict& hyperparameters) {
    const OptimizerConfig config = OptimizerFromKwargs(optimizer, hyperparameters);
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> serial(mu_);
    ThrowIfError(client_->SetHyperparameters(effective_step, config, LrSchedule()));
  }

  int64_t registered_version() const { return Checked().registered_version(); }
  // Also answers before register(): the layout the model will get.
  std::vector<py::tuple> LayoutFor(
      const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors,
      const std::string& partition) const {
    ModelSpec spec;
    spec.partition = ValueOrThrow(PartitionFromName(partition));
    for (const auto& [name, shape] : tensors) spec.tensors.push_back({name, shape});
    const ModelLayout layout = ValueOrThrow(client_->LayoutFor(spec));
    std::vector<py::tuple> out = Placements(layout);
    out.push_back(py::make_tuple("", std::vector<int64_t>{}, layout.total_elements(), 0));
    return out;
  }
  uint32_t rank() const { return client_->trainer_rank(); }
  uint32_t shard_count() const { return client_->shard_count(); }
  int64_t failed_attempts() const { return client_->failed_attempts(); }
  double loss_scale() const { return client_->loss_scale(); }
  int64_t replayed_pushes() const { return client_->replayed_pushes(); }
  void WaitForEveryTrainer(int64_t step) {
    Checked();
    absl::Status waited;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> serial(mu_);
      waited = client_->WaitForEveryTrainer(step);
    }
    ThrowIfError(waited);
  }
  int64_t shared_memory_transfers() const { return client_->shared_memory_transfers(); }
  int64_t socket_transfers() const { return client_->socket_transfers(); }
  int64_t device_pair_transfers() const { return client_->device_pair_transfers(); }
  int64_t device_buffer_transfers() const { return client_->device_buffer_transfers(); }
  std::string device_pair_kind() const { return client_->device_pair_kind(); }
  // One of the client's shared buffers as a Python buffer that keeps the
  // segment mapped (tensors made from it outlive the client), or None.
  py::object SharedBuffer(bool gradients) const {
    std::shared_ptr<const TrainerSegment> segment = client_->shared_segment();
    if (segment == nullptr) return py::none();
    return py::cast(
        SharedBufferView{segment, gradients ? segment->gradients() : segment->parameters()});
  }
  std::optional<int64_t> rolled_back_to() const { return client_->rolled_back_to(); }

 private:
  const TrainerClient& Checked() const {
    if (!registered_) {
      throw StatusException(absl::FailedPreconditionError("call register() first"));
    }
    return *client_;
  }

  std::unique_ptr<TrainerClient> client_;
  // Held (after the GIL is released) by every call into client_.
  std::mutex mu_;
  bool registered_ = false;
};

}  // namespace
}  // namespace shardopt

PYBIND11_MODULE(_shardopt, m) {
  using namespace shardopt;
  m.doc() = "shardopt's C++ trainer client (see shardopt.torch for the PyTorch optimizer)";

  Exceptions& ex = GetExceptions();
  ex.base = py::reinterpret_borrow<py::object>(
      PyErr_NewException("shardopt._shardopt.ShardoptError", PyExc_RuntimeError, nullptr));
  m.attr("ShardoptError") = ex.base;
  // Subclasses per status code, each also a fitting builtin exception.
  const std::vector<std::tuple<absl::StatusCode, const char*, PyObject*>> kinds = {
      {absl::StatusCode::kInvalidArgument, "InvalidArgumentError", PyExc_ValueError},
      {absl::StatusCode::kNotFound, "NotFoundError", PyExc_LookupError},
      {absl::StatusCode::kAlreadyExists, "AlreadyExistsError", nullptr},
      {absl::StatusCode::kFailedPrecondition, "FailedPreconditionError", nullptr},
      {absl::StatusCode::kOutOfRange, "OutOfRangeError", nullptr},
      {absl::StatusCode::kUnavailable, "UnavailableError", PyExc_ConnectionError},
      {absl::StatusCode::kDeadlineExceeded, "DeadlineExceededError", PyExc_TimeoutError},
      {absl::StatusCode::kResourceExhausted, "ResourceExhaustedError", PyExc_MemoryError},
      {absl::StatusCode::kAborted, "AbortedError", nullptr},
      {absl::StatusCode::kCancelled, "CancelledError", nullptr},
      {absl::StatusCode::kDataLoss, "DataLossError", nullptr},
      {absl::StatusCode::kInternal, "InternalError", nullptr},
      {absl::StatusCode::kUnimplemented, "UnimplementedError", nullptr},
      {absl::StatusCode::kUnauthenticated, "UnauthenticatedError", nullptr},
      {absl::StatusCode::kPermissionDenied, "PermissionDeniedError", PyExc_PermissionError},
  };
  for (const auto& [code, name, builtin] : kinds) {
    py::tuple bases =
        builtin ? py::make_tuple(ex.base, py::handle(builtin)) : py::make_tuple(ex.base);
    py::object cls = py::reinterpret_steal<py::object>(PyErr_NewException(
        absl::StrCat("shardopt._shardopt.", name).c_str(), bases.ptr(), nullptr));
    m.attr(name) = cls;
    ex.by_code[code] = cls;
  }
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusException& e) {
      Exceptions& ex = GetExceptions();
      auto it = ex.by_code.find(e.status.code());
      py::object cls = it != ex.by_code.end() ? it->second : ex.base;
      const std::string code = absl::StatusCodeToString(e.status.code());
      py::object instance = cls(absl::StrCat(code, ": ", e.status.message()));
      instance.attr("code") = code;
      PyErr_SetObject(cls.ptr(), instance.ptr());
    }
  });

  py::class_<SharedBufferView>(m, "SharedBuffer", py::buffer_protocol(),
                               "A writable float32 flat buffer in a client's shared-memory "
                               "segment; keeps the segment mapped while it lives.")
      .def_buffer([](SharedBufferView& view) {
        return py::buffer_info(view.data, sizeof(float), py::format_descriptor<float>::format(), 1,
                               {static_cast<ssize_t>(view.segment->total_elements())},
                               {static_cast<ssize_t>(sizeof(float))});
      });

  py::class_<Client>(m, "Client", "One trainer (rank) of one model on a set of shard servers.")
      .def(py::init<std::vector<std::string>, uint32_t, double, double, int, std::string,
                    const std::string&, const std::string&, const py::dict&, bool, bool,
                    std::string, int>(),
           py::arg("servers"), py::arg("rank"), py::arg("rpc_timeout_s") = 60.0,
           py::arg("retry_budget_s") = 60.0, py::arg("replay_steps") = 0,
           py::arg("journal_path") = "", py::arg("push_dtype") = "float32",
           py::arg("pull_dtype") = "float32", py::arg("security") = py::dict(),
           py::arg("shared_memory") = true, py::arg("socket_payloads") = true,
           py::arg("device_pairs") = "off", py::arg("device_pair_gpu") = 0)
      .def("register", &Client::Register, py::arg("model_id"), py::arg("tensors"),
           py::arg("optimizer"), py::arg("hyperparameters"), py::arg("num_trainers"),
           py::arg("max_grad_norm") = 0.0, py::arg("initial") = py::none(),
           py::arg("loss_scaler") = py::none(), py::arg("consistency") = "sync",
           py::arg("staleness") = 0, py::arg("partition") = "flat",
           "Registers the model with `initial` (a flat float32 buffer of its layout), or "
           "attaches to it when `initial` is None. `loss_scaler`: a dict of dynamic loss "
           "scaling options (Megatron's DynamicGradScaler: initial_scale, min_scale, max_scale, "
           "growth_factor, backoff_factor, growth_interval, hysteresis) turns it on. "
           "`consistency`: 'sync' (lockstep), 'async' (each push applied alone as it "
           "arrives) or 'bounded' (async, a trainer at most `staleness` steps ahead of the "
           "slowest). `partition`: 'flat' (even split) or 'whole_tensors' (each tensor on one "
           "shard: what 'lamb' and 'adafactor' need).")
      .def("wait_for_every_trainer", &Client::WaitForEveryTrainer, py::arg("step"),
           "Asynchronous modes, at the end of a job: returns once every shard holds every "
           "trainer's steps up to `step` (re-pushing this trainer's own that a restarted shard "
           "lacks).")
      .def("layout", &Client::Layout, "[(name, shape, offset, size)] of the flat layout.")
      .def("layout_for", &Client::LayoutFor, py::arg("tensors"), py::arg("partition") = "flat",
           "The layout `tensors` would get: [(name, shape, offset, size)], then ('', [], "
           "total_elements, 0).")
      .def("total_elements", &Client::TotalElements)
      .def("step_on_device", &Client::StepOnDevice, py::arg("step"), py::arg("grads"),
           py::arg("params"),
           "step() for buffers in the device pairs' memory (a GPU's for 'nccl'), given by "
           "address (torch's data_ptr()): pairs send the gradient from there and write the "
           "parameters there; the rest goes through host copies (TrainerClient::StepOnDevice).")
      .def("step", &Client::Step, py::arg("step"), py::arg("grads"), py::arg("params"),
           "Pushes `grads` for `step`, pulls version `step` into `params`; returns the result.")
      .def("begin_streamed_push", &Client::BeginStreamedPush, py::arg("step"), py::arg("grads"),
           "Starts pushing `step` while the gradient is being computed.")
      .def("mark_gradient_ready", &Client::MarkGradientReady, py::arg("begin"), py::arg("end"),
           "Elements [begin, end) of the flat gradient are final.")
      .def("finish_streamed_step", &Client::FinishStreamedStep, py::arg("step"), py::arg("grads"),
           py::arg("params"),
           "Ends a streamed push and pulls; falls back to step() when it cannot.")
      .def("cancel_streamed_push", &Client::CancelStreamedPush)
      .def_property_readonly("streamed_pushes", &Client::streamed_pushes)
      .def_property_readonly("streamed_pushes_changed", &Client::streamed_pushes_changed)
      .def_property_readonly("streamed_bytes_sent", &Client::streamed_bytes_sent)
      .def("pull", &Client::Pull, py::arg("min_version"), py::arg("params"))
      .def("pull_to_resume", &Client::PullToResume, py::arg("params"),
           "Pulls the version to go on from after register/attach (or after a rollback) and "
           "returns it; rolls the job back to a checkpoint when a step ran in part without "
           "this trainer's lost push (see TrainerClient::PullToResume).")
      .def("checkpoint", &Client::Checkpoint, py::arg("directory"), py::arg("step") = -1)
      .def("inspect_json", &Client::InspectJson)
      .def("set_hyperparameters", &Client::SetHyperparameters, py::arg("effective_step"),
           py::arg("optimizer"), py::arg("hyperparameters"))
      .def_property_readonly("registered_version", &Client::registered_version)
      .def_property_readonly("rank", &Client::rank)
      .def_property_readonly("shard_count", &Client::shard_count)
      .def_property_readonly("loss_scale", &Client::loss_scale,
                             "What to multiply the next step's loss by (1 without loss scaling).")
      .def_property_readonly("failed_attempts", &Client::failed_attempts,
                             "Attempts of calls to shards that failed UNAVAILABLE or "
                             "DEADLINE_EXCEEDED so far (each is retried within the retry "
                             "budget): shards down, unreachable or slower than rpc_timeout.")
      .def_property_readonly("shared_memory_transfers", &Client::shared_memory_transfers,
                             "Pushes and pulls to single shards that went through shared memory.")
      .def_property_readonly("socket_transfers", &Client::socket_transfers,
                             "Pushes and pulls to single shards that went over payload sockets.")
      .def_property_readonly("device_pair_transfers", &Client::device_pair_transfers,
                             "Pushes and pulls that went over device pairs.")
      .def_property_readonly("device_buffer_transfers", &Client::device_buffer_transfers,
                             "Of those, the ones straight from or into step_on_device's buffers.")
      .def_property_readonly("device_pair_kind", &Client::device_pair_kind,
                             "After register: the device pairs' kind in use ('nccl', "
                             "'loopback'), or '' (off, or the kind cannot run here).")
      .def(
          "shared_gradients", [](const Client& c) { return c.SharedBuffer(true); },
          "After register: the flat gradient buffer in the segment co-located shards map "
          "(a float32 buffer: numpy.frombuffer or torch.frombuffer(..., dtype=torch.float32) "
          "view it, and keep the memory alive after the client is gone); pushed without a "
          "copy. None without shared memory.")
      .def(
          "shared_parameters", [](const Client& c) { return c.SharedBuffer(false); },
          "After register: the flat parameter buffer the shards pull into directly; None "
          "without shared memory.")
      .def_property_readonly("replayed_pushes", &Client::replayed_pushes,
                             "Earlier steps re-pushed to shards restarted from a checkpoint.")
      .def_property_readonly("rolled_back_to", &Client::rolled_back_to,
                             "After a call failed with AbortedError because the job rolled back "
                             "to a checkpoint (a restarted shard needed steps no trainer could "
                             "re-push): the version to pull and continue from; else None.");
}
