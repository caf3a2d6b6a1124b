#include "server/malloc_tuning.h"

#include <malloc.h>

#include <cstdlib>

namespace shardopt {

bool TuneMallocForLargeMessages() {
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  // The environment's choice wins (glibc reads it itself).
  const bool arenas_ok = std::getenv("MALLOC_ARENA_MAX") != nullptr || mallopt(M_ARENA_MAX, 2) == 1;
  return mmap_ok && trim_ok && arenas_ok;
}

}  // namespace shardopt
