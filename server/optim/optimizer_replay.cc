// optimizer_replay IN OUT: runs a sequence of gradients through an Optimizer.
//
// IN is one text line, then raw little-endian float32 data:
//   shardopt-replay-v1 kind=adam lr=0.001 ... n=N steps=S [chunks=C]\n
//   N floats: the initial parameters
//   S * N floats: the gradients of steps 1..S, one step after the other
// The keys are the OptimizerConfig field names (kind as OptimizerKindName,
// bools as 0/1, doubles in any strtod form); absent keys keep the defaults of
// the kind's OptimizerConfig factory. chunks (default 1) splits every step's
// Update into that many uneven, consecutive ranges. shapes=4x7,5,2x3x9 lays
// tensors of those shapes one after the other (their sizes must add up to
// N; default: one tensor of N): whole-tensor optimizers (lamb, adafactor)
// update each whole, in one Update of the whole range (chunks ignored).
//
// OUT is one text line, then raw little-endian float32 data:
//   slots=NAME,NAME,...\n
//   N floats: the final parameters
//   N floats per slot, in slot_names() order
#include <cstdint>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/optimizer_config.h"
#include "server/optim/optimizer.h"

namespace shardopt {
namespace {

constexpr char kMagic[] = "shardopt-replay-v1";

struct Replay {
  OptimizerConfig config;
  size_t n = 0;
  int64_t steps = 0;
  size_t chunks = 1;
  std::vector<std::vector<int64_t>> shapes;  // Empty: one tensor of n.
};

absl::StatusOr<OptimizerKind> ParseKind(absl::string_view name) {
  for (OptimizerKind k : {OptimizerKind::kSgd, OptimizerKind::kAdam, OptimizerKind::kAdamW,
                          OptimizerKind::kAdagrad, OptimizerKind::kLion, OptimizerKind::kLamb,
                          OptimizerKind::kAdafactor, OptimizerKind::kMuon}) {
    if (name == OptimizerKindName(k)) return k;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown kind: ", name));
}

absl::StatusOr<Replay> ParseHeader(const std::string& line) {
  std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
  if (fields.empty() || fields[0] != kMagic) {
    return absl::InvalidArgumentError(absl::StrCat("not a ", kMagic, " file"));
  }
  Replay r;
  // The kind first, so that its factory supplies the defaults.
  for (absl::string_view f : fields) {
    if (absl::StartsWith(f, "kind=")) {
      absl::StatusOr<OptimizerKind> kind = ParseKind(f.substr(5));
      if (!kind.ok()) return kind.status();
      switch (*kind) {
        case OptimizerKind::kSgd:
          r.config = OptimizerConfig::Sgd(1e-3);
          break;
        case OptimizerKind::kAdam:
          r.config = OptimizerConfig::Adam();
          break;
        case OptimizerKind::kAdamW:
          r.config = OptimizerConfig::AdamW();
          break;
        case OptimizerKind::kAdagrad:
          r.config = OptimizerConfig::Adagrad();
          break;
        case OptimizerKind::kLion:
          r.config = OptimizerConfig::Lion();
          break;
        case OptimizerKind::kLamb:
          r.config = OptimizerConfig::Lamb();
          break;
        case OptimizerKind::kAdafactor:
          r.config = OptimizerConfig::Adafactor();
          break;
        case OptimizerKind::kMuon:
          r.config = OptimizerConfig::Muon();
          break;
      }
    }
  }
  OptimizerConfig& c = r.config;
  struct DoubleField {
    const char* name;
    double* value;
  };
  const DoubleField doubles[] = {
      {"lr", &c.lr},
      {"weight_decay", &c.weight_decay},
      {"momentum", &c.momentum},
      {"dampening", &c.dampening},
      {"beta1", &c.beta1},
      {"beta2", &c.beta2},
      {"eps", &c.eps},
      {"lr_decay", &c.lr_decay},
      {"initial_accumulator_value", &c.initial_accumulator_value},
      {"min_trust_ratio", &c.min_trust_ratio},
      {"max_trust_ratio", &c.max_trust_ratio},
      {"beta2_decay", &c.beta2_decay},
      {"eps1", &c.eps1},
      {"eps2", &c.eps2},
      {"clip_threshold", &c.clip_threshold},
      {"ns_a", &c.ns_a},
      {"ns_b", &c.ns_b},
      {"ns_c", &c.ns_c},
  };
  struct BoolField {
    const char* name;
    bool* value;
  };
  const BoolField bools[] = {{"maximize", &c.maximize},
                             {"nesterov", &c.nesterov},
                             {"amsgrad", &c.amsgrad},
                             {"bias_correction", &c.bias_correction}};
  for (size_t i = 1; i < fields.size(); ++i) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(fields[i], '=');
    const absl::string_view key = kv.first;
    const absl::string_view value = kv.second;
    bool ok = false;
    bool known = false;
    if (key == "kind") {
      known = ok = true;
    } else if (key == "n") {
      uint64_t n = 0;
      known = true;
      ok = absl::SimpleAtoi(value, &n);
      r.n = n;
    } else if (key == "steps") {
      known = true;
      ok = absl::SimpleAtoi(value, &r.steps) && r.steps >= 0;
    } else if (key == "chunks") {
      uint64_t chunks = 0;
      known = true;
      ok = absl::SimpleAtoi(value, &chunks) && chunks >= 1;
      r.chunks = chunks;
    } else if (key == "ns_steps") {
      known = true;
      ok = absl::SimpleAtoi(value, &r.config.ns_steps);
    } else if (key == "adjust_lr") {
      known = true;
      ok = value == "original" || value == "match_rms_adamw";
      r.config.adjust_lr =
          value == "original" ? MuonAdjustLr::kOriginal : MuonAdjustLr::kMatchRmsAdamW;
    } else if (key == "shapes") {
      known = ok = true;
      for (absl::string_view shape : absl::StrSplit(value, ',')) {
        std::vector<int64_t> dims;
        for (absl::string_view d : absl::StrSplit(shape, 'x', absl::SkipEmpty())) {
          int64_t dim = 0;
          ok = ok && absl::SimpleAtoi(d, &dim) && dim >= 0;
          dims.push_back(dim);
        }
        r.shapes.push_back(std::move(dims));
      }
    }
    for (const DoubleField& d : doubles) {
      if (key == d.name) {
        known = true;
        ok = absl::SimpleAtod(value, d.value);
      }
    }
    for (const BoolField& b : bools) {
      if (key == b.name) {
        known = true;
        ok = value == "0" || value == "1";
        *b.value = value == "1";
      }
    }
    if (!known || !ok) {
      return absl::InvalidArgumentError(absl::StrCat("bad header field: ", fields[i]));
    }
  }
  return r;
}

absl::Status ReadFloats(std::istream& in, std::vector<float>& out) {
  in.read(reinterpret_cast<char*>(out.data()),
          static_cast<std::streamsize>(out.size() * sizeof(float)));
  if (static_cast<size_t>(in.gcount()) != out.size() * sizeof(float)) {
    return absl::DataLossError("input file is too short");
  }
  return absl::OkStatus();
}

absl::Status Run(const char* in_path, const char* out_path) {
  static_assert(sizeof(float) == 4, "float32 expected");
  std::ifstream in(in_path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", in_path));
  std::string line;
  if (!std::getline(in, line)) return absl::DataLossError("missing header line");
  absl::StatusOr<Replay> replay = ParseHeader(line);
  if (!replay.ok()) return replay.status();
  const size_t n = replay->n;

  std::vector<RangeTensor> tensors;
  if (replay->shapes.empty()) replay->shapes.push_back({static_cast<int64_t>(n)});
  uint64_t offset = 0;
  for (const std::vector<int64_t>& shape : replay->shapes) {
    uint64_t size = 1;
    for (int64_t d : shape) size *= static_cast<uint64_t>(d);
    tensors.push_back(RangeTensor{offset, size, shape});
    offset += size;
  }
  if (offset != n) {
    return absl::InvalidArgumentError(absl::StrCat("shapes hold ", offset, " elements, not n=", n));
  }
  absl::StatusOr<std::unique_ptr<Optimizer>> opt =
      Optimizer::Create(replay->config, n, std::move(tensors));
  if (!opt.ok()) return opt.status();

  std::vector<float> params(n);
  if (absl::Status s = ReadFloats(in, params); !s.ok()) return s;
  std::vector<float> grad(n);
  const size_t chunks = (*opt)->needs_whole_tensors() ? 1 : replay->chunks;
  for (int64_t step = 1; step <= replay->steps; ++step) {
    if (absl::Status s = ReadFloats(in, grad); !s.ok()) return s;
    // Uneven consecutive ranges: piece k ends at n * (k+1)^2 / chunks^2.
    size_t begin = 0;
    for (size_t k = 1; k <= chunks; ++k) {
      const size_t end =
          k == chunks
              ? n
              : static_cast<size_t>(static_cast<unsigned __int128>(n) * k * k / (chunks * chunks));
      (*opt)->Update(step, params.data(), grad.data(), begin, end);
      begin = end;
    }
  }
  if (in.peek() != std::char_traits<char>::eof()) {
    return absl::DataLossError("trailing data after the last gradient");
  }

  std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", out_path));
  out << "slots=" << absl::StrJoin((*opt)->slot_names(), ",") << "\n";
  out.write(reinterpret_cast<const char*>(params.data()),
            static_cast<std::streamsize>(n * sizeof(float)));
  for (size_t i = 0; i < (*opt)->slot_names().size(); ++i) {
    const std::vector<float> slot = (*opt)->SlotValues(i);
    out.write(reinterpret_cast<const char*>(slot.data()),
              static_cast<std::streamsize>(slot.size() * sizeof(float)));
  }
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("error writing ", out_path));
  std::cerr << "optimizer_replay: " << replay->config.DebugString() << ", n=" << n
            << ", steps=" << replay->steps << ", chunks=" << chunks << "\n";
  return absl::OkStatus();
}

}  // namespace
}  // namespace shardopt

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: optimizer_replay IN OUT\n";
    return 2;
  }
  absl::Status s = shardopt::Run(argv[1], argv[2]);
  if (!s.ok()) {
    std::cerr << "optimizer_replay: " << s << "\n";
    return 1;
  }
  return 0;
}
