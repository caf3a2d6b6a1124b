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

namespace {

// The fixed part and the model id, checked against the file's size; the
// payload too when `with_payload`, read straight into place.
absl::StatusOr<JournaledPush> Read(const std::string& path, FileEnv* env, bool with_payload) {
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> file = env->NewRandomAccessFile(path);
  if (absl::IsNotFound(file.status())) {
    return absl::NotFoundError(absl::StrCat(path, ": no push journal"));
  }
  if (!file.ok()) return file.status();
  absl::StatusOr<FileInfo> info = (*file)->Stat();
  if (!info.ok()) return info.status();
  char fixed[kFixedBytes];
  absl::StatusOr<size_t> got = (*file)->Read(0, kFixedBytes, fixed);
  if (!got.ok()) return got.status();
  if (*got < kFixedBytes) return absl::DataLossError(absl::StrCat(path, ": not a push journal"));
  Header h;
  std::memcpy(&h, fixed + sizeof(kMagic), sizeof(h));
  if (std::memcmp(fixed, kMagic, sizeof(kMagic)) != 0 || h.model_id_bytes > 4096 ||
      h.dtype > static_cast<uint32_t>(DType::kFloat16)) {
    return absl::DataLossError(absl::StrCat(path, ": not a push journal"));
  }
  const uint64_t rest = info->size - kFixedBytes;
  if (rest < h.model_id_bytes || rest - h.model_id_bytes != h.payload_bytes) {
    return absl::DataLossError(absl::StrCat(path, ": truncated or overlong push journal"));
  }
  JournaledPush push;
  push.step = h.step;
  push.loss_scale = h.loss_scale;
  push.trainer_rank = h.trainer_rank;
  push.dtype = static_cast<DType>(h.dtype);
  push.model_id.resize(h.model_id_bytes);
  auto read_exactly = [&](uint64_t offset, size_t bytes, char* out) -> absl::Status {
    absl::StatusOr<size_t> read = (*file)->Read(offset, bytes, out);
    if (!read.ok()) return read.status();
    if (*read != bytes) {
      return absl::DataLossError(absl::StrCat(path, ": truncated or overlong push journal"));
    }
    return absl::OkStatus();
  };
  if (absl::Status s = read_exactly(kFixedBytes, h.model_id_bytes, push.model_id.data()); !s.ok()) {
    return s;
  }
  if (with_payload) {
    push.payload.resize(h.payload_bytes);
    if (absl::Status s = read_exactly(kFixedBytes + h.model_id_bytes, h.payload_bytes,
                                      push.payload.data());
        !s.ok()) {
      return s;
    }
  }
  return push;
}

}  // namespace

absl::StatusOr<JournaledPush> ReadPushJournal(const std::string& path, FileEnv* env) {
  return Read(path, env, /*with_payload=*/true);
}

absl::StatusOr<JournaledPush> ReadPushJournalHeader(const std::string& path, FileEnv* env) {
  return Read(path, env, /*with_payload=*/false);
}

}  // namespace shardopt
