#include "client/push_journal.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>

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

}  // namespace

absl::Status WritePushJournal(const std::string& path, const JournaledPush& push, const void* data,
                              size_t bytes) {
  const std::string temp = absl::StrCat(path, ".tmp.", ::getpid());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    Header h{push.step,
             push.loss_scale,
             bytes,
             push.trainer_rank,
             static_cast<uint32_t>(push.dtype),
             static_cast<uint32_t>(push.model_id.size()),
             0};
    out.write(kMagic, sizeof(kMagic));
    out.write(reinterpret_cast<const char*>(&h), sizeof(h));
    out.write(push.model_id.data(), static_cast<std::streamsize>(push.model_id.size()));
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
    if (!out.good()) return absl::InternalError(absl::StrCat(temp, ": cannot write the journal"));
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat(path, ": cannot replace the journal"));
  }
  return absl::OkStatus();
}

absl::StatusOr<JournaledPush> ReadPushJournal(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": no push journal"));
  char magic[sizeof(kMagic)];
  Header h;
  in.read(magic, sizeof(magic));
  in.read(reinterpret_cast<char*>(&h), sizeof(h));
  if (!in || std::memcmp(magic, kMagic, sizeof(kMagic)) != 0 || h.model_id_bytes > 4096 ||
      h.dtype > static_cast<uint32_t>(DType::kFloat16)) {
    return absl::DataLossError(absl::StrCat(path, ": not a push journal"));
  }
  JournaledPush push;
  push.step = h.step;
  push.loss_scale = h.loss_scale;
  push.trainer_rank = h.trainer_rank;
  push.dtype = static_cast<DType>(h.dtype);
  push.model_id.resize(h.model_id_bytes);
  in.read(push.model_id.data(), h.model_id_bytes);
  push.payload.resize(h.payload_bytes);
  in.read(push.payload.data(), static_cast<std::streamsize>(h.payload_bytes));
  if (!in || in.peek() != std::char_traits<char>::eof()) {
    return absl::DataLossError(absl::StrCat(path, ": truncated or overlong push journal"));
  }
  return push;
}

}  // namespace shardopt
