#include "server/malloc_tuning.h"

#include <malloc.h>

namespace shardopt {

bool TuneMallocForLargeMessages() {
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  return mmap_ok && trim_ok;
}

}  // namespace shardopt
