#include "sandbox/flush_scheduler.h"

#include <pthread.h>

#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace agentix::sandbox {

FlushScheduler::FlushScheduler() : thread_([this] { Run(); }) {}

FlushScheduler::~FlushScheduler() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    changed_.Signal();
  }
  thread_.join();
}

void FlushScheduler::FlushAt(Clock::time_point when,
                             std::weak_ptr<Flushable> target) {
  absl::MutexLock lock(&mu_);
  const auto it = due_.emplace(when, std::move(target));
  if (it == due_.begin()) changed_.Signal();
}

void FlushScheduler::Run() {
  pthread_setname_np(pthread_self(), "agx-flush");
  std::vector<std::weak_ptr<Flushable>> ready;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      // FlushAt signals when it adds a new earliest deadline.
      while (!stopping_ &&
             (due_.empty() || due_.begin()->first > Clock::now())) {
        if (due_.empty()) {
          changed_.Wait(&mu_);
        } else {
          changed_.WaitWithTimeout(
              &mu_, absl::FromChrono(due_.begin()->first - Clock::now()));
        }
      }
      if (stopping_) return;
      const Clock::time_point now = Clock::now();
      while (!due_.empty() && due_.begin()->first <= now) {
        ready.push_back(std::move(due_.begin()->second));
        due_.erase(due_.begin());
      }
    }
    for (auto& target : ready) {
      if (auto flushable = target.lock()) flushable->Flush();
    }
    ready.clear();
  }
}

}  // namespace agentix::sandbox
