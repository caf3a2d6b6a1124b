#include "python/py_conversions.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace shardopt {
namespace py_binding {

Exceptions& GetExceptions() {
  static Exceptions* exceptions = new Exceptions();
  return *exceptions;
}

void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) throw StatusException(status);
}

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

namespace {

OptimizerConfig OptimizerFromKwargsUnchecked(const std::string& name, const py::dict& kw) {
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
      // (A negative number would read as None here: refused, as torch does.)
      if (!eps.first.is_none() && !(c.eps1 >= 0.0)) {
        throw py::value_error(
            absl::StrCat("INVALID_ARGUMENT: epsilon1 should be >= 0 but is: ", c.eps1));
      }
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

}  // namespace

py::dict OptimizerToKwargs(const OptimizerConfig& c) {
  py::dict kw;
  kw["lr"] = c.lr;
  kw["weight_decay"] = c.weight_decay;
  const auto betas = [&] { kw["betas"] = py::make_tuple(c.beta1, c.beta2); };
  switch (c.kind) {
    case OptimizerKind::kSgd:
      kw["momentum"] = c.momentum;
      kw["dampening"] = c.dampening;
      kw["nesterov"] = c.nesterov;
      break;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      betas();
      kw["eps"] = c.eps;
      kw["amsgrad"] = c.amsgrad;
      break;
    case OptimizerKind::kAdagrad:
      kw["lr_decay"] = c.lr_decay;
      kw["initial_accumulator_value"] = c.initial_accumulator_value;
      kw["eps"] = c.eps;
      break;
    case OptimizerKind::kLion:
      betas();
      break;
    case OptimizerKind::kLamb:
      betas();
      kw["eps"] = c.eps;
      kw["min_trust_ratio"] = c.min_trust_ratio;
      kw["max_trust_ratio"] = c.max_trust_ratio;
      kw["bias_correction"] = c.bias_correction;
      break;
    case OptimizerKind::kAdafactor:
      kw["beta2_decay"] = c.beta2_decay;
      kw["eps"] = py::make_tuple(c.eps1 < 0 ? py::object(py::none()) : py::float_(c.eps1), c.eps2);
      kw["d"] = c.clip_threshold;
      break;
    case OptimizerKind::kMuon:
      kw["momentum"] = c.momentum;
      kw["nesterov"] = c.nesterov;
      kw["ns_coefficients"] = py::make_tuple(c.ns_a, c.ns_b, c.ns_c);
      kw["eps"] = c.eps;
      kw["ns_steps"] = c.ns_steps;
      kw["adjust_lr_fn"] = c.adjust_lr == MuonAdjustLr::kMatchRmsAdamW
                               ? py::object(py::str("match_rms_adamw"))
                               : py::object(py::none());
      break;
  }
  // (Muon has no maximize in torch.optim.)
  if (c.kind != OptimizerKind::kMuon) kw["maximize"] = c.maximize;
  return kw;
}

OptimizerConfig OptimizerFromKwargs(const std::string& name, const py::dict& kw) {
  try {
    return OptimizerFromKwargsUnchecked(name, kw);
  } catch (const py::cast_error&) {
    // pybind11's own text names no key ("Unable to cast Python instance").
    std::string given;
    for (const auto& [key, value] : kw) {
      absl::StrAppend(&given, given.empty() ? "" : ", ", std::string(py::str(key)), "=",
                      std::string(py::repr(value)));
    }
    throw py::type_error(
        absl::StrCat(name,
                     " hyperparameters must be numbers (betas a pair, eps of adafactor a pair, "
                     "ns_coefficients three numbers, flags booleans); got ",
                     given));
  }
}

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
  d["applied_here"] = r.applied_here;
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
    // None is "not set" (os.environ.get of an unset variable), not "None".
    if (!value.is_none()) *field->second = py::str(value);
  }
  return s;
}

}  // namespace py_binding
}  // namespace shardopt
