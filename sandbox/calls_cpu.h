// Where the call path's threads run (--calls_cpu; issue 25, "an idle machine
// is as fast as a busy one"). On a VM whose idle vCPUs halt, a sequential
// call pays an idle CPU's wake-up (~25 us here) at every hand-off the
// scheduler places on another CPU; on one CPU each hand-off is a context
// switch (~2 us). So while calls come one at a time, the frame wire's
// connection threads, the worker-reader thread and the worker process are
// pinned to one CPU; as soon as the worker answers calls in batches (several
// results in one read: callers overlap) they are unpinned, so concurrent
// calls use every CPU, and pinned again after kSequentialReads reads in a
// row that carried one result each.
//
// Each thread applies the current placement to itself when it next looks
// (Follow: one atomic load when nothing changed); the worker-reader thread
// applies it to its worker process too (FollowProcess).
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>

#include "absl/synchronization/mutex.h"

namespace agentix::sandbox {

class CallsCpu {
 public:
  // Reads in a row, each with exactly one call's end, before the threads are
  // pinned again after a concurrent phase.
  static constexpr int kSequentialReads = 64;

  // `cpu` must be one the daemon may run on (base::ParseCpuSetting); the
  // unpinned placement is the daemon's mask at construction.
  explicit CallsCpu(int cpu);

  int cpu() const { return cpu_; }
  bool pinned() const { return Pinned(epoch_.load(std::memory_order_acquire)); }

  // The worker reader, after each read: `call_ends` results and errors were
  // in it. Two or more unpin; kSequentialReads reads with one pin again.
  void NoteRead(int call_ends);

  // Pins or unpins the calling thread if the placement changed since
  // `*seen` (start it at kNever). Cheap when nothing changed.
  static constexpr uint64_t kNever = ~uint64_t{0};
  void Follow(uint64_t* seen);
  // The same for every thread of process `pid` (the worker).
  void FollowProcess(pid_t pid, uint64_t* seen);

 private:
  static bool Pinned(uint64_t epoch) { return epoch % 2 == 0; }

  const int cpu_;
  cpu_set_t all_;
  // Even: pinned (the start); each change adds one.
  std::atomic<uint64_t> epoch_{0};
  absl::Mutex mu_;
  int streak_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace agentix::sandbox
