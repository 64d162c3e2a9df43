// StreamActivity: how many runtime streams are open and when the last one
// closed, for SandboxAdmin.GetStatus's idle time. Counted per stream (its
// arrival and its end), never per message or per call.
#pragma once

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"

namespace agentix::sandbox {

class StreamActivity {
 public:
  StreamActivity() : last_close_ns_(absl::ToUnixNanos(absl::Now())) {}

  void Opened() { open_.fetch_add(1, std::memory_order_relaxed); }
  void Closed() {
    last_close_ns_.store(absl::ToUnixNanos(absl::Now()),
                         std::memory_order_relaxed);
    open_.fetch_sub(1, std::memory_order_release);
  }

  int open() const { return open_.load(std::memory_order_acquire); }
  // When the last stream closed (construction until the first did).
  absl::Time last_close() const {
    return absl::FromUnixNanos(last_close_ns_.load(std::memory_order_relaxed));
  }

 private:
  std::atomic<int> open_{0};
  std::atomic<int64_t> last_close_ns_;
};

}  // namespace agentix::sandbox
