// Keeps the daemon's CPUs out of their idle state while calls flow
// (--keep_awake_us; issue 25, "an idle machine is as fast as a busy one").
//
// On a VM whose idle vCPUs halt at once (Firecracker, haltpoll with
// guest_halt_poll_ns=0), waking a task on a halted vCPU costs ~25-30 us, and
// a sequential call pays it at each cross-process hand-off. While there is
// activity (and for `window` after the last), one busy-wait thread per
// chosen CPU, pinned to it and at SCHED_IDLE priority, keeps that CPU
// running: any normal task woken there preempts it at once, and the
// scheduler counts a CPU running only SCHED_IDLE tasks as idle when it
// places wake-ups, so the spinners take no CPU time from the host, the
// daemon or the worker (on the same cgroup's CPU share). After the window
// they block on a mutex and cost nothing until the next activity.
//
// The hot path (Touch) is one atomic add and one atomic load; only the
// first Touch after the spinners went to sleep takes a lock.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace agentix::sandbox {

class KeepAwake {
 public:
  // At most this many spinners (the lowest allowed CPUs): on a big machine
  // the call path's wake-ups land on a few CPUs, and more spinners only add
  // cache traffic on the activity counter.
  static constexpr int kMaxCpus = 8;

  // Starts one spinner per CPU in `cpus` (each must be allowed for this
  // process), asleep until the first Touch. Errors: kInvalidArgument for an
  // empty list or a window under 1 us; the errno of pinning a thread or of
  // setting its SCHED_IDLE policy (then no spinner is left running).
  static absl::StatusOr<std::unique_ptr<KeepAwake>> Start(std::vector<int> cpus,
                                                         absl::Duration window);

  // The CPUs to use for this process: its allowed set, the lowest kMaxCpus.
  static std::vector<int> AllowedCpus();

  // Stops and joins the spinners.
  ~KeepAwake();

  KeepAwake(const KeepAwake&) = delete;
  KeepAwake& operator=(const KeepAwake&) = delete;

  // Activity: the spinners run (or keep running) until `window` after the
  // last Touch. Thread-safe, wait-free unless the spinners are asleep.
  void Touch() {
    activity_.fetch_add(1, std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst) > 0) WakeSpinners();
  }

  // For tests and logs: the spinners' thread ids (in `cpus` order, each set
  // once that spinner has placed itself), and how many are asleep now.
  std::vector<pid_t> thread_ids() const;
  int sleeping() const { return sleeping_.load(std::memory_order_acquire); }

 private:
  explicit KeepAwake(absl::Duration window) : window_(window) {}
  void SpinnerLoop(size_t index, int cpu);
  void WakeSpinners();

  const absl::Duration window_;
  // Bumped by every Touch; the spinners watch it change.
  alignas(64) std::atomic<uint64_t> activity_{0};
  // Spinners blocked (or about to block) in mu_.
  alignas(64) std::atomic<int> sleeping_{0};

  mutable absl::Mutex mu_;
  // Incremented by WakeSpinners: the blocked spinners' wake-up condition.
  uint64_t wakes_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> stopping_{false};
  // Each spinner's start: its tid, or its error.
  std::vector<pid_t> tids_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> started_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

}  // namespace agentix::sandbox
