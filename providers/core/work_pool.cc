#include "providers/core/work_pool.h"

namespace agentix::providers {

WorkPool::WorkPool(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

WorkPool::~WorkPool() { Stop(); }

bool WorkPool::Submit(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (stop_) return false;
  queue_.push_back(std::move(task));
  return true;
}

void WorkPool::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stop_ && threads_.empty()) return;
    stop_ = true;
  }
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

void WorkPool::Run() {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](WorkPool* p) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return p->stop_ || !p->queue_.empty();
          },
          this));
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace agentix::providers
