#include "tools/ctl/checkpoint_commands.h"

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <map>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checkpoint_files.h"
#include "common/file.h"
#include "common/layout.h"
#include "common/proto_convert.h"
#include "common/safetensors.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "tools/ctl/table.h"

namespace shardopt::ctl {
namespace {

// Elements moved at a time: bounded memory whatever the model's size.
constexpr uint64_t kBlockElements = uint64_t{1} << 20;

int Fail(const char* command, const absl::Status& status) {
  fprintf(stderr, "shardoptctl %s: %s\n", command, status.ToString().c_str());
  return 1;
}

std::string ToJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(message, &json, options).ok()) return "{}";
  return json;
}

absl::StatusOr<v1::ServerInfo> Info(const CheckpointOptions& options, const std::string& server,
                                    absl::Duration timeout) {
  auto stub =
      v1::ShardService::NewStub(options.channels.NewChannel(server, grpc::ChannelArguments()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::ServerInfo info;
  grpc::Status s = stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info);
  if (!s.ok()) {
    return absl::UnavailableError(absl::StrCat(server, ": ", s.error_message()));
  }
  return info;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Section `section` (0: the parameters, then the optimizer's slots) of
// tensor `t` as a safetensors tensor, in torch.optim's state shapes
// (OptimizerConfig::TorchStateOf); nullopt when the slot holds nothing for
// it (Adafactor's col_var of a vector).
struct ExportedTensor {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t elements = 0;  // Of `shape`.
  uint64_t held = 0;      // The first ones, which the checkpoint keeps; the rest are zero.
};

std::optional<ExportedTensor> ExportedTensorOf(const OptimizerConfig& optimizer, int section,
                                               const TensorPlacement& t) {
  if (section == 0) return ExportedTensor{t.spec.name, t.spec.shape, t.size, t.size};
  std::optional<OptimizerConfig::TorchStateTensor> state =
      optimizer.TorchStateOf(section - 1, t.spec.shape);
  if (!state.has_value()) return std::nullopt;
  uint64_t elements = 1;
  for (int64_t d : state->shape) elements *= static_cast<uint64_t>(d);
  const uint64_t stored = optimizer.StoredSlotElements(section - 1, t.spec.shape, t.size);
  return ExportedTensor{OptimizerStateTensorName(state->key, t.spec.name), state->shape, elements,
                        std::min(elements, stored)};
}

}  // namespace

std::string OptimizerStateTensorName(const std::string& slot, const std::string& tensor) {
  return absl::StrCat("optimizer.", slot, ".", tensor);
}

int Checkpoint(const CheckpointOptions& options, FILE* out) {
  if (options.model.empty() || options.directory.empty() == !options.periodic) {
    fprintf(stderr,
            "shardoptctl checkpoint: --model and one of --dir and --periodic are required\n");
    return 2;
  }
  const std::string where = options.periodic ? "the servers' --checkpoint_dir" : options.directory;
  int64_t step = options.step;
  const size_t n = options.servers.size();
  for (size_t i = 0; i < n; ++i) {
    const std::string& server = options.servers[i];
    absl::StatusOr<v1::ServerInfo> info = Info(options, server, absl::Seconds(10));
    if (!info.ok()) return Fail("checkpoint", info.status());
    // Every shard, in order: a checkpoint commits only with every part.
    if (info->shard_count() != n || info->shard_index() != i) {
      return Fail("checkpoint", absl::InvalidArgumentError(
                                    absl::StrCat(server, " is shard ", info->shard_index(), " of ",
                                                 info->shard_count(), ", not shard ", i, " of ", n,
                                                 ": give --servers every shard, in shard order")));
    }
    bool found = false;
    for (const v1::ModelSummary& m : info->models()) {
      if (m.model_id() != options.model) continue;
      found = true;
      if (options.step >= 0) continue;
      // The latest version any shard has: shards still behind (mid-step)
      // wait for it, so all save the same step. Asynchronous models: the
      // highest step any trainer has applied on any shard (a uniform cut the
      // others wait for; versions count pushes there).
      if (m.consistency() == v1::CONSISTENCY_SYNC) {
        step = std::max(step, m.version());
      } else {
        step = std::max<int64_t>(step, 0);
        for (int64_t applied : m.trainer_steps()) step = std::max(step, applied);
      }
    }
    if (!found) {
      return Fail("checkpoint", absl::NotFoundError(absl::StrCat("model '", options.model,
                                                                 "' is not on ", server)));
    }
  }
  std::vector<v1::CheckpointResponse> responses(n);
  std::vector<grpc::Status> statuses(n);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      auto stub = v1::ShardService::NewStub(
          options.channels.NewChannel(options.servers[i], grpc::ChannelArguments()));
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + options.timeout));
      v1::CheckpointRequest request;
      request.set_model_id(options.model);
      request.set_directory(options.directory);
      request.set_periodic(options.periodic);
      request.set_step(step);
      request.set_shard_index(static_cast<uint32_t>(i));
      // The shard answers before the deadline with what it still waits for.
      request.set_max_wait_ms(absl::ToInt64Milliseconds(
          std::max(options.timeout * 0.9, options.timeout - absl::Seconds(5))));
      statuses[i] = stub->Checkpoint(&context, request, &responses[i]);
    });
  }
  for (std::thread& t : threads) t.join();
  Table table({"shard", "server", "step", "bytes", "file", "result"});
  bool all_ok = true;
  std::string manifest;
  for (size_t i = 0; i < n; ++i) {
    const v1::CheckpointResponse& r = responses[i];
    if (!statuses[i].ok()) {
      all_ok = false;
      table.AddRow({absl::StrCat(i), options.servers[i], absl::StrCat(step), "-", "-",
                    absl::StrCat("error: ", statuses[i].error_message())});
      continue;
    }
    if (!r.manifest().empty()) manifest = r.manifest();
    table.AddRow({absl::StrCat(i), options.servers[i], absl::StrCat(r.step()),
                  absl::StrCat(r.bytes_written()), r.part_file(),
                  r.committed() ? "ok, committed the manifest" : "ok"});
  }
  table.Print(out);
  if (all_ok && !manifest.empty()) {
    fprintf(out, "checkpoint of model '%s' at step %lld committed: %s\n", options.model.c_str(),
            static_cast<long long>(step), manifest.c_str());
    return 0;
  }
  // Say so: the parts written stay in the directory, and a run again (same
  // step, same directory) writes only the missing ones.
  fprintf(out,
          "checkpoint of model '%s' at step %lld NOT committed: %s; the parts written are in "
          "%s (run the same command again to complete it)\n",
          options.model.c_str(), static_cast<long long>(step),
          !all_ok            ? "some shards failed (above)"
          : options.periodic ? "every shard wrote its part but none committed the manifest (do "
                               "the servers share one --checkpoint_dir?)"
                             : "every shard wrote its part but none committed the manifest (is "
                               "--dir one directory every server sees?)",
          where.c_str());
  return 1;
}

int Export(const CheckpointOptions& options, FILE* out) {
  if (options.directory.empty() || options.safetensors.empty()) {
    fprintf(stderr, "shardoptctl export: --checkpoint and --out are required\n");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<CheckpointReader>> checkpoint =
      CheckpointReader::Open(options.directory);
  if (!checkpoint.ok()) return Fail("export", checkpoint.status());
  const CheckpointReader& ckpt = **checkpoint;
  const int sections = options.optimizer_state ? static_cast<int>(ckpt.section_names().size()) : 1;
  // Each section's tensors, in the layout's order.
  struct ExportedEntry {
    int section;
    const TensorPlacement* placement;
    ExportedTensor tensor;
  };
  std::vector<ExportedEntry> exported;
  std::vector<SafetensorsWriter::TensorSpec> specs;
  for (int section = 0; section < sections; ++section) {
    for (const TensorPlacement& t : ckpt.layout().tensors()) {
      std::optional<ExportedTensor> e = ExportedTensorOf(ckpt.optimizer(), section, t);
      if (!e.has_value()) continue;
      specs.push_back({e->name, e->shape});
      exported.push_back({section, &t, *std::move(e)});
    }
  }
  const v1::ModelConfig& config = ckpt.manifest().config();
  const v1::CheckpointProgress& progress = ckpt.manifest().parts(0).progress();
  if (!PartsCountStepsAlike(ckpt.manifest())) {
    fprintf(stderr,
            "shardoptctl export: warning: the checkpoint's parts count their optimizer steps "
            "differently (a step some shards skipped and others applied); "
            "shardopt.optimizer_steps is part 0's (%lld)\n",
            static_cast<long long>(progress.optimizer_steps()));
  }
  std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {"shardopt.model_id", config.model_id()},
      {"shardopt.step", absl::StrCat(ckpt.step())},
      {"shardopt.optimizer", ToJson(progress.current_optimizer())},
      {"shardopt.optimizer_steps", absl::StrCat(progress.optimizer_steps())},
  };
  absl::StatusOr<std::unique_ptr<SafetensorsWriter>> writer =
      SafetensorsWriter::Create(options.safetensors, specs, metadata);
  if (!writer.ok()) return Fail("export", writer.status());
  std::vector<float> block;
  uint64_t elements = 0;
  for (const ExportedEntry& entry : exported) {
    const ExportedTensor& e = entry.tensor;
    for (uint64_t done = 0; done < e.elements; done += kBlockElements) {
      const uint64_t n = std::min(kBlockElements, e.elements - done);
      block.assign(n, 0.0f);
      const uint64_t held = done < e.held ? std::min(n, e.held - done) : 0;
      if (held > 0) {
        if (absl::Status s =
                ckpt.Read(entry.section, entry.placement->offset + done, held, block.data());
            !s.ok()) {
          return Fail("export", s);
        }
      }
      if (absl::Status s = (*writer)->Append(block.data(), n); !s.ok()) {
        return Fail("export", s);
      }
      elements += n;
    }
  }
  if (absl::Status s = (*writer)->Finish(); !s.ok()) return Fail("export", s);
  fprintf(out, "exported model '%s' step %lld: %zu tensors, %llu values -> %s\n",
          config.model_id().c_str(), static_cast<long long>(ckpt.step()), specs.size(),
          static_cast<unsigned long long>(elements), options.safetensors.c_str());
  return 0;
}

int Import(const CheckpointOptions& options, FILE* out) {
  if (options.directory.empty() || options.safetensors.empty() || options.out.empty()) {
    fprintf(stderr, "shardoptctl import: --safetensors, --checkpoint and --out are required\n");
    return 2;
  }
  // A new directory: one that holds a checkpoint already would be kept as
  // it is (the writer takes the same checkpoint for already written) and
  // the import reported done with none of the file's values in it.
  absl::StatusOr<std::vector<std::string>> existing =
      FileEnv::Default()->ListDirectory(options.out);
  if (existing.ok() && !existing->empty()) {
    return Fail("import", absl::AlreadyExistsError(absl::StrCat(
                              options.out, " is not empty: import into a new directory")));
  }
  absl::StatusOr<std::unique_ptr<CheckpointReader>> checkpoint =
      CheckpointReader::Open(options.directory);
  if (!checkpoint.ok()) return Fail("import", checkpoint.status());
  const CheckpointReader& templ = **checkpoint;
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> file =
      SafetensorsReader::Open(options.safetensors);
  if (!file.ok()) return Fail("import", file.status());
  const SafetensorsReader& st = **file;

  // Every tensor of the layout, with its shape; the optimizer state when the
  // file has all of it (a file with only part of it is refused).
  const std::vector<std::string>& sections = templ.section_names();
  // An optimizer without slots (plain SGD) has state only in its progress:
  // kept when the file was exported from this model's checkpoint.
  auto step = st.metadata().find("shardopt.step");
  bool with_state = sections.size() > 1 ||
                    (step != st.metadata().end() && step->second == absl::StrCat(templ.step()));
  std::string missing_state;  // The first optimizer state tensor the file lacks.
  int state_tensors_found = 0;
  for (size_t section = 0; section < sections.size(); ++section) {
    for (const TensorPlacement& t : templ.layout().tensors()) {
      std::optional<ExportedTensor> e =
          ExportedTensorOf(templ.optimizer(), static_cast<int>(section), t);
      if (!e.has_value()) continue;
      absl::StatusOr<const SafetensorsTensorInfo*> info = st.Find(e->name);
      if (!info.ok()) {
        if (section == 0) {
          return Fail("import", absl::NotFoundError(
                                    absl::StrCat(options.safetensors, " has no tensor '", e->name,
                                                 "', which the model's layout holds")));
        }
        with_state = false;
        if (missing_state.empty()) missing_state = e->name;
        continue;
      }
      if (section > 0) ++state_tensors_found;
      if ((*info)->shape != e->shape) {
        return Fail("import", absl::InvalidArgumentError(absl::StrCat(
                                  options.safetensors, ": tensor '", e->name, "' has shape ",
                                  ShapeString((*info)->shape), " where the model's ",
                                  section == 0 ? "layout" : "optimizer state", " has ",
                                  ShapeString(e->shape))));
      }
    }
  }
  if (state_tensors_found > 0 && !missing_state.empty()) {
    // Part of the state would be dropped with the rest: say so instead of
    // starting fresh without a word.
    return Fail("import",
                absl::NotFoundError(absl::StrCat(
                    options.safetensors, " holds optimizer state but not '", missing_state,
                    "': export with --optimizer_state from this model, or leave out "
                    "every optimizer.* tensor to start with fresh state")));
  }
  if (with_state && (step == st.metadata().end() || step->second != absl::StrCat(templ.step()))) {
    // Moments of another step with this step's counters would be wrong
    // silently.
    return Fail("import", absl::FailedPreconditionError(absl::StrCat(
                              options.safetensors, " holds optimizer state of step ",
                              step == st.metadata().end() ? "(unknown)" : step->second,
                              " but the template checkpoint is at step ", templ.step())));
  }
  v1::ModelConfig config = templ.manifest().config();
  config.set_shard_count(1);
  absl::StatusOr<ModelLayout> layout = LayoutFromProto(config.layout(), 1);
  if (!layout.ok()) return Fail("import", layout.status());
  *config.mutable_layout() = LayoutToProto(*layout);
  // With the optimizer state, the run continues where the template was;
  // without, these weights start a new run at step 0.
  v1::CheckpointProgress progress;
  if (with_state) {
    progress = templ.manifest().parts(0).progress();
  } else {
    progress.set_version(0);
    if (config.consistency() != v1::CONSISTENCY_SYNC) {
      // An asynchronous model's record of each trainer's applied step.
      for (uint32_t t = 0; t < config.num_trainers(); ++t) progress.add_trainer_steps(0);
    }
    *progress.mutable_current_optimizer() = config.optimizer();
    *progress.mutable_current_lr_schedule() = config.lr_schedule();
  }
  const std::vector<TensorPlacement>& tensors = layout->tensors();
  absl::StatusOr<CheckpointPartWritten> written = WriteCheckpointPart(
      options.out, config, 0, progress,
      [&](int section, uint64_t offset, uint64_t count, float* values) -> absl::Status {
        const float initial = section == 0 ? 0.0f : templ.optimizer().InitialSlotValue(section - 1);
        std::fill(values, values + count, initial);
        if (section > 0 && !with_state) return absl::OkStatus();
        // (One shard: range-local offsets are flat ones. Only the tensors
        // in the window: a packed slot is asked for one run per tensor.)
        for (const TensorPiece& piece : layout->PiecesIn(FlatRange{offset, offset + count})) {
          const TensorPlacement& t = tensors[piece.tensor_index];
          // A packed slot (Adafactor's factors, in torch's shapes in the
          // file) fills only the first elements of each tensor's part.
          std::optional<ExportedTensor> e = ExportedTensorOf(templ.optimizer(), section, t);
          if (!e.has_value()) continue;
          const uint64_t lo = piece.flat_offset;
          const uint64_t hi = std::min(piece.flat_offset + piece.size, t.offset + e->held);
          if (lo >= hi) continue;
          if (absl::Status s =
                  st.ReadAsFloat(e->name, lo - t.offset, hi - lo, values + (lo - offset));
              !s.ok()) {
            return s;
          }
        }
        return absl::OkStatus();
      });
  if (!written.ok()) return Fail("import", written.status());
  fprintf(out, "imported %s into %s: model '%s' at step %lld (%s)\n", options.safetensors.c_str(),
          options.out.c_str(), config.model_id().c_str(),
          static_cast<long long>(progress.version()),
          with_state ? "with its optimizer state" : "fresh optimizer state");
  return 0;
}

}  // namespace shardopt::ctl
