// FlushScheduler: one thread that runs the delayed flushes of stream writers
// that hold small messages back to coalesce them (BatchingWriter's
// coalescing). A flush whose target is gone by its time is skipped.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <thread>

#include "absl/synchronization/mutex.h"

namespace agentix::sandbox {

// Something with held-back output to write.
class Flushable {
 public:
  virtual ~Flushable() = default;
  // Called on the scheduler's thread, without any scheduler lock held.
  virtual void Flush() = 0;
};

class FlushScheduler {
 public:
  FlushScheduler();
  // Stops the thread; flushes still pending are dropped (their streams have
  // ended by then: the service outlives the server).
  ~FlushScheduler();

  FlushScheduler(const FlushScheduler&) = delete;
  FlushScheduler& operator=(const FlushScheduler&) = delete;

  // Monotonic: a wall-clock step must not hold a flush back for hours.
  using Clock = std::chrono::steady_clock;

  // Calls target->Flush() at `when` (at once if that has passed) unless
  // the target has been destroyed by then. Thread-safe; never calls back
  // into the caller synchronously.
  void FlushAt(Clock::time_point when, std::weak_ptr<Flushable> target);

 private:
  void Run();

  absl::Mutex mu_;
  std::multimap<Clock::time_point, std::weak_ptr<Flushable>> due_
      ABSL_GUARDED_BY(mu_);
  absl::CondVar changed_;  // stop, or a new earliest deadline
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace agentix::sandbox
