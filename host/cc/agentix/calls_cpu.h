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
#include <vector>

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
  // Whether the thread rests now (a back-off whose period is over ends here;
  // resting() is the state as the last call left it).
  bool RestsNow();

 private:
  std::function<absl::Time()> now_;
  base::PinBackoff backoff_;
  bool resting_ = false;
  int64_t pins_ = 0;
  bool judged_ = false;  // past the first judgement
  int64_t timed_ = 0;
  absl::Duration timed_wait_;
};

// Whether a thread's lone calls wait pinned, measured on those calls (the
// default setting only, while the daemon says pin; as the Python host's
// pinned_waits.PinTrial, docs/DECISIONS.md "stop-68" and "stop-69"). The
// daemon's probe weighs two bare threads' round trips; what a real call's
// two processes do on either side of a hand-off it does not see, and on
// this project's VM a direct noop took 1.28x as long pinned. So after the
// thread's first kFirstAfter lone calls, and again kFirstEvery after the
// last trial (doubling up to kEvery), a trial runs kBlocks blocks of
// kBlock lone calls, pinned and unpinned in turn, the first kSkip of each
// block not timed (right after a switch the threads still sit where the
// other way left them); unpinned is kept until the next trial when its
// median is under kMargin x the pinned one. One per thread (ThreadPinTrial);
// Begin and End only for calls alone in flight that the thread waits for
// itself, and whose wait was what PinsNow said.
class PinTrial {
 public:
  static constexpr int kBlock = 48;
  static constexpr int kSkip = 8;
  static constexpr int kBlocks = 6;
  static constexpr double kMargin = 0.95;
  static constexpr int64_t kFirstAfter = 64;
  static constexpr absl::Duration kFirstEvery = absl::Seconds(1);
  static constexpr absl::Duration kEvery = absl::Seconds(32);

  // Whether the next lone call waits pinned: the running trial's block,
  // else the last trial's answer (pinned before the first).
  bool PinsNow() const { return block_ >= 0 ? block_ % 2 == 0 : pin_; }
  bool running() const { return block_ >= 0; }
  // The last trial's answer, and its medians (pinned, unpinned), zero
  // before the first.
  bool pin() const { return pin_; }
  absl::Duration last_pinned() const { return last_pinned_; }
  absl::Duration last_unpinned() const { return last_unpinned_; }

  // A lone call starts at `now`: a trial starts with it when one is due.
  void Begin(absl::Time now);
  // A call Begin saw while running() ended after `took`.
  void End(absl::Duration took, absl::Time now);

 private:
  bool pin_ = true;
  int block_ = -1;  // the running trial's block (even: pinned); -1: none
  int in_block_ = 0;
  std::vector<absl::Duration> samples_[2];  // [unpinned, pinned]
  int64_t lone_calls_ = 0;
  bool first_done_ = false;
  absl::Time next_at_;
  absl::Duration every_ = kFirstEvery;
  absl::Duration last_pinned_;
  absl::Duration last_unpinned_;
};

// The calling thread's PinBudget and PinTrial.
PinBudget& ThreadPinBudget();
PinTrial& ThreadPinTrial();

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
