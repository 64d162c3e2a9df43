// Pinning the call path's threads to one CPU (issue 25, "an idle machine is
// as fast as a busy one"). On a VM whose idle vCPUs halt, every wake-up of a
// thread that the scheduler puts on another, idle CPU costs that CPU's
// wake-up (~25 us here, shared/PERFORMANCE-NOTES.md item 6); threads that
// hand a sequential call to each other on one CPU pay a context switch
// (~2 us) instead. Opt-in: a pinned thread cannot use a second CPU.
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace agentix::base {

// No CPU chosen: nothing is pinned.
inline constexpr int kNoCpu = -1;

// A CPU setting as the daemon's --calls_cpu and the hosts'
// AGENTIX_CALLS_CPU spell it: "" or "off" -> kNoCpu; "auto" -> the
// highest-numbered CPU this thread may run on (a fixed choice that a host
// and a daemon started with the same mask agree on without configuration);
// a number -> that CPU, which must be in this thread's allowed set.
// kInvalidArgument (naming the value) for anything else.
absl::StatusOr<int> ParseCpuSetting(absl::string_view setting);

// The set holding just `cpu` (0 <= cpu < CPU_SETSIZE).
cpu_set_t CpuSetOf(int cpu);

// Lets thread `tid` (0: the calling thread) run on `cpus` only. errno's
// message on failure (kInvalidArgument for a set outside the allowed CPUs,
// kNotFound for a thread that has gone).
absl::Status SetThreadCpus(pid_t tid, const cpu_set_t& cpus);

// The same for every thread of process `pid` present now (threads it starts
// later inherit their creator's mask). OK if at least its main thread was
// set; threads that end meanwhile are skipped.
absl::Status SetProcessCpus(pid_t pid, const cpu_set_t& cpus);

// The CPUs the process could run on when it started (read during static
// initialization, on the main thread, before anything was pinned): what a
// child process gets whatever thread spawns it (ThreadCpusForChild).
const cpu_set_t& StartCpus();

// While alive, the calling thread may run on StartCpus() (nothing is changed
// if it already may, or if either mask is unknown); its own mask is restored
// at the end. A spawned child inherits the spawning thread's mask, and a
// thread pinned to the call path's CPU must not pass that on to a worker.
class ThreadCpusForChild {
 public:
  ThreadCpusForChild();
  ~ThreadCpusForChild();
  ThreadCpusForChild(const ThreadCpusForChild&) = delete;
  ThreadCpusForChild& operator=(const ThreadCpusForChild&) = delete;

 private:
  cpu_set_t own_;
  bool changed_ = false;
};

// The CPUs thread `tid` (0: the calling thread) may run on, e.g. "1" or
// "0-1"; for tests and logs.
std::string AllowedCpus(pid_t tid);

}  // namespace agentix::base
