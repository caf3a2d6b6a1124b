// MuonWorkspace: the Newton-Schulz work buffers that Muon's step needs for a
// set of matrices: two the size of the largest matrix (the update and its
// next iterate) and two the size of the largest Gram matrix (X X^T and its
// polynomial, min(rows, cols) squared). The one rule for the CPU kernel
// (which allocates one matrix's worth per matrix it is updating), the GPU
// backend (which holds the set's for the model's life) and the state budget
// (Optimizer::PlannedWorkspaceBytes, which counts one set: exact for the GPU
// backend; the CPU backend's worker threads may each hold one matrix's set
// at once, for the length of a step, which the budget does not count).
// Pure arithmetic, no dependencies.
#ifndef SHARDOPT_SERVER_OPTIM_MUON_WORKSPACE_H_
#define SHARDOPT_SERVER_OPTIM_MUON_WORKSPACE_H_

#include <algorithm>
#include <cstdint>

namespace shardopt {

struct MuonWorkspace {
  uint64_t matrix_elements = 0;  // Each of the two matrix-sized buffers.
  uint64_t gram_elements = 0;    // Each of the two Gram-sized buffers.

  // Grows to hold a rows x cols matrix's step as well.
  void Add(uint64_t rows, uint64_t cols) {
    const uint64_t side = std::min(rows, cols);
    matrix_elements = std::max(matrix_elements, rows * cols);
    gram_elements = std::max(gram_elements, side * side);
  }
  uint64_t bytes() const { return (2 * matrix_elements + 2 * gram_elements) * sizeof(float); }
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_OPTIM_MUON_WORKSPACE_H_
