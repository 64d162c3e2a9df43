#include "sandbox/calls_cpu.h"

#include "base/cpu_affinity.h"

namespace agentix::sandbox {

CallsCpu::CallsCpu(int cpu) : cpu_(cpu) {
  CPU_ZERO(&all_);
  if (::sched_getaffinity(0, sizeof(all_), &all_) != 0) CPU_SET(cpu, &all_);
}

void CallsCpu::NoteRead(int call_ends) {
  if (call_ends <= 0) return;  // logs, spans, chunks: no news about callers
  // The sequential steady state costs one atomic load.
  if (call_ends == 1 && pinned()) return;
  absl::MutexLock lock(&mu_);
  const uint64_t epoch = epoch_.load(std::memory_order_relaxed);
  if (call_ends >= 2) {
    streak_ = 0;
    if (Pinned(epoch)) epoch_.store(epoch + 1, std::memory_order_release);
  } else if (!Pinned(epoch) && ++streak_ >= kSequentialReads) {
    streak_ = 0;
    epoch_.store(epoch + 1, std::memory_order_release);
  }
}

void CallsCpu::Follow(uint64_t* seen) {
  const uint64_t epoch = epoch_.load(std::memory_order_acquire);
  if (epoch == *seen) return;
  *seen = epoch;
  // Nothing fails here for a CPU ParseCpuSetting accepted.
  (void)base::SetThreadCpus(0, Pinned(epoch) ? base::CpuSetOf(cpu_) : all_);
}

void CallsCpu::FollowProcess(pid_t pid, uint64_t* seen) {
  const uint64_t epoch = epoch_.load(std::memory_order_acquire);
  if (epoch == *seen || pid <= 0) return;
  *seen = epoch;
  // A worker that has exited meanwhile is fine: its successor starts with
  // its own placement.
  (void)base::SetProcessCpus(pid, Pinned(epoch) ? base::CpuSetOf(cpu_) : all_);
}

}  // namespace agentix::sandbox
