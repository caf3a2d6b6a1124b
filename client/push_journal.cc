#include "client/push_journal.h"

#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace shardopt {
namespace {

constexpr char kMagic[8] = {'S', 'H', 'O', 'P', 'T', 'J', 'R', '1'};

// Fixed-size part of the file, after the magic.
struct Header {
  int64_t step;
  double loss_scale;
  uint64_t payload_bytes;
  uint32_t trainer_rank;
  uint32_t dtype;
  uint32_t model_id_bytes;
  uint32_t reserved;
};

constexpr size_t kFixedBytes = sizeof(kMagic) + sizeof(Header);

}  // namespace

absl::Status WritePushJournal(const std::string& path, const JournaledPush& push, const void* data,
                              size_t bytes, FileEnv* env) {
  const Header h{push.step,
                 push.loss_scale,
                 bytes,
                 push.trainer_rank,
                 static_cast<uint32_t>(push.dtype),
                 static_cast<uint32_t>(push.model_id.size()),
                 0};
  absl::StatusOr<std::unique_ptr<AtomicFileWriter>> file = env->NewAtomicFile(path);
  if (!file.ok()) return file.status();
  for (const absl::string_view piece :
       {absl::string_view(kMagic, sizeof(kMagic)),
        absl::string_view(reinterpret_cast<const char*>(&h), sizeof(h)),
        absl::string_view(push.model_id), absl::string_view(static_cast<const char*>(data), bytes)}) {
    if (absl::Status s = (*file)->Append(piece); !s.ok()) return s;
  }
  return (*file)->Commit();
}

absl::StatusOr<JournaledPush> ReadPushJournal(const std::string& path, FileEnv* env) {
  absl::StatusOr<std::string> content = ReadFileToString(env, path);
  if (absl::IsNotFound(content.status())) {
    return absl::NotFoundError(absl::StrCat(path, ": no push journal"));
  }
  if (!content.ok()) return content.status();
  Header h;
  if (content->size() < kFixedBytes) {
    return absl::DataLossError(absl::StrCat(path, ": not a push journal"));
  }
  std::memcpy(&h, content->data() + sizeof(kMagic), sizeof(h));
  if (std::memcmp(content->data(), kMagic, sizeof(kMagic)) != 0 || h.model_id_bytes > 4096 ||
      h.dtype > static_cast<uint32_t>(DType::kFloat16)) {
    return absl::DataLossError(absl::StrCat(path, ": not a push journal"));
  }
  const uint64_t rest = content->size() - kFixedBytes;
  if (rest < h.model_id_bytes || rest - h.model_id_bytes != h.payload_bytes) {
    return absl::DataLossError(absl::StrCat(path, ": truncated or overlong push journal"));
  }
  JournaledPush push;
  push.step = h.step;
  push.loss_scale = h.loss_scale;
  push.trainer_rank = h.trainer_rank;
  push.dtype = static_cast<DType>(h.dtype);
  push.model_id = content->substr(kFixedBytes, h.model_id_bytes);
  const char* payload = content->data() + kFixedBytes + h.model_id_bytes;
  push.payload.assign(payload, payload + h.payload_bytes);
  return push;
}

}  // namespace shardopt
