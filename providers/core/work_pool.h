// A fixed set of worker threads for blocking backend and daemon calls
// (launch, readiness polling, activate, destroy), so no caller's thread ever
// runs them.
#pragma once

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace agentix::providers {

class WorkPool {
 public:
  explicit WorkPool(int threads);
  ~WorkPool();  // runs what is queued, then joins

  // False once stopping (the task is not run).
  bool Submit(std::function<void()> task);
  // Runs the queued tasks, refuses new ones, joins the threads.
  void Stop();

 private:
  void Run();
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace agentix::providers
