#include "base/malloc_tuning.h"

#include <malloc.h>
#include <stdlib.h>

namespace agentix::base {

void TuneMallocForLargeBuffers() {
  if (getenv("GLIBC_TUNABLES") != nullptr) return;
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 128 << 20);
}

void ReleaseFreeMemory() { malloc_trim(0); }

}  // namespace agentix::base
