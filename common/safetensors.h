// Reading and writing the safetensors format (github.com/huggingface/safetensors,
// README "Format"), for checkpoints that PyTorch tools load directly.
//
// A file is: an 8-byte little-endian u64 N; N bytes of UTF-8 JSON (the header),
// which may end in spaces; then the data buffer. The header maps each tensor
// name to {"dtype", "shape", "data_offsets": [begin, end]}, offsets relative to
// the buffer's start, plus an optional "__metadata__" object of string values.
// The tensors' byte ranges, sorted by offset, tile the buffer exactly: no
// overlaps, no holes, nothing after the last one, and each range holds
// product(shape) * dtype size bytes. Data is little-endian, row-major.
//
// shardopt writes fp32 tensors only and reads F32, BF16 and F16 (widened to
// fp32 exactly); a file holding any other dtype is refused as a whole.
#ifndef SHARDOPT_COMMON_SAFETENSORS_H_
#define SHARDOPT_COMMON_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "common/file.h"

namespace shardopt {

// The reference implementation refuses headers above this size (bytes), so we
// neither write nor read one.
inline constexpr uint64_t kSafetensorsMaxHeaderSize = 100'000'000;

// One tensor of a file. data_begin / data_end are byte offsets into the data
// buffer (not the file), end exclusive.
struct SafetensorsTensorInfo {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;  // [] is a scalar (one element).
  uint64_t data_begin = 0;
  uint64_t data_end = 0;

  uint64_t num_elements() const { return (data_end - data_begin) / DTypeSize(dtype); }
};

// The safetensors dtype name: "F32", "BF16", "F16".
const char* SafetensorsDTypeName(DType dtype);

// Writes one fp32 safetensors file without holding its data: the header is
// written by Create, the data streamed through Append in declaration order,
// and Finish makes the file appear at `path` atomically (a FileEnv atomic
// file: temp file, fsync, rename, fsync of the directory), so a reader never
// sees a partial file and a crash leaves the previous file at `path` intact.
// A writer destroyed without a successful Finish removes its temp file. Not
// thread-safe.
class SafetensorsWriter {
 public:
  struct TensorSpec {
    std::string name;
    std::vector<int64_t> shape;
  };

  // INVALID_ARGUMENT for an empty, duplicate or reserved ("__metadata__")
  // name, a negative dimension, a size that overflows, or a header over
  // kSafetensorsMaxHeaderSize; the file layer's errno-derived status
  // (common/file.h) if the temp file cannot be created or written. The
  // tensors are laid out in the order given; an empty `metadata` writes no
  // "__metadata__". Writers of the same path each have their own temp file
  // (the last Finish wins). `env` must outlive the writer.
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Create(
      const std::string& path, std::vector<TensorSpec> tensors,
      std::map<std::string, std::string> metadata, FileEnv* env = FileEnv::Default());

  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Appends the next `count` fp32 values of the concatenated tensors; calls
  // may split or span tensors freely. OUT_OF_RANGE if that is more than is
  // left to write. Any failure abandons the file (the temp file is removed)
  // and every later call returns FAILED_PRECONDITION: a stream that went
  // wrong once cannot be trusted to be aligned with the declarations.
  absl::Status Append(const float* data, size_t count);

  // FAILED_PRECONDITION (naming the first short tensor) unless every declared
  // element was appended; the file is then abandoned and nothing appears at
  // `path` (an older file there is untouched). Otherwise flushes, fsyncs and
  // renames onto `path`, then fsyncs the directory; should only that last
  // step fail, the error says so and the complete file is already in place.
  absl::Status Finish();

  uint64_t total_elements() const { return total_elements_; }
  uint64_t elements_written() const { return elements_written_; }
  const std::string& path() const { return path_; }

 private:
  SafetensorsWriter(std::string path, std::unique_ptr<AtomicFileWriter> file,
                    std::vector<TensorSpec> tensors, std::vector<uint64_t> ends);
  // Drops (and so removes) the temp file; records `status` as the writer's fate.
  absl::Status Fail(absl::Status status);

  std::string path_;
  std::unique_ptr<AtomicFileWriter> file_;  // nullptr once finished or failed.
  std::vector<TensorSpec> tensors_;
  std::vector<uint64_t> element_ends_;  // Cumulative element counts.
  uint64_t total_elements_;
  uint64_t elements_written_ = 0;
  absl::Status failure_;  // Non-OK once failed; FAILED_PRECONDITION after Finish.
};

// A validated safetensors file, kept open for reads of any part of any tensor.
// Open checks the whole header against the file's size before it returns, so
// every range that ReadAsFloat accepts is in the file (unless the file is
// changed underneath). Const methods are safe to call from several threads.
class SafetensorsReader {
 public:
  // INVALID_ARGUMENT for a malformed header (bad size, not UTF-8 JSON, not an
  // object, duplicate keys, missing or ill-typed fields, shape / offset
  // mismatch, overlaps, holes, trailing bytes); DATA_LOSS for a file shorter
  // than its header says (naming the first tensor cut off); UNIMPLEMENTED for
  // a dtype other than F32, BF16, F16; the file layer's errno-derived status
  // for I/O errors. Every message names the file. `env` must outlive the
  // reader.
  static absl::StatusOr<std::unique_ptr<SafetensorsReader>> Open(const std::string& path,
                                                                 FileEnv* env = FileEnv::Default());

  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  // In data-offset order (ties, i.e. empty tensors, by name).
  const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

  // NOT_FOUND if no tensor has that name.
  absl::StatusOr<const SafetensorsTensorInfo*> Find(const std::string& name) const;

  // Reads elements [element_offset, element_offset + count) of tensor `name`
  // (flat, row-major) into `out` as fp32, reading only those bytes. NOT_FOUND,
  // OUT_OF_RANGE past the tensor's end, DATA_LOSS if the file got shorter.
  absl::Status ReadAsFloat(const std::string& name, uint64_t element_offset, uint64_t count,
                           float* out) const;

 private:
  SafetensorsReader(std::string path, std::unique_ptr<RandomAccessFile> file, uint64_t data_start,
                    std::vector<SafetensorsTensorInfo> tensors,
                    std::map<std::string, std::string> metadata);

  std::string path_;
  std::unique_ptr<RandomAccessFile> file_;
  uint64_t data_start_;  // File offset of the data buffer: 8 + N.
  std::vector<SafetensorsTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;  // name -> position in tensors_.
  std::map<std::string, std::string> metadata_;
};

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_SAFETENSORS_H_
