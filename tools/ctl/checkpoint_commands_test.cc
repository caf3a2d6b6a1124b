// shardoptctl checkpoint / export / import against real servers: a trained
// model is checkpointed by every shard, exported to safetensors (checked by
// our reader and by PyTorch), imported back into a checkpoint and restored
// on another shard count, where it trains on exactly like the original.
#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/trainer_client.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "tests/support/process.h"
#include "tests/support/synthetic.h"

namespace shardopt::testing {
namespace {

std::pair<int, std::string> RunCtl(const std::string& args) {
  return RunShell(absl::StrCat(Runfile("tools/ctl/shardoptctl"), " ", args));
}

struct Trainer {
  std::unique_ptr<TrainerClient> client;
  std::vector<float> params;
};

Trainer Connect(const std::vector<std::string>& servers, const ModelSpec& spec,
                const std::vector<float>* initial) {
  Trainer t;
  t.client = TrainerClient::Connect(servers, TrainerClientOptions()).value();
  const absl::Status s = initial ? t.client->Register(spec, *initial) : t.client->Attach(spec);
  EXPECT_TRUE(s.ok()) << s;
  t.params = t.client->NewFlatBuffer();
  EXPECT_TRUE(t.client->Pull(t.client->registered_version(), absl::MakeSpan(t.params)).ok());
  return t;
}

void Train(Trainer& t, int64_t from, int64_t to) {
  std::vector<float> grad = t.client->NewFlatBuffer();
  for (int64_t step = from; step <= to; ++step) {
    SyntheticGradient(t.client->layout(), t.params, 0, step, 5, absl::MakeSpan(grad));
    absl::StatusOr<StepResult> r = t.client->Step(step, grad, absl::MakeSpan(t.params));
    ASSERT_TRUE(r.ok()) << r.status();
  }
}

TEST(CheckpointCommandsTest, CheckpointExportImportRestore) {
  const ModelSpec spec = SyntheticModelSpec("exp_model", OptimizerConfig::AdamW(0.01), 1);
  auto servers = StartCluster(2);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const ModelLayout layout2 = ModelLayout::Create(spec.tensors, spec.alignment, 2).value();
  const std::vector<float> initial = SyntheticInitialParams(layout2, 5);
  Trainer original = Connect(Addresses(*servers), spec, &initial);
  Train(original, 1, 3);

  const std::string root = MakeTempDir("ctl_ckpt");
  auto [rc, out] =
      RunCtl(absl::StrCat("checkpoint --model=exp_model --dir=", root,
                          "/ckpt --servers=", absl::StrJoin(Addresses(*servers), ",")));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("committed"), std::string::npos) << out;
  EXPECT_NE(out.find("at step 3"), std::string::npos) << out;

  const std::string file = root + "/model.safetensors";
  std::tie(rc, out) =
      RunCtl(absl::StrCat("export --optimizer_state --checkpoint=", root, "/ckpt --out=", file));
  ASSERT_EQ(rc, 0) << out;

  // Our reader: every tensor by name, equal to what the trainer pulled.
  std::unique_ptr<SafetensorsReader> reader = SafetensorsReader::Open(file).value();
  EXPECT_EQ(reader->metadata().at("shardopt.step"), "3");
  EXPECT_EQ(reader->metadata().at("shardopt.model_id"), "exp_model");
  std::ofstream index(root + "/expected_index.json");
  std::ofstream values(root + "/values.bin", std::ios::binary);
  std::vector<std::string> entries;
  uint64_t offset = 0;
  for (const SafetensorsTensorInfo& info : reader->tensors()) {
    uint64_t n = 1;
    for (int64_t d : info.shape) n *= static_cast<uint64_t>(d);
    std::vector<float> got(n);
    ASSERT_TRUE(reader->ReadAsFloat(info.name, 0, n, got.data()).ok());
    if (info.name.rfind("optimizer.", 0) != 0) {
      const TensorPlacement& t = layout2.tensors()[layout2.Find(info.name).value()];
      for (uint64_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[i], original.params[t.offset + i]) << info.name << "[" << i << "]";
      }
    }
    values.write(reinterpret_cast<const char*>(got.data()), n * sizeof(float));
    entries.push_back(absl::StrCat("{\"name\": \"", info.name, "\", \"shape\": [",
                                   absl::StrJoin(info.shape, ", "), "], \"offset\": ", offset,
                                   "}"));
    offset += n;
  }
  EXPECT_EQ(reader->tensors().size(), 3 * layout2.tensors().size());  // params, exp_avg, exp_avg_sq
  std::vector<std::string> metadata;
  for (const auto& [k, v] : reader->metadata()) {
    std::string escaped;
    for (char c : v) {
      if (c == '"' || c == '\\') escaped += '\\';
      escaped += c;
    }
    metadata.push_back(absl::StrCat("\"", k, "\": \"", escaped, "\""));
  }
  index << "{\"tensors\": [" << absl::StrJoin(entries, ", ") << "], \"metadata\": {"
        << absl::StrJoin(metadata, ", ") << "}}";
  index.close();
  values.close();
  ASSERT_EQ(std::system(absl::StrCat("mkdir -p ", root, "/expected && mv ", root,
                                     "/expected_index.json ", root, "/expected/index.json && mv ",
                                     root, "/values.bin ", root, "/expected/")
                            .c_str()),
            0);
  // PyTorch (Debian's python3-torch) reads it by name, with a reader written
  // from the format's description and, where the interpreter has it, with
  // the safetensors package.
  const char* python = std::getenv("SHARDOPT_PYTHON");
  std::tie(rc, out) = RunShell(absl::StrCat(python && *python ? python : "/usr/bin/python3", " ",
                                            Runfile("tests/safetensors_torch_check.py"), " ", file,
                                            " ", root, "/expected"));
  EXPECT_EQ(rc, 0) << out;
  std::cout << "python check: " << out << std::endl;

  // Import into a new checkpoint and restore it on 3 shards: the model
  // continues exactly as the original does.
  std::tie(rc, out) = RunCtl(absl::StrCat("import --safetensors=", file, " --checkpoint=", root,
                                          "/ckpt --out=", root, "/imported"));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("with its optimizer state"), std::string::npos) << out;
  {
    // A file that lacks one of the model's tensors is refused by name.
    const TensorPlacement& first = layout2.tensors()[0];
    auto partial = SafetensorsWriter::Create(root + "/partial.safetensors",
                                             {{first.spec.name, first.spec.shape}}, {})
                       .value();
    ASSERT_TRUE(partial->Append(original.params.data() + first.offset, first.size).ok());
    ASSERT_TRUE(partial->Finish().ok());
    std::tie(rc, out) = RunCtl(absl::StrCat("import --safetensors=", root,
                                            "/partial.safetensors --checkpoint=", root,
                                            "/ckpt --out=", root, "/partial"));
    EXPECT_EQ(rc, 1) << out;
    EXPECT_NE(out.find("has no tensor '" + layout2.tensors()[1].spec.name + "'"), std::string::npos)
        << out;
  }
  auto restored = StartCluster(3, {"--restore_from=" + root + "/imported"});
  ASSERT_TRUE(restored.ok()) << restored.status();
  Trainer resumed = Connect(Addresses(*restored), spec, nullptr);
  EXPECT_EQ(resumed.client->registered_version(), 3);
  const ModelLayout layout3 = ModelLayout::Create(spec.tensors, spec.alignment, 3).value();
  for (const TensorPlacement& t : layout2.tensors()) {
    const TensorPlacement& u = layout3.tensors()[layout3.Find(t.spec.name).value()];
    for (uint64_t i = 0; i < t.size; ++i) {
      ASSERT_EQ(resumed.params[u.offset + i], original.params[t.offset + i]) << t.spec.name;
    }
  }
  Train(original, 4, 6);
  Train(resumed, 4, 6);
  for (const TensorPlacement& t : layout2.tensors()) {
    const TensorPlacement& u = layout3.tensors()[layout3.Find(t.spec.name).value()];
    for (uint64_t i = 0; i < t.size; ++i) {
      ASSERT_EQ(resumed.params[u.offset + i], original.params[t.offset + i]) << t.spec.name;
    }
  }
}

// Adafactor's state through export and import: the file holds each slot in
// torch.optim.Adafactor's state shapes (row_var (R, 1), col_var (1, C),
// "variance" of a vector or scalar), which import takes back; a file with a
// slot in another shape (full-size, as exports before this one were) is
// refused naming both shapes, and the imported model continues exactly as
// the original does.
TEST(CheckpointCommandsTest, AdafactorFactorsExportAndImport) {
  const ModelSpec spec =
      SyntheticModelSpec("factored", OptimizerByName("adafactor").value(), /*num_trainers=*/1);
  auto servers = StartCluster(2);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const ModelLayout layout2 =
      ModelLayout::Create(spec.tensors, spec.alignment, 2, spec.partition).value();
  const std::vector<float> initial = SyntheticInitialParams(layout2, 5);
  Trainer original = Connect(Addresses(*servers), spec, &initial);
  Train(original, 1, 3);
  const std::string root = MakeTempDir("ctl_adafactor");
  auto [rc, out] =
      RunCtl(absl::StrCat("checkpoint --model=factored --dir=", root,
                          "/ckpt --servers=", absl::StrJoin(Addresses(*servers), ",")));
  ASSERT_EQ(rc, 0) << out;
  const std::string exported = root + "/exported.safetensors";
  std::tie(rc, out) = RunCtl(
      absl::StrCat("export --optimizer_state --checkpoint=", root, "/ckpt --out=", exported));
  ASSERT_EQ(rc, 0) << out;

  std::unique_ptr<SafetensorsReader> reader = SafetensorsReader::Open(exported).value();
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const SafetensorsTensorInfo& info : reader->tensors()) shapes[info.name] = info.shape;
  const std::map<std::string, std::vector<int64_t>> want = {
      {"embed.weight", {37, 19}},
      {"layer1.weight", {19, 23}},
      {"layer1.bias", {23}},
      {"layer2.weight", {23, 5}},
      {"layer2.bias", {5}},
      {"temperature", {}},
      {"optimizer.row_var.embed.weight", {37, 1}},
      {"optimizer.col_var.embed.weight", {1, 19}},
      {"optimizer.row_var.layer1.weight", {19, 1}},
      {"optimizer.col_var.layer1.weight", {1, 23}},
      {"optimizer.variance.layer1.bias", {23}},
      {"optimizer.row_var.layer2.weight", {23, 1}},
      {"optimizer.col_var.layer2.weight", {1, 5}},
      {"optimizer.variance.layer2.bias", {5}},
      {"optimizer.variance.temperature", {}},
  };
  EXPECT_EQ(shapes, want);
  // Factors of squared gradients after three steps: positive everywhere.
  std::vector<float> rows(37);
  ASSERT_TRUE(reader->ReadAsFloat("optimizer.row_var.embed.weight", 0, 37, rows.data()).ok());
  for (float v : rows) EXPECT_GT(v, 0.0f);

  // The same file with embed.weight's row_var full-size.
  const std::string full_size = root + "/full_size.safetensors";
  {
    std::vector<SafetensorsWriter::TensorSpec> specs;
    for (const SafetensorsTensorInfo& info : reader->tensors()) {
      specs.push_back({info.name, info.name == "optimizer.row_var.embed.weight"
                                      ? std::vector<int64_t>{37, 19}
                                      : info.shape});
    }
    auto writer = SafetensorsWriter::Create(full_size, specs, reader->metadata()).value();
    for (size_t i = 0; i < specs.size(); ++i) {
      const SafetensorsTensorInfo& info = reader->tensors()[i];
      uint64_t n = 1;
      for (int64_t d : specs[i].shape) n *= static_cast<uint64_t>(d);
      std::vector<float> values(n, 0.0f);
      ASSERT_TRUE(reader->ReadAsFloat(info.name, 0, info.num_elements(), values.data()).ok());
      ASSERT_TRUE(writer->Append(values.data(), n).ok());
    }
    ASSERT_TRUE(writer->Finish().ok());
  }
  std::tie(rc, out) =
      RunCtl(absl::StrCat("import --safetensors=", full_size, " --checkpoint=", root,
                          "/ckpt --out=", root, "/refused"));
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("'optimizer.row_var.embed.weight' has shape [37, 19] where the model's "
                     "optimizer state has [37, 1]"),
            std::string::npos)
      << out;

  // The same file without one state tensor: refused naming it, not
  // imported with fresh state.
  const std::string partial = root + "/partial.safetensors";
  {
    std::vector<SafetensorsWriter::TensorSpec> specs;
    for (const SafetensorsTensorInfo& info : reader->tensors()) {
      if (info.name != "optimizer.col_var.layer2.weight") specs.push_back({info.name, info.shape});
    }
    auto writer = SafetensorsWriter::Create(partial, specs, reader->metadata()).value();
    for (const SafetensorsTensorInfo& info : reader->tensors()) {
      if (info.name == "optimizer.col_var.layer2.weight") continue;
      std::vector<float> values(info.num_elements());
      ASSERT_TRUE(reader->ReadAsFloat(info.name, 0, values.size(), values.data()).ok());
      ASSERT_TRUE(writer->Append(values.data(), values.size()).ok());
    }
    ASSERT_TRUE(writer->Finish().ok());
  }
  std::tie(rc, out) = RunCtl(absl::StrCat("import --safetensors=", partial, " --checkpoint=", root,
                                          "/ckpt --out=", root, "/partial"));
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("holds optimizer state but not 'optimizer.col_var.layer2.weight'"),
            std::string::npos)
      << out;

  const std::string edited = exported;
  std::tie(rc, out) = RunCtl(absl::StrCat("import --safetensors=", edited, " --checkpoint=", root,
                                          "/ckpt --out=", root, "/imported"));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("with its optimizer state"), std::string::npos) << out;

  auto restored = StartCluster(3, {"--restore_from=" + root + "/imported"});
  ASSERT_TRUE(restored.ok()) << restored.status();
  Trainer resumed = Connect(Addresses(*restored), spec, nullptr);
  EXPECT_EQ(resumed.client->registered_version(), 3);
  Train(original, 4, 6);
  Train(resumed, 4, 6);
  const ModelLayout layout3 =
      ModelLayout::Create(spec.tensors, spec.alignment, 3, spec.partition).value();
  for (const TensorPlacement& t : layout2.tensors()) {
    const TensorPlacement& u = layout3.tensors()[layout3.Find(t.spec.name).value()];
    for (uint64_t i = 0; i < t.size; ++i) {
      ASSERT_EQ(resumed.params[u.offset + i], original.params[t.offset + i]) << t.spec.name;
    }
  }
}

// Weights alone of an asynchronous model start a new run at step 0 that a
// server restores: the import records every trainer at step 0 (it recorded
// none, and the server refused to start: "a record of 0 trainers").
TEST(CheckpointCommandsTest, AnAsynchronousModelsWeightsImportAndRestore) {
  ModelSpec spec = SyntheticModelSpec("async_weights", OptimizerConfig::Adam(0.01), 1);
  spec.consistency = Consistency::kAsync;
  auto servers = StartCluster(1);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const ModelLayout layout = ModelLayout::Create(spec.tensors, spec.alignment, 1).value();
  const std::vector<float> initial = SyntheticInitialParams(layout, 5);
  std::unique_ptr<TrainerClient> trainer =
      TrainerClient::Connect(Addresses(*servers), TrainerClientOptions()).value();
  ASSERT_TRUE(trainer->Register(spec, initial).ok());
  std::vector<float> grad(layout.total_elements()), params = initial;
  SyntheticGradient(layout, params, 0, 1, 5, absl::MakeSpan(grad));
  {
    const absl::StatusOr<StepResult> stepped = trainer->Step(1, grad, absl::MakeSpan(params));
    ASSERT_TRUE(stepped.ok()) << stepped.status();
  }
  const std::string root = MakeTempDir("ctl_async");
  auto [rc, out] = RunCtl(absl::StrCat("checkpoint --model=async_weights --dir=", root,
                                       "/ckpt --servers=", Addresses(*servers)[0]));
  ASSERT_EQ(rc, 0) << out;
  std::tie(rc, out) =
      RunCtl(absl::StrCat("export --checkpoint=", root, "/ckpt --out=", root, "/w.safetensors"));
  ASSERT_EQ(rc, 0) << out;
  std::tie(rc, out) = RunCtl(absl::StrCat("import --safetensors=", root, "/w.safetensors",
                                          " --checkpoint=", root, "/ckpt --out=", root, "/new"));
  ASSERT_EQ(rc, 0) << out;
  // Into a directory that holds a checkpoint already: refused (it reported
  // done and kept the old values).
  std::tie(rc, out) = RunCtl(absl::StrCat("import --safetensors=", root, "/w.safetensors",
                                          " --checkpoint=", root, "/ckpt --out=", root, "/new"));
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("is not empty: import into a new directory"), std::string::npos) << out;

  auto restored = StartCluster(1, {"--restore_from=" + root + "/new"});
  ASSERT_TRUE(restored.ok()) << restored.status();
  std::unique_ptr<TrainerClient> resumer =
      TrainerClient::Connect(Addresses(*restored), TrainerClientOptions()).value();
  ASSERT_TRUE(resumer->Attach(spec).ok());
  std::vector<float> resumed(layout.total_elements());
  EXPECT_EQ(resumer->PullToResume(absl::MakeSpan(resumed)).value(), 0);
  EXPECT_EQ(resumed, params);
  EXPECT_TRUE(resumer->Step(1, grad, absl::MakeSpan(resumed)).ok());
}

// A checkpoint that did not commit says so (the command exited 1 with a
// table of "ok" rows), and --servers must name every shard in order.
TEST(CheckpointCommandsTest, ACheckpointThatDidNotCommitSaysSo) {
  const ModelSpec spec = SyntheticModelSpec("uncommitted", OptimizerConfig::Sgd(0.1), 1);
  auto servers = StartCluster(2);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const ModelLayout layout = ModelLayout::Create(spec.tensors, spec.alignment, 2).value();
  const std::vector<float> initial = SyntheticInitialParams(layout, 5);
  Trainer trainer = Connect(Addresses(*servers), spec, &initial);
  const std::string root = MakeTempDir("ctl_uncommitted");
  const std::vector<std::string> addresses = Addresses(*servers);
  auto [rc, out] = RunCtl(
      absl::StrCat("checkpoint --model=uncommitted --dir=", root, "/a --servers=", addresses[1]));
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("is shard 1 of 2, not shard 0 of 1: give --servers every shard, in shard "
                     "order"),
            std::string::npos)
      << out;
  // A step no trainer reaches: each shard gives up waiting for it.
  std::tie(rc, out) =
      RunCtl(absl::StrCat("checkpoint --model=uncommitted --step=9 --timeout_s=2 --dir=", root,
                          "/b --servers=", absl::StrJoin(addresses, ",")));
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("at step 9 NOT committed: some shards failed"), std::string::npos) << out;
}

// --periodic: into the servers' own --checkpoint_dir, the checkpoint a
// restart restores (a step no multiple of --checkpoint_every); servers that
// keep none refuse it.
TEST(CheckpointCommandsTest, APeriodicCheckpointIsWhatARestartRestores) {
  const ModelSpec spec = SyntheticModelSpec("periodic", OptimizerConfig::AdamW(0.01), 1);
  const std::string root = MakeTempDir("ctl_periodic");
  const std::vector<std::string> flags = CrashRecoveryFlags(root + "/ckpt", 10);
  auto servers = StartCluster(2, flags);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::vector<std::string> addresses = Addresses(*servers);
  const ModelLayout layout = ModelLayout::Create(spec.tensors, spec.alignment, 2).value();
  const std::vector<float> initial = SyntheticInitialParams(layout, 5);
  std::vector<float> params;
  {
    Trainer trainer = Connect(addresses, spec, &initial);
    ASSERT_NO_FATAL_FAILURE(Train(trainer, 1, 3));
    params = trainer.params;
  }
  auto [rc, out] = RunCtl(absl::StrCat("checkpoint --model=periodic --periodic --dir=", root,
                                       "/x --servers=", absl::StrJoin(addresses, ",")));
  EXPECT_EQ(rc, 2) << out;  // Both: which?
  std::tie(rc, out) = RunCtl(absl::StrCat("checkpoint --model=periodic --periodic --servers=",
                                          absl::StrJoin(addresses, ",")));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find(absl::StrCat("at step 3 committed: ", root, "/ckpt/periodic/step-00000003/")),
            std::string::npos)
      << out;
  for (uint32_t i = 0; i < 2; ++i) {
    (*servers)[i]->process().Signal(SIGKILL);
    ASSERT_TRUE((*servers)[i]->process().Wait(absl::Seconds(10)).has_value());
    auto restarted = StartServerAt(addresses[i], i, 2, flags);
    ASSERT_TRUE(restarted.ok()) << restarted.status();
    (*servers)[i] = std::move(*restarted);
  }
  Trainer resumed = Connect(addresses, spec, nullptr);
  EXPECT_EQ(resumed.client->registered_version(), 3);
  EXPECT_EQ(resumed.params, params);

  auto plain = StartCluster(1);
  ASSERT_TRUE(plain.ok()) << plain.status();
  const ModelLayout layout1 = ModelLayout::Create(spec.tensors, spec.alignment, 1).value();
  const std::vector<float> initial1 = SyntheticInitialParams(layout1, 5);
  Trainer other = Connect(Addresses(*plain), spec, &initial1);
  std::tie(rc, out) = RunCtl(
      absl::StrCat("checkpoint --model=periodic --periodic --servers=", Addresses(*plain)[0]));
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("keeps no periodic checkpoints"), std::string::npos) << out;
}

TEST(CheckpointCommandsTest, BadInputsAreRefusedWithTheReason) {
  const std::string root = MakeTempDir("ctl_bad");
  auto [rc, out] = RunCtl(absl::StrCat("export --checkpoint=", root, " --out=", root, "/x"));
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("manifest.json"), std::string::npos) << out;
  std::tie(rc, out) = RunCtl("export --checkpoint=" + root);
  EXPECT_EQ(rc, 2) << out;
  std::tie(rc, out) = RunCtl("checkpoint --servers=127.0.0.1:1 --model=m --dir=" + root);
  EXPECT_EQ(rc, 1) << out;
}

}  // namespace
}  // namespace shardopt::testing
