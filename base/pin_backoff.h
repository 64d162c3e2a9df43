// When a thread pinned to one CPU should give the pin up for a while: its
// CPU is busy with other work, so waiting there for a hand-off costs more
// run-queue time than a cross-CPU wake-up would (issue 25). Shared by the
// daemon's call path (sandbox/calls_cpu.h) and the C++ client's pinned
// waits (host/cc/agentix/calls_cpu.h); the Python host mirrors it
// (agentix/runtime/client/pinned_waits.py).
#pragma once

#include <sys/types.h>

#include <cstdint>

#include "absl/time/time.h"

namespace agentix::base {

// When pinning backs off: every sample is the run-queue wait
// (time runnable but not running) of a pinned thread over some calls. Above
// kWaitPerCall, the CPU is busy with other processes: unpinned for a period,
// doubled each time the first sample after it is still above (up to
// kLongest), back to kFirst after a sample below. Not thread-safe.
class PinBackoff {
 public:
  // Measured (docs/PERFORMANCE.md, "stop-25: placement by default"): quiet
  // ~2-5 us per call pinned; at load 13-15, 56-63 us pinned vs 14 unpinned.
  // 20 us was too low: a quiet machine whose calls mix the frame wire with
  // gRPC's (gRPC's threads sharing the CPU) reached 21.5, and backing off
  // there made a C++ noop 28 -> 80 us (stop 25, the lead's runs).
  static constexpr absl::Duration kWaitPerCall = absl::Microseconds(40);
  static constexpr absl::Duration kFirst = absl::Seconds(1);
  static constexpr absl::Duration kLongest = absl::Seconds(64);

  // A sample taken while pinned: `calls` call ends, `wait` run-queue wait
  // since the last sample. True if it backs off now (until until()).
  bool NotePinned(int64_t calls, absl::Duration wait, absl::Time now);
  // Whether the back-off has ended by `now` (true when there was none).
  bool Over(absl::Time now) const { return now >= until_; }
  absl::Time until() const { return until_; }
  absl::Duration period() const { return period_; }

 private:
  absl::Duration period_ = kFirst;  // the next back-off's length
  absl::Time until_ = absl::InfinitePast();
  bool after_backoff_ = false;  // no sample below since the last back-off
};

// The run-queue wait so far (schedstat's second field) of thread `tid` of
// this process (0: the calling thread); zero if the kernel does not keep it
// or the thread has ended. The calling thread's own file is opened once and
// kept (one pread a reading); another thread's is opened each time.
absl::Duration ThreadRunQueueWait(pid_t tid = 0);

}  // namespace agentix::base
