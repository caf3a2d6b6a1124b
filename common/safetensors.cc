#include "common/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/dtype_convert.h"
#include "common/file.h"
#include "nlohmann/json.hpp"

// The format is little-endian and we move fp32 data between memory and the
// file without byte swapping.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes little-endian");

namespace shardopt {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

constexpr char kMetadataKey[] = "__metadata__";
constexpr uint64_t kSizeFieldBytes = 8;

// `status` (from the file layer) with `prefix` in front of its message.
absl::Status Prefixed(const std::string& prefix, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

std::string ReaderPrefix(const std::string& path) {
  return absl::StrCat("safetensors file '", path, "': ");
}

std::string WriterPrefix(const std::string& path) {
  return absl::StrCat("safetensors writer for '", path, "': ");
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

bool ParseDType(const std::string& name, DType* dtype) {
  if (name == "F32") {
    *dtype = DType::kFloat32;
  } else if (name == "BF16") {
    *dtype = DType::kBFloat16;
  } else if (name == "F16") {
    *dtype = DType::kFloat16;
  } else {
    return false;
  }
  return true;
}

// Product of `shape`, false on overflow of uint64 (a negative dimension is the
// caller's to refuse first).
bool ElementCount(const std::vector<int64_t>& shape, uint64_t* count) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  *count = n;
  return true;
}

void EncodeU64(uint64_t value, unsigned char out[8]) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(value >> (8 * i));
}

uint64_t DecodeU64(const unsigned char in[8]) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | in[i];
  return value;
}

// A JSON value as the reader expects it: an unsigned integer. nlohmann keeps
// non-negative integers as number_unsigned, negatives as number_integer and
// anything with a fraction or exponent as number_float, all of which the
// reference implementation (usize fields) refuses.
bool IsUnsigned(const Json& value) { return value.is_number_unsigned(); }

// `value` as JSON text for an error message, cut short if long.
std::string Excerpt(const Json& value) {
  std::string text = value.dump();
  if (text.size() > 80) text = absl::StrCat(text.substr(0, 77), "...");
  return text;
}

// Parses `text` as JSON, refusing duplicate keys in any object: nlohmann would
// keep the last one silently, and a checkpoint whose header says two things
// about one tensor is corrupt, not ambiguous. Sets *error and returns false on
// failure; never throws.
bool ParseHeaderJson(const std::string& text, Json* out, std::string* error) {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  size_t duplicate_depth = 0;
  auto callback = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!open_objects.empty() && duplicate.empty() &&
            !open_objects.back().insert(parsed.get<std::string>()).second) {
          duplicate = parsed.get<std::string>();
          duplicate_depth = open_objects.size();
        }
        break;
      default:
        break;
    }
    return true;
  };
  try {
    *out = Json::parse(text, callback);
  } catch (const Json::exception& e) {
    *error = absl::StrCat("header is not valid JSON: ", e.what());
    return false;
  }
  if (!duplicate.empty()) {
    *error = duplicate_depth == 1
                 ? absl::StrCat("header names tensor '", duplicate, "' more than once")
                 : absl::StrCat("header has key \"", duplicate,
                                "\" twice in one object (nesting depth ", duplicate_depth, ")");
    return false;
  }
  return true;
}

// One tensor entry of the header, checked on its own (the layout across
// tensors is checked once all are in).
absl::Status ParseTensorEntry(const std::string& prefix, const std::string& name, const Json& entry,
                              SafetensorsTensorInfo* info) {
  info->name = name;
  if (!entry.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "header entry of tensor '", name, "' is not a JSON object"));
  }
  // Fields beyond these three are ignored, as the reference implementation
  // does.
  const auto dtype_it = entry.find("dtype");
  const auto shape_it = entry.find("shape");
  const auto offsets_it = entry.find("data_offsets");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "tensor '", name, "' has no string \"dtype\""));
  }
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "tensor '", name, "' has no array \"shape\""));
  }
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !IsUnsigned((*offsets_it)[0]) || !IsUnsigned((*offsets_it)[1])) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "tensor '", name,
                     "' needs \"data_offsets\": [begin, end] of two non-negative integers, has ",
                     offsets_it == entry.end() ? std::string("none") : Excerpt(*offsets_it)));
  }
  const std::string dtype_name = dtype_it->get<std::string>();
  if (!ParseDType(dtype_name, &info->dtype)) {
    return absl::UnimplementedError(absl::StrCat(prefix, "tensor '", name, "' has dtype \"",
                                                 dtype_name,
                                                 "\"; shardopt reads only F32, BF16 and F16"));
  }
  info->shape.clear();
  for (const Json& dim : *shape_it) {
    if (!IsUnsigned(dim) ||
        dim.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "tensor '", name, "' has shape ",
                                                     Excerpt(*shape_it),
                                                     "; dimensions must be non-negative integers"));
    }
    info->shape.push_back(static_cast<int64_t>(dim.get<uint64_t>()));
  }
  info->data_begin = (*offsets_it)[0].get<uint64_t>();
  info->data_end = (*offsets_it)[1].get<uint64_t>();
  uint64_t elements = 0;
  uint64_t bytes = 0;
  if (!ElementCount(info->shape, &elements) ||
      __builtin_mul_overflow(elements, static_cast<uint64_t>(DTypeSize(info->dtype)), &bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "tensor '", name, "' has shape ",
                                                   ShapeString(info->shape),
                                                   " whose size overflows 64 bits"));
  }
  if (info->data_end < info->data_begin || info->data_end - info->data_begin != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "tensor '", name, "' has shape ", ShapeString(info->shape), " of ", dtype_name,
        " (", bytes, " bytes) but data_offsets [", info->data_begin, ", ", info->data_end, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

const char* SafetensorsDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "F32";
    case DType::kBFloat16:
      return "BF16";
    case DType::kFloat16:
      return "F16";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------
// SafetensorsWriter

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const std::string& path, std::vector<TensorSpec> tensors,
    std::map<std::string, std::string> metadata, FileEnv* env) {
  const std::string prefix = WriterPrefix(path);
  if (path.empty()) return absl::InvalidArgumentError("safetensors writer: empty path");

  OrderedJson header = OrderedJson::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::set<std::string> names;
  std::vector<uint64_t> ends;
  ends.reserve(tensors.size());
  uint64_t total = 0;
  for (const TensorSpec& t : tensors) {
    if (t.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "a tensor has an empty name"));
    }
    if (t.name == kMetadataKey) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "\"", kMetadataKey, "\" is reserved and cannot name a tensor"));
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "tensor name '", t.name, "' is declared twice"));
    }
    for (int64_t d : t.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(absl::StrCat(prefix, "tensor '", t.name,
                                                       "' has negative dimension in shape ",
                                                       ShapeString(t.shape)));
      }
    }
    uint64_t elements = 0;
    uint64_t end = 0;
    if (!ElementCount(t.shape, &elements) || __builtin_add_overflow(total, elements, &end) ||
        end > std::numeric_limits<uint64_t>::max() / sizeof(float)) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "tensor '", t.name, "' with shape ",
                                                     ShapeString(t.shape),
                                                     " makes the file's size overflow 64 bits"));
    }
    OrderedJson entry = OrderedJson::object();
    entry["dtype"] = "F32";
    entry["shape"] = t.shape;
    entry["data_offsets"] = OrderedJson::array({total * sizeof(float), end * sizeof(float)});
    header[t.name] = std::move(entry);
    total = end;
    ends.push_back(end);
  }

  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const OrderedJson::exception& e) {
    // dump() refuses strings that are not UTF-8.
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "tensor names and metadata must be valid UTF-8 (", e.what(), ")"));
  }
  // Spaces up to a multiple of 8, as the reference writer does, so that the
  // data buffer (at 8 + N) is 8-byte aligned in the file and in an mmap.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  if (header_text.size() > kSafetensorsMaxHeaderSize) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "header of ", header_text.size(),
                                                   " bytes exceeds the format's limit of ",
                                                   kSafetensorsMaxHeaderSize));
  }

  absl::StatusOr<std::unique_ptr<AtomicFileWriter>> file = env->NewAtomicFile(path);
  if (!file.ok()) return Prefixed(prefix, file.status());
  // Constructed before the header is written so that a failure below removes
  // the temp file through Fail().
  std::unique_ptr<SafetensorsWriter> writer(
      new SafetensorsWriter(path, std::move(*file), std::move(tensors), std::move(ends)));
  unsigned char size_field[kSizeFieldBytes];
  EncodeU64(header_text.size(), size_field);
  if (absl::Status s = writer->file_->Append(size_field, sizeof(size_field)); !s.ok()) {
    return writer->Fail(Prefixed(prefix, s));
  }
  if (absl::Status s = writer->file_->Append(header_text); !s.ok()) {
    return writer->Fail(Prefixed(prefix, s));
  }
  return writer;
}

SafetensorsWriter::SafetensorsWriter(std::string path, std::unique_ptr<AtomicFileWriter> file,
                                     std::vector<TensorSpec> tensors, std::vector<uint64_t> ends)
    : path_(std::move(path)),
      file_(std::move(file)),
      tensors_(std::move(tensors)),
      element_ends_(std::move(ends)),
      total_elements_(element_ends_.empty() ? 0 : element_ends_.back()) {}

SafetensorsWriter::~SafetensorsWriter() = default;

absl::Status SafetensorsWriter::Fail(absl::Status status) {
  file_.reset();  // Removes the temp file.
  failure_ = absl::FailedPreconditionError(
      absl::StrCat(WriterPrefix(path_), "unusable after an earlier error: ", status.message()));
  return status;
}

absl::Status SafetensorsWriter::Append(const float* data, size_t count) {
  if (!failure_.ok()) return failure_;
  const uint64_t left = total_elements_ - elements_written_;
  if (count > left) {
    return Fail(absl::OutOfRangeError(absl::StrCat(WriterPrefix(path_), "Append of ", count,
                                                   " elements, but only ", left, " of ",
                                                   total_elements_, " declared are left")));
  }
  if (count == 0) return absl::OkStatus();
  if (absl::Status s = file_->Append(data, count * sizeof(float)); !s.ok()) {
    return Fail(Prefixed(WriterPrefix(path_), s));
  }
  elements_written_ += count;
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Finish() {
  if (!failure_.ok()) return failure_;
  const std::string prefix = WriterPrefix(path_);
  if (elements_written_ != total_elements_) {
    const size_t short_index =
        std::upper_bound(element_ends_.begin(), element_ends_.end(), elements_written_) -
        element_ends_.begin();
    const uint64_t begin = short_index == 0 ? 0 : element_ends_[short_index - 1];
    return Fail(absl::FailedPreconditionError(absl::StrCat(
        prefix, "Finish after ", elements_written_, " of ", total_elements_, " elements: tensor '",
        tensors_[short_index].name, "' has ", elements_written_ - begin, " of ",
        element_ends_[short_index] - begin, "; nothing was written to the path")));
  }
  // (Should only the directory's fsync fail, the file is in place and the
  // error says so.)
  const absl::Status committed = file_->Commit();
  file_.reset();
  if (!committed.ok()) return Fail(Prefixed(prefix, committed));
  failure_ = absl::FailedPreconditionError(absl::StrCat(prefix, "already finished"));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// SafetensorsReader

absl::StatusOr<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Open(const std::string& path,
                                                                           FileEnv* env) {
  const std::string prefix = ReaderPrefix(path);
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> file = env->NewRandomAccessFile(path);
  if (!file.ok()) return Prefixed(prefix, file.status());
  absl::StatusOr<FileInfo> info = (*file)->Stat();
  if (!info.ok()) return Prefixed(prefix, info.status());
  if (info->type != FileType::kRegular) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "not a regular file"));
  }
  const uint64_t file_size = info->size;
  if (file_size < kSizeFieldBytes) {
    return absl::DataLossError(absl::StrCat(prefix, "file is ", file_size,
                                            " bytes, too short for the 8-byte header size"));
  }
  unsigned char size_field[kSizeFieldBytes];
  absl::StatusOr<size_t> got_size = (*file)->Read(0, sizeof(size_field), size_field);
  if (!got_size.ok()) return Prefixed(prefix, got_size.status());
  if (*got_size != sizeof(size_field)) {
    return absl::DataLossError(absl::StrCat(prefix, "file ended inside the header size"));
  }
  const uint64_t header_size = DecodeU64(size_field);
  if (header_size > kSafetensorsMaxHeaderSize) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "header size ", header_size,
                                                   " exceeds the format's limit of ",
                                                   kSafetensorsMaxHeaderSize, " bytes"));
  }
  if (header_size > file_size - kSizeFieldBytes) {
    return absl::DataLossError(absl::StrCat(prefix, "header size ", header_size,
                                            " runs past the end of the file (", file_size,
                                            " bytes); the file is truncated or not safetensors"));
  }
  std::string header_text(header_size, '\0');
  absl::StatusOr<size_t> got = (*file)->Read(kSizeFieldBytes, header_size, header_text.data());
  if (!got.ok()) return Prefixed(prefix, got.status());
  if (*got != header_size) {
    return absl::DataLossError(absl::StrCat(prefix, "file ended inside the header"));
  }
  // nlohmann's lexer takes a NUL byte for the end of input and would accept
  // anything after it; JSON text never contains one (strings escape it).
  if (const size_t nul = header_text.find('\0'); nul != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "header is not valid JSON: NUL byte at header offset ", nul));
  }
  Json header;
  std::string error;
  if (!ParseHeaderJson(header_text, &header, &error)) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, error));
  }
  // Leading whitespace is accepted, as the reference implementation (0.8)
  // does; its check for a '{' first byte has stayed disabled.
  if (!header.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "header is not a JSON object"));
  }

  std::map<std::string, std::string> metadata;
  std::vector<SafetensorsTensorInfo> tensors;
  tensors.reserve(header.size());
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      if (value.is_null()) continue;
      if (!value.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(prefix, "\"", kMetadataKey, "\" is not a JSON object"));
      }
      for (const auto& [meta_key, meta_value] : value.items()) {
        if (!meta_value.is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat(prefix, "metadata value of \"", meta_key,
                           "\" is not a string: ", Excerpt(meta_value)));
        }
        metadata[meta_key] = meta_value.get<std::string>();
      }
      continue;
    }
    SafetensorsTensorInfo info;
    if (absl::Status s = ParseTensorEntry(prefix, key, value, &info); !s.ok()) return s;
    tensors.push_back(std::move(info));
  }

  // The layout: sorted by offsets, the ranges must tile [0, buffer end).
  std::sort(tensors.begin(), tensors.end(),
            [](const SafetensorsTensorInfo& a, const SafetensorsTensorInfo& b) {
              return std::tie(a.data_begin, a.data_end, a.name) <
                     std::tie(b.data_begin, b.data_end, b.name);
            });
  uint64_t buffer_end = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SafetensorsTensorInfo& t = tensors[i];
    if (t.data_begin < buffer_end) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "tensor '", t.name, "' (bytes [", t.data_begin, ", ", t.data_end,
                       ")) overlaps tensor '", tensors[i - 1].name, "' (bytes [",
                       tensors[i - 1].data_begin, ", ", tensors[i - 1].data_end, "))"));
    }
    if (t.data_begin > buffer_end) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "bytes [", buffer_end, ", ", t.data_begin,
          ") of the data buffer belong to no tensor (a hole ",
          i == 0 ? std::string("at the start") : absl::StrCat("after '", tensors[i - 1].name, "'"),
          ", before '", t.name, "')"));
    }
    buffer_end = t.data_end;
  }
  const uint64_t data_start = kSizeFieldBytes + header_size;
  const uint64_t data_size = file_size - data_start;
  if (buffer_end > data_size) {
    const auto cut =
        std::find_if(tensors.begin(), tensors.end(),
                     [&](const SafetensorsTensorInfo& t) { return t.data_end > data_size; });
    return absl::DataLossError(absl::StrCat(
        prefix, "file is truncated: ", file_size, " bytes, the header needs ",
        data_start + buffer_end, "; tensor '", cut->name, "' needs bytes [", cut->data_begin, ", ",
        cut->data_end, ") of the data buffer, which has only ", data_size));
  }
  if (buffer_end < data_size) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, data_size - buffer_end,
                                                   " bytes after the last tensor's data (the "
                                                   "data buffer is ",
                                                   data_size, " bytes, the tensors cover ",
                                                   buffer_end, ")"));
  }
  return std::unique_ptr<SafetensorsReader>(new SafetensorsReader(
      path, std::move(*file), data_start, std::move(tensors), std::move(metadata)));
}

SafetensorsReader::SafetensorsReader(std::string path, std::unique_ptr<RandomAccessFile> file,
                                     uint64_t data_start,
                                     std::vector<SafetensorsTensorInfo> tensors,
                                     std::map<std::string, std::string> metadata)
    : path_(std::move(path)),
      file_(std::move(file)),
      data_start_(data_start),
      tensors_(std::move(tensors)),
      metadata_(std::move(metadata)) {
  index_.reserve(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
}

SafetensorsReader::~SafetensorsReader() = default;

absl::StatusOr<const SafetensorsTensorInfo*> SafetensorsReader::Find(
    const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat(ReaderPrefix(path_), "no tensor '", name, "'"));
  }
  return &tensors_[it->second];
}

absl::Status SafetensorsReader::ReadAsFloat(const std::string& name, uint64_t element_offset,
                                            uint64_t count, float* out) const {
  absl::StatusOr<const SafetensorsTensorInfo*> found = Find(name);
  if (!found.ok()) return found.status();
  const SafetensorsTensorInfo& t = **found;
  const uint64_t elements = t.num_elements();
  if (element_offset > elements || count > elements - element_offset) {
    return absl::OutOfRangeError(absl::StrCat(ReaderPrefix(path_), "elements [", element_offset,
                                              ", ", element_offset + count, ") of tensor '", name,
                                              "', which has ", elements));
  }
  const size_t element_size = DTypeSize(t.dtype);
  const uint64_t file_offset = data_start_ + t.data_begin + element_offset * element_size;
  auto read = [&](void* buffer, uint64_t n_elements, uint64_t offset) -> absl::Status {
    const size_t bytes = n_elements * element_size;
    absl::StatusOr<size_t> got = file_->Read(offset, bytes, buffer);
    if (!got.ok()) {
      return Prefixed(absl::StrCat(ReaderPrefix(path_), "reading tensor '", name, "': "),
                      got.status());
    }
    if (*got != bytes) {
      return absl::DataLossError(absl::StrCat(ReaderPrefix(path_), "file ended at byte ",
                                              offset + *got, " while reading tensor '", name,
                                              "'; it was truncated after it was opened"));
    }
    return absl::OkStatus();
  };
  if (t.dtype == DType::kFloat32) return read(out, count, file_offset);
  // 16-bit data: read a bounded chunk at a time and widen it into `out`.
  constexpr uint64_t kChunkElements = 1 << 16;
  std::vector<uint16_t> chunk(std::min(count, kChunkElements));
  for (uint64_t done = 0; done < count;) {
    const uint64_t n = std::min(count - done, kChunkElements);
    if (absl::Status s = read(chunk.data(), n, file_offset + done * element_size); !s.ok()) {
      return s;
    }
    ConvertToFloatAndFindNonFinite(chunk.data(), n, t.dtype, out + done);
    done += n;
  }
  return absl::OkStatus();
}

}  // namespace shardopt
