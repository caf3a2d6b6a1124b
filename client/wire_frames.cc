#include "client/wire_frames.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/dtype_convert.h"

namespace shardopt {
namespace {

// Protobuf wire types.
constexpr uint32_t kVarint = 0;
constexpr uint32_t kFixed64 = 1;
constexpr uint32_t kLengthDelimited = 2;
constexpr uint32_t kFixed32 = 5;

size_t PutVarint(uint64_t value, uint8_t* out) {
  size_t n = 0;
  while (value >= 0x80) {
    out[n++] = static_cast<uint8_t>(value | 0x80);
    value >>= 7;
  }
  out[n++] = static_cast<uint8_t>(value);
  return n;
}

size_t VarintSize(uint64_t value) {
  size_t n = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++n;
  }
  return n;
}

// Reads protobuf wire data spread over gRPC's received slices.
class SliceCursor {
 public:
  explicit SliceCursor(const std::vector<grpc::Slice>& slices) : slices_(slices) {}

  uint64_t position() const { return position_; }

  bool ReadByte(uint8_t* byte) {
    while (slice_ < slices_.size() && in_slice_ == slices_[slice_].size()) {
      ++slice_;
      in_slice_ = 0;
    }
    if (slice_ == slices_.size()) return false;
    *byte = slices_[slice_].begin()[in_slice_++];
    ++position_;
    return true;
  }

  bool ReadVarint(uint64_t* value) {
    *value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t byte;
      if (!ReadByte(&byte)) return false;
      *value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }

  // Copies (when `out` is set) or skips the next n bytes.
  bool Take(uint64_t n, uint8_t* out) {
    while (n > 0) {
      if (slice_ == slices_.size()) return false;
      const size_t available = slices_[slice_].size() - in_slice_;
      const size_t take = available < n ? available : static_cast<size_t>(n);
      if (out != nullptr) {
        std::memcpy(out, slices_[slice_].begin() + in_slice_, take);
        out += take;
      }
      in_slice_ += take;
      position_ += take;
      n -= take;
      if (in_slice_ == slices_[slice_].size()) {
        ++slice_;
        in_slice_ = 0;
      }
    }
    return true;
  }

  bool SkipField(uint32_t wire_type) {
    uint64_t value;
    switch (wire_type) {
      case kVarint:
        return ReadVarint(&value);
      case kFixed64:
        return Take(8, nullptr);
      case kLengthDelimited:
        return ReadVarint(&value) && Take(value, nullptr);
      case kFixed32:
        return Take(4, nullptr);
      default:
        return false;
    }
  }

 private:
  const std::vector<grpc::Slice>& slices_;
  size_t slice_ = 0;
  size_t in_slice_ = 0;
  uint64_t position_ = 0;
};

grpc::Status Malformed(PullFrame* frame, const std::string& what) {
  frame->error = absl::StrCat("malformed PullParametersResponse: ", what);
  return grpc::Status(grpc::StatusCode::INTERNAL, frame->error);
}

// TensorChunk { uint64 offset = 1; bytes data = 2; } ending at `end`.
grpc::Status ParseChunk(SliceCursor& in, uint64_t end, PullFrame* frame) {
  bool have_data = false;
  while (in.position() < end) {
    uint64_t tag;
    if (!in.ReadVarint(&tag)) return Malformed(frame, "truncated chunk tag");
    const uint32_t field = static_cast<uint32_t>(tag >> 3), wire_type = tag & 7;
    if (field == 1 && wire_type == kVarint) {
      if (have_data) return Malformed(frame, "chunk offset after its data");
      if (!in.ReadVarint(&frame->offset)) return Malformed(frame, "truncated offset");
    } else if (field == 2 && wire_type == kLengthDelimited) {
      // Protobuf would keep the last of repeated data fields; the server never
      // sends two, and accepting them would hide elements never written.
      if (have_data) return Malformed(frame, "two data fields in one chunk");
      uint64_t bytes;
      if (!in.ReadVarint(&bytes)) return Malformed(frame, "truncated data length");
      const size_t element = DTypeSize(frame->dtype);
      if (bytes % element != 0) {
        return Malformed(frame, absl::StrCat(bytes, " data bytes is not whole ",
                                             DTypeName(frame->dtype), " elements"));
      }
      const uint64_t count = bytes / element;
      if (frame->offset > frame->capacity || count > frame->capacity - frame->offset) {
        return Malformed(frame,
                         absl::StrCat("chunk [", frame->offset, ", ", frame->offset + count,
                                      ") outside the range of ", frame->capacity, " elements"));
      }
      float* target = frame->destination + frame->offset;
      if (frame->dtype == DType::kFloat32) {
        if (!in.Take(bytes, reinterpret_cast<uint8_t*>(target))) {
          return Malformed(frame, "truncated data");
        }
      } else {
        frame->scratch.resize(bytes);
        if (!in.Take(bytes, reinterpret_cast<uint8_t*>(frame->scratch.data()))) {
          return Malformed(frame, "truncated data");
        }
        ConvertToFloatAndFindNonFinite(frame->scratch.data(), count, frame->dtype, target);
      }
      frame->count = count;
      have_data = true;
    } else if (!in.SkipField(wire_type)) {
      return Malformed(frame, "bad field in chunk");
    }
  }
  if (in.position() != end) return Malformed(frame, "chunk overruns");
  // Also without data (found by //tools/fuzz:pull_frame_fuzzer): an offset
  // outside the range is no chunk of it.
  if (frame->offset > frame->capacity) {
    return Malformed(frame, absl::StrCat("chunk offset ", frame->offset, " outside the range of ",
                                         frame->capacity, " elements"));
  }
  return grpc::Status::OK;
}

void ReleasePin(void* pins) { static_cast<PayloadPins*>(pins)->Release(); }

}  // namespace

void PayloadPins::Acquire() {
  absl::MutexLock lock(&mu_);
  ++held_;
}

void PayloadPins::Release() {
  absl::MutexLock lock(&mu_);
  --held_;
}

void PayloadPins::WaitUntilReleased() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int64_t* held) { return *held == 0; }, &held_));
}

grpc::Status SerializePushFrame(const PushFrame& frame, grpc::ByteBuffer* buffer) {
  if (frame.header != nullptr) {
    const std::string bytes = frame.header->SerializeAsString();
    grpc::Slice slice(bytes.data(), bytes.size());
    *buffer = grpc::ByteBuffer(&slice, 1);
    return grpc::Status::OK;
  }
  // PushGradientsRequest { TensorChunk chunk = 2 { offset = 1; data = 2 } }.
  const uint64_t data_bytes = frame.count * frame.element_size;
  const uint64_t chunk_bytes = (frame.offset != 0 ? 1 + VarintSize(frame.offset) : 0) + 1 +
                               VarintSize(data_bytes) + data_bytes;
  if (frame.pins == nullptr && data_bytes > 0) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "PushFrame without PayloadPins");
  }
  uint8_t prefix[40];
  size_t n = 0;
  prefix[n++] = (2 << 3) | kLengthDelimited;
  n += PutVarint(chunk_bytes, prefix + n);
  if (frame.offset != 0) {
    prefix[n++] = (1 << 3) | kVarint;
    n += PutVarint(frame.offset, prefix + n);
  }
  prefix[n++] = (2 << 3) | kLengthDelimited;
  n += PutVarint(data_bytes, prefix + n);
  if (data_bytes == 0) {
    grpc::Slice slice(prefix, n);
    *buffer = grpc::ByteBuffer(&slice, 1);
    return grpc::Status::OK;
  }
  // Not copied: gRPC hands this memory to the socket as it is, and releases
  // the pin when it no longer refers to it. gRPC never writes through it.
  frame.pins->Acquire();
  grpc::Slice slices[2] = {
      grpc::Slice(prefix, n),
      grpc::Slice(const_cast<void*>(frame.data), data_bytes, &ReleasePin, frame.pins),
  };
  *buffer = grpc::ByteBuffer(slices, 2);
  return grpc::Status::OK;
}

grpc::Status ParsePullResponse(grpc::ByteBuffer* buffer, PullFrame* frame) {
  frame->version = 0;
  frame->lr = 0;
  frame->offset = 0;
  frame->count = 0;
  frame->error.clear();
  std::vector<grpc::Slice> slices;
  if (!buffer->Dump(&slices).ok()) return Malformed(frame, "unreadable buffer");
  SliceCursor in(slices);
  const uint64_t size = buffer->Length();
  bool have_chunk = false;
  while (in.position() < size) {
    uint64_t tag;
    if (!in.ReadVarint(&tag)) return Malformed(frame, "truncated tag");
    const uint32_t field = static_cast<uint32_t>(tag >> 3), wire_type = tag & 7;
    if (field == 1 && wire_type == kVarint) {
      uint64_t version;
      if (!in.ReadVarint(&version)) return Malformed(frame, "truncated version");
      frame->version = static_cast<int64_t>(version);
    } else if (field == 3 && wire_type == kFixed64) {
      uint64_t bits = 0;
      if (!in.Take(8, reinterpret_cast<uint8_t*>(&bits))) return Malformed(frame, "truncated lr");
      std::memcpy(&frame->lr, &bits, sizeof(double));
    } else if (field == 2 && wire_type == kLengthDelimited) {
      if (have_chunk) return Malformed(frame, "two chunks in one message");
      uint64_t length;
      if (!in.ReadVarint(&length) || length > size - in.position()) {
        return Malformed(frame, "bad chunk length");
      }
      grpc::Status s = ParseChunk(in, in.position() + length, frame);
      if (!s.ok()) return s;
      have_chunk = true;
    } else if (!in.SkipField(wire_type)) {
      return Malformed(frame, "bad field");
    }
  }
  return grpc::Status::OK;
}

}  // namespace shardopt
