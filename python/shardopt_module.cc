// _shardopt: the Python face of the C++ TrainerClient (client/trainer_client.h).
//
// Tensor data crosses as Python buffers (numpy arrays, torch tensors through
// .numpy()): contiguous little-endian float32 buffers of the layout's size
// are read and written in place, without copies; anything else is refused
// with ValueError (TypeError for objects that are no buffer). Calls that wait on the network
// release the GIL and answer Ctrl-C (KeyboardInterrupt once the client's calls ended; a step
// interrupted so is retried whole); a mutex keeps one Client's calls apart (the C++ client is not
// thread-safe).
// Every error the C++ side reports becomes a Python exception: shardopt.ShardoptError (a
// RuntimeError) or one of its subclasses named after the gRPC status code (InvalidArgumentError is
// also a ValueError, NotFoundError a LookupError, UnavailableError a ConnectionError, ...), with
// the code in its `code` attribute.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/shared_memory_route.h"
#include "client/trainer_client.h"
#include "common/dtype.h"
#include "common/optimizer_config.h"
#include "python/py_conversions.h"

namespace py = pybind11;

namespace shardopt {
namespace {

using namespace py_binding;  // NOLINT: this module binds them.

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
    // (A registration that fails may leave the client without a model, also
    // when it had one: CheckedSize() then refuses.)
    EndStreamedPush();
    std::atomic_store(&layout_, std::shared_ptr<const ModelLayout>());
    if (initial.is_none()) {
      std::atomic_store(&layout_, Interruptible([&] {
        ThrowIfError(client_->Attach(spec));
        return std::make_shared<const ModelLayout>(client_->layout());
      }));
      return;
    }
    auto layout = std::make_shared<const ModelLayout>(ValueOrThrow(client_->LayoutFor(spec)));
    FloatBuffer values = RequestFloats(initial.cast<py::buffer>(), layout->total_elements(), false,
                                       "initial values");
    Interruptible([&] {
      ThrowIfError(
          client_->Register(spec, absl::MakeConstSpan(values.data, layout->total_elements())));
    });
    std::atomic_store(&layout_, std::shared_ptr<const ModelLayout>(std::move(layout)));
  }

  // [(name, shape, offset, size)] of the registered layout.
  std::vector<py::tuple> Layout() const { return Placements(*CheckedLayout()); }
  uint64_t TotalElements() const { return CheckedSize(); }

  py::dict Step(int64_t step, const py::buffer& grads, const py::buffer& params) {
    return RunStep(step, grads, params, &TrainerClient::Step);
  }

  // See TrainerClient::BeginStreamedPush. `grads` stays held here (the push
  // reads it from a thread of its own) until finish_streamed_step,
  // cancel_streamed_push, the next streamed push or a registration; it must
  // stay in place (not resized) meanwhile.
  void BeginStreamedPush(int64_t step, const py::buffer& grads) {
    const size_t n = CheckedSize();
    auto g = std::make_unique<FloatBuffer>(RequestFloats(grads, n, false, "gradient buffer"));
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> serial(mu_);
      ThrowIfError(client_->BeginStreamedPush(step, absl::MakeConstSpan(g->data, n)));
    }
    streamed_grads_ = std::move(g);  // (The one it replaces was cancelled.)
  }
  // From backward hooks: no lock beyond the client's own.
  void MarkGradientReady(uint64_t begin, uint64_t end) { client_->MarkGradientReady(begin, end); }
  py::dict FinishStreamedStep(int64_t step, const py::buffer& grads, const py::buffer& params) {
    // (Also when it throws before reaching the client: the push ends first.)
    const absl::Cleanup release_grads = [this] { EndStreamedPush(); };
    return RunStep(step, grads, params, &TrainerClient::FinishStreamedStep);
  }
  void CancelStreamedPush() {
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> serial(mu_);
      client_->CancelStreamedPush();
    }
    streamed_grads_.reset();
  }
  // Ends a streamed push in progress (its thread joined) before letting its
  // buffer go. With the GIL.
  void EndStreamedPush() {
    if (streamed_grads_ == nullptr) return;
    CancelStreamedPush();
  }
  int64_t streamed_pushes() const {
    return Serial([&] { return client_->streamed_pushes(); });
  }
  int64_t streamed_pushes_changed() const {
    return Serial([&] { return client_->streamed_pushes_changed(); });
  }
  uint64_t streamed_bytes_sent() const { return client_->streamed_bytes_sent(); }

  // Runs `call` (under the client's lock) on a thread of its own while this
  // one, without the GIL, looks for Ctrl-C every 100 ms: a KeyboardInterrupt
  // (any signal handler's exception) interrupts the client's calls to the
  // shards (TrainerClient::Interrupt: they end CANCELLED) and is raised once
  // the call has ended. Without it a blocked step() sat out its retry
  // budget before Python could see the signal.
  // The interrupt reaches the client only while this call holds the lock
  // (not another thread's call it waits behind), and is cleared before the
  // lock is let go.
  template <typename F>
  auto Interruptible(F call) -> decltype(call()) {
    using Result = decltype(call());
    struct Interrupt {
      std::mutex mu;
      bool requested = false;  // By the caller's signal handler.
      bool running = false;    // The call holds the client's lock.
    } interrupt;
    std::packaged_task<Result()> task([this, &call, &interrupt]() -> Result {
      std::lock_guard<std::mutex> serial(mu_);
      {
        std::lock_guard<std::mutex> lock(interrupt.mu);
        if (interrupt.requested) {
          throw StatusException(absl::CancelledError("interrupted before it started"));
        }
        interrupt.running = true;
      }
      const absl::Cleanup cleared = [this, &interrupt] {
        std::lock_guard<std::mutex> lock(interrupt.mu);
        interrupt.running = false;
        if (interrupt.requested) client_->ClearInterrupt();
      };
      return call();
    });
    std::future<Result> done = task.get_future();
    bool interrupted = false;
    {
      py::gil_scoped_release release;
      std::thread worker(std::move(task));
      while (done.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
        py::gil_scoped_acquire acquire;
        if (PyErr_CheckSignals() != 0) {
          interrupted = true;
          std::lock_guard<std::mutex> lock(interrupt.mu);
          interrupt.requested = true;
          if (interrupt.running) client_->Interrupt();
          break;
        }
      }
      worker.join();
    }
    if (interrupted) throw py::error_already_set();  // (The handler's exception, still set.)
    return done.get();                               // (Rethrows what the call threw.)
  }

  // Step or FinishStreamedStep on the two flat buffers, without the GIL.
  using StepFn = absl::StatusOr<StepResult> (TrainerClient::*)(
      int64_t, absl::Span<const float>, absl::Span<float>);
  py::dict RunStep(int64_t step, const py::buffer& grads, const py::buffer& params, StepFn fn) {
    const size_t n = CheckedSize();
    FloatBuffer g = RequestFloats(grads, n, false, "gradient buffer");
    FloatBuffer p = RequestFloats(params, n, true, "parameter buffer");
    const StepResult result = Interruptible([&] {
      return ValueOrThrow(
          (client_.get()->*fn)(step, absl::MakeConstSpan(g.data, n), absl::MakeSpan(p.data, n)));
    });
    return StepResultToDict(result);
  }

  // See TrainerClient::StepOnDevice: `grads` and `params` are addresses
  // (torch's data_ptr()) of layout().total_elements() floats each in the
  // device pairs' memory, alive and unchanged by the caller until it returns.
  py::dict StepOnDevice(int64_t step, uintptr_t grads, uintptr_t params) {
    CheckedSize();
    if (grads == 0 || params == 0) throw py::value_error("step_on_device: a null buffer address");
    const StepResult result = Interruptible([&] {
      return ValueOrThrow(client_->StepOnDevice(step, reinterpret_cast<const float*>(grads),
                                                reinterpret_cast<float*>(params)));
    });
    return StepResultToDict(result);
  }

  int64_t Pull(int64_t min_version, const py::buffer& params) {
    const size_t n = CheckedSize();
    FloatBuffer p = RequestFloats(params, n, true, "parameter buffer");
    return Interruptible(
        [&] { return ValueOrThrow(client_->Pull(min_version, absl::MakeSpan(p.data, n))); });
  }

  int64_t PullToResume(const py::buffer& params) {
    const size_t n = CheckedSize();
    FloatBuffer p = RequestFloats(params, n, true, "parameter buffer");
    return Interruptible(
        [&] { return ValueOrThrow(client_->PullToResume(absl::MakeSpan(p.data, n))); });
  }

  std::string Checkpoint(const std::string& directory, int64_t step) {
    return Interruptible([&] { return ValueOrThrow(client_->Checkpoint(directory, step)); });
  }

  std::vector<std::string> InspectJson() {
    // (Retried while a shard is down: Ctrl-C must reach it, as a step's.)
    return Interruptible([&] { return ValueOrThrow(client_->InspectJson()); });
  }

  void SetHyperparameters(int64_t effective_step, const std::string& optimizer,
                          const py::dict& hyperparameters) {
    const OptimizerConfig config = OptimizerFromKwargs(optimizer, hyperparameters);
    Interruptible([&] {
      ThrowIfError(client_->SetHyperparameters(effective_step, config, LrSchedule()));
    });
  }

  // {"version": V, "optimizer": name, "hyperparameters": kwargs}: what step
  // V + 1 runs with (TrainerClient::NextStepHyperparameters).
  py::dict NextHyperparameters() {
    const TrainerClient::NextHyperparameters next =
        Interruptible([&] { return ValueOrThrow(client_->NextStepHyperparameters()); });
    py::dict out;
    out["version"] = next.version;
    out["optimizer"] = OptimizerKindName(next.optimizer.kind);
    out["hyperparameters"] = OptimizerToKwargs(next.optimizer);
    return out;
  }

  void CancelHyperparameters(int64_t effective_step) {
    Interruptible([&] { ThrowIfError(client_->CancelHyperparameters(effective_step)); });
  }

  int64_t registered_version() {
    CheckedSize();
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> serial(mu_);
    return client_->registered_version();
  }
  int64_t last_pushed_step() {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> serial(mu_);
    return client_->last_pushed_step();
  }
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
  // (Atomic counters of connections fixed at Connect: no lock, so that a
  // monitoring thread never waits out a step.)
  int64_t failed_attempts() const { return client_->failed_attempts(); }
  double loss_scale() const {
    return Serial([&] { return client_->loss_scale(); });
  }
  int64_t replayed_pushes() const {
    return Serial([&] { return client_->replayed_pushes(); });
  }
  void WaitForEveryTrainer(int64_t step) {
    CheckedSize();
    Interruptible([&] { ThrowIfError(client_->WaitForEveryTrainer(step)); });
  }
  void Finish(int64_t step) {
    CheckedSize();
    Interruptible([&] { ThrowIfError(client_->Finish(step)); });
  }
  // (A registration on another thread rebuilds the transports these read.)
  int64_t shared_memory_transfers() const {
    return Serial([&] { return client_->shared_memory_transfers(); });
  }
  int64_t socket_transfers() const {
    return Serial([&] { return client_->socket_transfers(); });
  }
  int64_t device_pair_transfers() const {
    return Serial([&] { return client_->device_pair_transfers(); });
  }
  int64_t device_buffer_transfers() const {
    return Serial([&] { return client_->device_buffer_transfers(); });
  }
  std::string device_pair_kind() const {
    return Serial([&] { return client_->device_pair_kind(); });
  }
  // One of the client's shared buffers as a Python buffer that keeps the
  // segment mapped (tensors made from it outlive the client), or None.
  py::object SharedBuffer(bool gradients) const {
    std::shared_ptr<const TrainerSegment> segment =
        Serial([&] { return client_->shared_segment(); });
    if (segment == nullptr) return py::none();
    return py::cast(
        SharedBufferView{segment, gradients ? segment->gradients() : segment->parameters()});
  }
  std::optional<int64_t> rolled_back_to() const {
    return Serial([&] { return client_->rolled_back_to(); });
  }

 private:
  // Runs a short read of the client under its lock, without the GIL (the
  // call it may wait behind can need the GIL to end).
  template <typename F>
  auto Serial(F read) const -> decltype(read()) {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> serial(mu_);
    return read();
  }
  // The registered model's layout, read without the client's lock (a call
  // of another thread may hold it); FAILED_PRECONDITION without one.
  std::shared_ptr<const ModelLayout> CheckedLayout() const {
    std::shared_ptr<const ModelLayout> layout = std::atomic_load(&layout_);
    if (layout == nullptr) {
      throw StatusException(absl::FailedPreconditionError("call register() first"));
    }
    return layout;
  }
  uint64_t CheckedSize() const { return CheckedLayout()->total_elements(); }

  // The gradient buffer of a streamed push in progress (see
  // BeginStreamedPush). Declared before client_: destroyed after it, once
  // the client's destructor has ended the push's thread.
  std::unique_ptr<FloatBuffer> streamed_grads_;
  std::unique_ptr<TrainerClient> client_;
  // Held (after the GIL is released) by every call into client_ but
  // MarkGradientReady and streamed_bytes_sent (the client locks those
  // itself), failed_attempts (atomic counters) and the fixed rank() and
  // shard_count().
  mutable std::mutex mu_;
  // A copy of the registered layout, null without a model (set by the
  // Python thread that registers; read without mu_, std::atomic_load).
  std::shared_ptr<const ModelLayout> layout_;
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
  // As a class attribute too: errors raised from Python (shardopt.torch's
  // own checks) carry their code as those from C++ do.
  ex.base.attr("code") = "UNKNOWN";
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
    // (Both arms as plain tuples: pybind11 3 types make_tuple's result.)
    py::tuple bases = builtin ? py::tuple(py::make_tuple(ex.base, py::handle(builtin)))
                              : py::tuple(py::make_tuple(ex.base));
    py::object cls = py::reinterpret_steal<py::object>(PyErr_NewException(
        absl::StrCat("shardopt._shardopt.", name).c_str(), bases.ptr(), nullptr));
    cls.attr("code") = absl::StatusCodeToString(code);
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
      .def("finish", &Client::Finish, py::arg("step"),
           "At the end of a job, after this trainer's last step `step` (every trainer calls "
           "it): returns once every shard holds every trainer's steps up to `step` and, where "
           "the shard servers keep periodic checkpoints (--checkpoint_dir), `step` is a "
           "committed one, so that a shard restarting afterwards comes back there and no "
           "trainer is needed any more. AbortedError with rolled_back_to set when the job had "
           "to roll back (pull_to_resume, train on, finish again).")
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
      .def("next_hyperparameters", &Client::NextHyperparameters,
           "What the model's next step runs with, as the shards say (a change scheduled for it "
           "included): {'version', 'optimizer', 'hyperparameters' (torch.optim's names)}.")
      .def("set_hyperparameters", &Client::SetHyperparameters, py::arg("effective_step"),
           py::arg("optimizer"), py::arg("hyperparameters"))
      .def("cancel_hyperparameters", &Client::CancelHyperparameters, py::arg("effective_step"),
           "Takes back the change this trainer sent for a step it has not pushed yet.")
      .def_property_readonly("registered_version", &Client::registered_version)
      .def_property_readonly("last_pushed_step", &Client::last_pushed_step,
                             "The highest step this trainer pushed (or began to push).")
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
