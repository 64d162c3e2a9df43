#include "base/mutex_tuning.h"

#include "absl/synchronization/mutex.h"

namespace agentix::base {

void DisableMutexDeadlockDetection() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace agentix::base
