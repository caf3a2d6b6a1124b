// DigestBytes: a 64-bit digest of a chunk of a gradient buffer, taken as a
// streamed push hands the chunk to gRPC and again when the gradient is
// declared final (ReadyRanges::FirstChangedChunk), so that a gradient changed
// after part of it was sent (clip_grad_norm_ between backward() and step())
// is noticed and pushed again whole instead of applied as sent.
//
// Not cryptographic: it only has to notice accidental changes. Any change of
// a single 8-byte word always changes the digest (each lane's step is a
// bijection of its state for a fixed word, and different words from one state
// give different states); every step also folds the high half of the state
// into the low one, so that changes of several words (sign flips, a scale)
// do not cancel in a lane's top bits. Four independent lanes keep it
// memory-bound.
#ifndef SHARDOPT_CLIENT_CHUNK_DIGEST_H_
#define SHARDOPT_CLIENT_CHUNK_DIGEST_H_

#include <cstddef>
#include <cstdint>

namespace shardopt {

uint64_t DigestBytes(const void* data, size_t bytes);

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_CHUNK_DIGEST_H_
