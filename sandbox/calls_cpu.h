// Where the call path waits (--calls_cpu; issue 25, "an idle machine is as
// fast as a busy one"). On a VM whose idle vCPUs halt, a sequential call
// pays an idle CPU's wake-up (~25 us here) at every hand-off the scheduler
// places on another CPU; on one CPU each hand-off is a context switch
// (~2 us). So while calls come one at a time, the threads that wait for the
// next frame are pinned to one CPU: the daemon's frame-wire connection
// threads and its worker reader and writer (ours for good), and in the
// worker only while a thread waits for the daemon's frames: it reads the
// CPU (PayloadArea::WaitCpu, published by the reader) before it blocks and
// takes the full mask back before it runs user code, so user code and the
// threads it starts never run pinned.
//
// Unpinned while calls overlap (several results in one read), pinned again
// after kSequentialReads reads in a row with one result each; unpinned for
// a back-off period (PinBackoff) when the reader's run-queue wait per call
// says its CPU is busy with others. Which CPU: the one named (--calls_cpu=N),
// else the latest a Calls frame-wire host asked for (HELLO's
// agentix-calls-cpu, if the daemon may use it), else the CPU the worker
// reader runs on when it pins (so daemons spread as the scheduler spread
// them).
//
// Each thread applies the current placement to itself when it next looks
// (Follow: one atomic load when nothing changed).
//
// Direct calls (--direct_calls) end in the worker, never in a read here: a
// host's CPU places their path (the worker is given it at the hand-over,
// WorkerProcess::PublishPlacement), a CPU of the reader's own never does.
// A direct worker pinned while its host runs anywhere lost
// (docs/DECISIONS.md, "stop-40: direct calls follow the placement …").
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/pin_backoff.h"

namespace agentix::sandbox {

class CallsCpu {
 public:
  // Reads in a row, each with exactly one call's end, before the threads are
  // pinned again after a concurrent phase.
  static constexpr int kSequentialReads = 64;
  // Call ends between two run-queue samples (one /proc read each).
  static constexpr int kSampleCalls = 256;
  // `cpu` for "auto": the CPU the worker reader runs on when it pins.
  static constexpr int kRunningCpu = -2;

  struct Hooks {
    // The calling thread's run-queue wait so far (/proc/thread-self/schedstat).
    std::function<absl::Duration()> run_queue_wait;
    std::function<absl::Time()> now;
    std::function<int()> running_cpu;  // sched_getcpu()
  };

  // `cpu`: kRunningCpu, or one the daemon may run on (base::ParseCpuSetting).
  // The unpinned placement is the daemon's mask at construction.
  explicit CallsCpu(int cpu) : CallsCpu(cpu, Hooks{}) {}
  CallsCpu(int cpu, Hooks hooks);

  // The CPU the call path is pinned to now, or base::kNoCpu.
  int PinnedCpu() const { return CpuOf(state_.load(std::memory_order_acquire)); }
  bool pinned() const { return PinnedCpu() >= 0; }
  // Times the call path backed off so far (for tests and the stats).
  int64_t backoffs();

  // The worker reader, after each read: `call_ends` results and errors were
  // in it. Two or more unpin; kSequentialReads reads with one pin again; every
  // kSampleCalls call ends while pinned, the caller's run-queue wait is
  // sampled (PinBackoff).
  void NoteRead(int call_ends);

  // A Calls frame-wire host pins its own waits to `cpu` (HELLO's
  // agentix-calls-cpu): the call path uses it too, unless --calls_cpu named
  // one. False (ignored) if the daemon may not run on it.
  bool PreferCpu(int cpu);
  // A host that follows the probe's answer (HELLO's
  // agentix-calls-cpu-follow) and whose Calls connection went to the worker
  // (direct calls) before it was told to pin: its CPU places the call path
  // as PreferCpu's once the hosts are told to pin (SetHostWaits(kPin)), at
  // once if they are. A relayed connection's thread does that itself when
  // it tells its host; a handed-over one's thread has ended. False (ignored)
  // if the daemon may not run on `cpu`.
  bool PreferCpuOncePinned(int cpu);

  // --calls_cpu=probe: inactive (nothing pinned) until the start-up probe
  // chooses (sandbox/placement_probe.h). Active by default.
  void SetActive(bool active);
  // What the daemon tells a host that asks (HELLO's
  // agentix-calls-cpu-follow): kNone without the probe (explicit settings
  // leave the host's waits to the host: nothing is told), kUnknown while it
  // runs.
  enum class HostWaits { kNone, kUnknown, kPin, kOff };
  void SetHostWaits(HostWaits waits);
  HostWaits host_waits() const {
    return static_cast<HostWaits>(host_waits_.load(std::memory_order_acquire));
  }

  // Pins or unpins the calling thread if the placement changed since
  // `*seen` (start it at kNever). Cheap when nothing changed.
  static constexpr uint64_t kNever = ~uint64_t{0};
  void Follow(uint64_t* seen);
  // The CPU of a state Follow saw, or base::kNoCpu.
  static int CpuOf(uint64_t state) {
    return static_cast<int>(state & 0xffffffffu) - 1;
  }
  uint64_t state() const { return state_.load(std::memory_order_acquire); }

 private:
  // Under mu_: the state for the current inputs, published if it changed.
  void Update() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Allowed(int cpu) const;

  const int fixed_cpu_;  // --calls_cpu=N, or kRunningCpu
  cpu_set_t all_;
  Hooks hooks_;
  // A generation (high 32 bits, one more per change) and the CPU + 1 (low
  // 32 bits; 0: unpinned): one word, so a thread that reads it applies a
  // placement that was current together with its CPU.
  std::atomic<uint64_t> state_{0};
  std::atomic<int64_t> calls_{0};  // call ends since the last sample
  std::atomic<int> host_waits_{0};  // HostWaits
  absl::Mutex mu_;
  bool active_ ABSL_GUARDED_BY(mu_) = true;
  int streak_ ABSL_GUARDED_BY(mu_) = 0;
  bool overlapping_ ABSL_GUARDED_BY(mu_) = false;
  int hint_ ABSL_GUARDED_BY(mu_) = -1;    // the latest host's CPU
  int pending_hint_ ABSL_GUARDED_BY(mu_) = -1;  // PreferCpuOncePinned's
  int chosen_ ABSL_GUARDED_BY(mu_) = -1;  // kRunningCpu's choice
  base::PinBackoff backoff_ ABSL_GUARDED_BY(mu_);
  bool backed_off_ ABSL_GUARDED_BY(mu_) = false;
  int64_t backoffs_ ABSL_GUARDED_BY(mu_) = 0;
  // The sampled thread's wait at the last sample; < 0: take a new baseline.
  absl::Duration last_wait_ ABSL_GUARDED_BY(mu_) = absl::Nanoseconds(-1);
};

}  // namespace agentix::sandbox
