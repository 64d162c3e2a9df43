// Pinned waits of the C++ client ($AGENTIX_CALLS_CPU, docs/FRAME-WIRE.md
// "Wake-ups"): a thread that waits for the daemon's answer to the one call
// in flight waits on one CPU, the one the daemon's call path runs on (the
// Calls HELLO's "agentix-calls-cpu" names it), so that on an idle machine
// the hand-offs of a sequential call wake no halted CPU.
#ifndef AGENTIX_HOST_CC_AGENTIX_CALLS_CPU_H_
#define AGENTIX_HOST_CC_AGENTIX_CALLS_CPU_H_

#include <sched.h>
#include <sys/types.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

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
// pinned_waits.DEFAULT_SETTING; "wait" is the candidate once a quiet-machine
// A/B says it pays, docs/PERFORMANCE.md).
inline constexpr absl::string_view kDefaultCallsCpu = "off";
// The same for $AGENTIX_CALLS_CPU (unset or empty: kDefaultCallsCpu).
absl::StatusOr<int> CallsCpuFromEnv();

// One thread pinned to one CPU while it waits; Unpin gives it back its own
// mask. Each is one sched_setaffinity, skipped when the mask already is the
// CPU alone. Pin and Unpin may run on different threads (they name the
// thread pinned by its id).
class ThreadPin {
 public:
  // Pins the calling thread to `cpu`; false (nothing changed) when its mask
  // cannot be read or set, or already is `cpu` alone.
  bool Pin(int cpu);
  // Restores the mask Pin found; nothing when not pinned.
  void Unpin();
  bool pinned() const { return tid_ != 0; }

 private:
  pid_t tid_ = 0;
  cpu_set_t original_;
};

}  // namespace agentix::client_internal

#endif  // AGENTIX_HOST_CC_AGENTIX_CALLS_CPU_H_
