#include "sandbox/direct_orphan_timer.h"

#include <pthread.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace agentix::sandbox {

DirectOrphanTimer::DirectOrphanTimer(
    DirectConnections& connections, absl::Duration after,
    std::function<void(const std::string& client)> collapse)
    : connections_(connections),
      after_(after),
      collapse_(std::move(collapse)),
      thread_([this] { Run(); }) {}

DirectOrphanTimer::~DirectOrphanTimer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void DirectOrphanTimer::Run() {
  pthread_setname_np(pthread_self(), "agx-orphans");
  // An orphan is collapsed at most a period after its timeout.
  const absl::Duration period = std::clamp(after_ / 4, absl::Milliseconds(10),
                                           absl::Seconds(1));
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    if (mu_.AwaitWithTimeout(absl::Condition(&stop_), period)) break;
    mu_.Unlock();
    for (const std::string& client :
         connections_.TakeOrphans(absl::Now(), after_)) {
      collapse_(client);
    }
    mu_.Lock();
  }
}

}  // namespace agentix::sandbox
