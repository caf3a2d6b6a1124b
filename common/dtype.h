// DType: element types of tensors and payloads.
#ifndef SHARDOPT_COMMON_DTYPE_H_
#define SHARDOPT_COMMON_DTYPE_H_

#include <cstddef>

namespace shardopt {

enum class DType {
  kFloat32,
  kBFloat16,
  kFloat16,
};

// Bytes per element.
size_t DTypeSize(DType dtype);

// "float32", "bfloat16", "float16".
const char* DTypeName(DType dtype);

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_DTYPE_H_
