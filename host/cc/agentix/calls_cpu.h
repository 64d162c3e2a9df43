// Pinned waits of the C++ client ($AGENTIX_CALLS_CPU, docs/FRAME-WIRE.md
// "Wake-ups"): a thread that waits for the daemon's answer to the one call
// in flight waits on one CPU, the one the daemon's call path runs on (the
// Calls HELLO's "agentix-calls-cpu" names it), so that on an idle machine
// the hand-offs of a sequential call wake no halted CPU.
#ifndef AGENTIX_HOST_CC_AGENTIX_CALLS_CPU_H_
#define AGENTIX_HOST_CC_AGENTIX_CALLS_CPU_H_

#include <sched.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/pin_backoff.h"

namespace agentix::client_internal {

// The HELLO key naming the CPU (decimal) on a Calls frame-wire connection.
inline constexpr absl::string_view kCallsCpuKey = "agentix-calls-cpu";

// Parses an $AGENTIX_CALLS_CPU value: "" or "off" -> -1 (nothing); "wait"
// -> the CPU the calling thread is on now; "wait:N", "wait:auto", "N",
// "auto" -> that CPU ("auto": the highest this thread may use, as the
// daemon's --calls_cpu=auto). A C++ client has no event loop to pin for
// good, so "N"/"auto" are pinned waits too (taskset pins a whole process).
// INVALID_ARGUMENT for anything else or a CPU the thread may not use.
absl::StatusOr<int> ParseCallsCpu(absl::string_view value);
// What an unset or empty $AGENTIX_CALLS_CPU means (as the Python host's
// pinned_waits.DEFAULT_SETTING): pinned waits since stop 25 (quiet noop p50
// 0.33x off, docs/PERFORMANCE.md).
inline constexpr absl::string_view kDefaultCallsCpu = "wait";
// The same for $AGENTIX_CALLS_CPU (unset or empty: kDefaultCallsCpu).
absl::StatusOr<int> CallsCpuFromEnv();
// Whether $AGENTIX_CALLS_CPU is unset or empty: the default's pinned waits
// then follow a --calls_cpu=probe daemon's answer (HELLO key
// kCallsCpuFollowKey; "off" stops them, "wait" starts them again). A
// setting named is not changed.
bool CallsCpuFollowsDaemon();
inline constexpr absl::string_view kCallsCpuFollowKey = "agentix-calls-cpu-follow";
// Its value: the daemon's first answer and every later change of it (a
// re-probe's); stop 31's "1" asked for the first only (docs/FRAME-WIRE.md).
inline constexpr absl::string_view kCallsCpuFollowChanges = "2";

// Whether a thread may pin itself for its next wait: not while waiting
// pinned costs it run-queue time (its CPU is busy with other work). One pin
// in kTimeEvery is timed: the pinned thread's run-queue wait from the pin to
// the unpin (NoteTimed). Every kTimedPerJudgement timed pins the mean goes to
// base::PinBackoff (but the first, warming up); above kWaitPerCall the
// thread rests (pins nothing) for the back-off's period. Only the pinned
// waits count: what the thread waits for a CPU elsewhere (its own work,
// other clients' calls) says nothing of what pinning costs. One per thread
// (ThreadPin's is thread_local; a pinned thread is blocked in Wait until
// it is unpinned, so its budget outlives every timed pin).
class PinBudget {
 public:
  static constexpr int64_t kTimeEvery = 16;
  static constexpr int64_t kTimedPerJudgement = 16;
  explicit PinBudget(std::function<absl::Time()> now = absl::Now) : now_(std::move(now)) {}

  // Counts a pin: whether to make it, and (`timed`) whether to time it.
  bool MayPin(bool* timed);
  // A timed pin's run-queue wait while pinned.
  void NoteTimed(absl::Duration wait);
  bool resting() const { return resting_; }

 private:
  std::function<absl::Time()> now_;
  base::PinBackoff backoff_;
  bool resting_ = false;
  int64_t pins_ = 0;
  bool judged_ = false;  // past the first judgement
  int64_t timed_ = 0;
  absl::Duration timed_wait_;
};

// One thread pinned to one CPU while it waits; Unpin gives it back its own
// mask. Each is one sched_setaffinity, skipped when the mask already is the
// CPU alone. Pin and Unpin may run on different threads (they name the
// thread pinned by its id).
class ThreadPin {
 public:
  // Pins the calling thread to `cpu`; false (nothing changed) when its mask
  // cannot be read or set, already is `cpu` alone, or the thread's
  // PinBudget rests.
  bool Pin(int cpu);
  // Restores the mask Pin found; nothing when not pinned.
  void Unpin();
  bool pinned() const { return tid_ != 0; }

 private:
  pid_t tid_ = 0;
  cpu_set_t original_;
  PinBudget* timing_ = nullptr;  // the pinned thread's budget, for a timed pin
  absl::Duration wait_at_pin_;
};

}  // namespace agentix::client_internal

#endif  // AGENTIX_HOST_CC_AGENTIX_CALLS_CPU_H_
