#include "sandbox/wakee_sched.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>

#include <atomic>

#include "base/log.h"

namespace agentix::sandbox {
namespace {

std::atomic<bool> batch_on{true};
std::atomic<bool> refusal_logged{false};

}  // namespace

void SetWakeeBatchSched(bool on) {
  batch_on.store(on, std::memory_order_relaxed);
}

bool WakeeBatchSched() { return batch_on.load(std::memory_order_relaxed); }

void ApplyWakeeSched() {
  if (!WakeeBatchSched()) return;
  // Only from the default policy: a daemon an operator started under a
  // real-time policy keeps it.
  int policy = 0;
  sched_param param = {};
  if (pthread_getschedparam(pthread_self(), &policy, &param) != 0 ||
      policy != SCHED_OTHER) {
    return;
  }
  param.sched_priority = 0;
  const int rc = pthread_setschedparam(pthread_self(), SCHED_BATCH, &param);
  if (rc != 0 && !refusal_logged.exchange(true)) {
    AGX_LOG(Debug, "SCHED_BATCH for the call path's threads refused: {}",
            strerror(rc));
  }
}

}  // namespace agentix::sandbox
