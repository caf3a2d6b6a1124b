// make_seeds: writes the seed corpus of the fuzzers (tools/fuzz/corpus/),
// one valid input (or a few) per fuzzer, so that fuzzing starts from inputs
// that reach deep into each parser:
//   bazel run //tools/fuzz:make_seeds -- $PWD/tools/fuzz/corpus
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/checkpoint_files.h"
#include "common/file.h"
#include "common/layout.h"
#include "common/optimizer_config.h"
#include "common/proto_convert.h"
#include "proto/shardopt/v1/shard_service.pb.h"

namespace shardopt {
namespace {

std::string Record(const std::string& bytes) {
  std::string out;
  out.push_back(static_cast<char>(bytes.size() & 0xff));
  out.push_back(static_cast<char>(bytes.size() >> 8));
  return out + bytes;
}

std::string U32(uint32_t v) {
  std::string out;
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return out;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

void Write(const std::string& dir, const std::string& name, const std::string& bytes) {
  if (!FileEnv::Default()->CreateDirs(dir).ok()) std::exit(1);
  std::ofstream out(JoinPath(dir, name), std::ios::binary | std::ios::trunc);
  out << bytes;
}

void ServiceSeeds(const std::string& dir) {
  const ModelLayout layout = ModelLayout::Create({{"w", {5, 3}}, {"b", {3}}}, 4, 1).value();
  v1::RegisterModelRequest attach;
  attach.mutable_header()->mutable_config()->set_model_id("");
  *attach.mutable_header()->mutable_config()->mutable_layout() = LayoutToProto(layout);
  attach.mutable_header()->set_attach_only(true);
  Write(dir, "register", std::string(1, 0) + Record(attach.SerializeAsString()));

  v1::PushGradientsRequest header;
  header.mutable_header()->set_step(1);
  header.mutable_header()->set_num_elements(layout.ShardSize(0));
  std::vector<float> grad(layout.ShardSize(0), 0.0f);
  for (const TensorPlacement& t : layout.tensors()) {
    for (uint64_t i = 0; i < t.size; ++i) grad[t.offset + i] = 0.125f;
  }
  v1::PushGradientsRequest chunk;
  chunk.mutable_chunk()->set_data(grad.data(), grad.size() * sizeof(float));
  Write(dir, "push",
        std::string(1, 1) + Record(header.SerializeAsString()) + Record(chunk.SerializeAsString()));

  v1::PullParametersRequest pull;
  pull.set_wait_only(false);
  Write(dir, "pull", std::string(1, 2) + Record(pull.SerializeAsString()));
  v1::GetStepStatsRequest stats;
  stats.set_step(1);
  Write(dir, "stats", std::string(1, 3) + Record(stats.SerializeAsString()));
  v1::SetHyperparametersRequest change;
  change.set_effective_step(5);
  change.mutable_optimizer()->mutable_adam()->set_lr(0.001);
  Write(dir, "hyperparameters", std::string(1, 4) + Record(change.SerializeAsString()));
  v1::CheckpointRequest checkpoint;
  checkpoint.set_directory("ck");
  Write(dir, "checkpoint", std::string(1, 5) + Record(checkpoint.SerializeAsString()));
  v1::InspectRequest inspect;
  inspect.set_slice_length(5);
  inspect.set_tensor_name("b");
  Write(dir, "inspect", std::string(1, 6) + Record(inspect.SerializeAsString()));
  Write(dir, "inspect_garbage", std::string(1, 6) + Record("\xff\xff\xff\xff\x0f"));
  Write(dir, "rollback", std::string(1, 7) + Record(v1::RollBackRequest().SerializeAsString()));
}

void PullFrameSeeds(const std::string& dir) {
  v1::PullParametersResponse response;
  response.set_version(3);
  response.set_lr(0.01);
  const std::vector<float> values = {1, 2, 3, 4};
  response.mutable_chunk()->set_offset(2);
  response.mutable_chunk()->set_data(values.data(), values.size() * sizeof(float));
  Write(dir, "fp32", std::string(1, static_cast<char>(8 << 2)) + response.SerializeAsString());
  const std::vector<uint16_t> half = {0x3c00, 0x4000};
  response.mutable_chunk()->set_data(half.data(), half.size() * sizeof(uint16_t));
  Write(dir, "fp16",
        std::string(1, static_cast<char>((8 << 2) | 2)) + response.SerializeAsString());
}

void SafetensorsSeeds(const std::string& dir) {
  const std::string header =
      R"({"__metadata__":{"step":"3"},"b":{"dtype":"F16","shape":[2],"data_offsets":[8,12]},)"
      R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string file = U32(static_cast<uint32_t>(header.size())) + U32(0) + header;
  const float w[2] = {0.5f, -1.0f};
  file.append(reinterpret_cast<const char*>(w), sizeof(w));
  file.append("\x00\x3c\x00\x40", 4);
  Write(dir, "two_tensors", file);
}

// One committed one-shard checkpoint of `optimizer` on `layout`, as a seed.
void CheckpointSeed(const std::string& dir, const std::string& name, const ModelLayout& layout,
                    const OptimizerConfig& optimizer) {
  char scratch[] = "/tmp/shardopt_seed_checkpoint_XXXXXX";
  const std::string ck = mkdtemp(scratch);
  v1::ModelConfig config;
  config.set_model_id("m");
  *config.mutable_layout() = LayoutToProto(layout);
  *config.mutable_optimizer() = OptimizerConfigToProto(optimizer);
  config.set_num_trainers(1);
  config.set_shard_count(1);
  v1::CheckpointProgress progress;
  progress.set_version(2);
  progress.set_optimizer_steps(2);
  absl::StatusOr<CheckpointPartWritten> written = WriteCheckpointPart(
      ck, config, 0, progress, [](int section, uint64_t offset, uint64_t count, float* out) {
        for (uint64_t i = 0; i < count; ++i) out[i] = 0.25f * section + 0.001f * (offset + i);
        return absl::OkStatus();
      });
  if (!written.ok() || !written->committed) {
    fprintf(stderr, "make_seeds: %s\n", written.status().ToString().c_str());
    std::exit(1);
  }
  const std::string manifest = ReadAll(JoinPath(ck, kCheckpointManifestFile));
  Write(dir, name,
        U32(static_cast<uint32_t>(manifest.size())) + manifest +
            ReadAll(JoinPath(ck, CheckpointDataFileName(0, 1))));
}

void CheckpointSeeds(const std::string& dir) {
  CheckpointSeed(dir, "adam_two_steps",
                 ModelLayout::Create({{"w", {5, 3}}, {"b", {3}}}, 4, 1).value(),
                 OptimizerConfig::Adam(0.01));
  // Format 2: packed sections (Adafactor's factors).
  CheckpointSeed(dir, "adafactor_two_steps",
                 ModelLayout::Create({{"w", {5, 3}}, {"b", {3}}, {"c", {2, 2, 3}}}, 4, 1,
                                     Partition::kWholeTensors)
                     .value(),
                 OptimizerConfig::Adafactor(0.01));
}

void TextSeeds(const std::string& dir) {
  Write(dir, "tokens",
        Record("# job\ntrainer aaaaaaaaaaaaaaaaaaaa\nreadonly bbbbbbbbbbbbbbbbbbbb\n") +
            Record("Bearer aaaaaaaaaaaaaaaaaaaa") + "/tmp/ckpt/mlp");
  Write(dir, "nul_path", Record("trainer x") + Record("") + std::string("/tmp/ck_b\0evil", 14));
}

}  // namespace
}  // namespace shardopt

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: make_seeds CORPUS_DIR\n");
    return 2;
  }
  const std::string root = argv[1];
  shardopt::ServiceSeeds(root + "/service_fuzzer");
  shardopt::PullFrameSeeds(root + "/pull_frame_fuzzer");
  shardopt::SafetensorsSeeds(root + "/safetensors_fuzzer");
  shardopt::CheckpointSeeds(root + "/checkpoint_fuzzer");
  shardopt::TextSeeds(root + "/text_fuzzer");
  printf("seeds written under %s\n", root.c_str());
  return 0;
}
