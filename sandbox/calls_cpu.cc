#include "sandbox/calls_cpu.h"

#include "absl/time/clock.h"
#include "base/cpu_affinity.h"
#include "base/log.h"

namespace agentix::sandbox {

CallsCpu::CallsCpu(int cpu, Hooks hooks)
    : fixed_cpu_(cpu), hooks_(std::move(hooks)) {
  CPU_ZERO(&all_);
  if (::sched_getaffinity(0, sizeof(all_), &all_) != 0 && cpu >= 0) {
    CPU_SET(cpu, &all_);
  }
  if (!hooks_.run_queue_wait) hooks_.run_queue_wait = [] { return base::ThreadRunQueueWait(); };
  if (!hooks_.now) hooks_.now = absl::Now;
  if (!hooks_.running_cpu) hooks_.running_cpu = ::sched_getcpu;
  absl::MutexLock lock(&mu_);
  // Kept unpinned until the first call's end when the CPU is the reader's.
  if (fixed_cpu_ >= 0) Update();
}

bool CallsCpu::Allowed(int cpu) const {
  return cpu >= 0 && cpu < CPU_SETSIZE && CPU_ISSET(cpu, &all_);
}

int64_t CallsCpu::backoffs() {
  absl::MutexLock lock(&mu_);
  return backoffs_;
}

void CallsCpu::Update() {
  int cpu = base::kNoCpu;
  const uint64_t old = state_.load(std::memory_order_relaxed);
  if (active_ && !overlapping_ && !backed_off_) {
    if (fixed_cpu_ >= 0) {
      cpu = fixed_cpu_;
    } else if (hint_ >= 0) {
      cpu = hint_;
    } else {
      // Chosen when it pins, kept while pinned.
      if (CpuOf(old) < 0 || chosen_ < 0) chosen_ = hooks_.running_cpu();
      if (!Allowed(chosen_)) chosen_ = base::kNoCpu;
      cpu = chosen_;
    }
  }
  if (CpuOf(old) == cpu) return;
  if (CpuOf(old) < 0) {
    // A new pinned phase: its first sample is a baseline.
    last_wait_ = absl::Nanoseconds(-1);
    calls_.store(0, std::memory_order_relaxed);
  }
  const uint64_t generation = (old >> 32) + 1;
  state_.store((generation << 32) | static_cast<uint32_t>(cpu + 1),
               std::memory_order_release);
}

void CallsCpu::NoteRead(int call_ends) {
  if (call_ends <= 0) return;  // logs, spans, chunks: no news about callers
  // The sequential steady state: one atomic load and one add.
  if (call_ends == 1 && pinned()) {
    if (calls_.fetch_add(1, std::memory_order_relaxed) + 1 < kSampleCalls) {
      return;
    }
    calls_.store(0, std::memory_order_relaxed);
    absl::MutexLock lock(&mu_);
    const absl::Duration wait = hooks_.run_queue_wait();
    if (last_wait_ >= absl::ZeroDuration() &&
        backoff_.NotePinned(kSampleCalls, wait - last_wait_, hooks_.now())) {
      backed_off_ = true;
      ++backoffs_;
      AGX_LOG(Info, "calls_cpu: CPU {} busy ({:.1f} us run-queue wait per call); "
              "unpinned for {}", CpuOf(state_.load(std::memory_order_relaxed)),
              absl::ToDoubleMicroseconds((wait - last_wait_) / kSampleCalls),
              absl::FormatDuration(backoff_.period()));
      Update();
    }
    last_wait_ = wait;
    return;
  }
  absl::MutexLock lock(&mu_);
  if (call_ends >= 2) {
    streak_ = 0;
    overlapping_ = true;
  } else if (overlapping_ && ++streak_ >= kSequentialReads) {
    streak_ = 0;
    overlapping_ = false;
  }
  if (backed_off_ && backoff_.Over(hooks_.now())) backed_off_ = false;
  Update();
}

void CallsCpu::SetActive(bool active) {
  absl::MutexLock lock(&mu_);
  active_ = active;
  // A CPU of the reader's own is chosen at its next call's end, on its thread.
  if (!active || fixed_cpu_ >= 0 || hint_ >= 0) Update();
}

bool CallsCpu::PreferCpu(int cpu) {
  if (!Allowed(cpu)) return false;
  absl::MutexLock lock(&mu_);
  hint_ = cpu;
  Update();
  return true;
}

bool CallsCpu::PreferCpuOncePinned(int cpu) {
  if (!Allowed(cpu)) return false;
  absl::MutexLock lock(&mu_);
  if (host_waits() == HostWaits::kPin) {
    hint_ = cpu;
    Update();
  } else {
    pending_hint_ = cpu;
  }
  return true;
}

void CallsCpu::SetHostWaits(HostWaits waits) {
  absl::MutexLock lock(&mu_);
  host_waits_.store(static_cast<int>(waits), std::memory_order_release);
  if (waits == HostWaits::kPin && pending_hint_ >= 0) {
    hint_ = pending_hint_;
    pending_hint_ = -1;
    Update();
  }
}

void CallsCpu::Follow(uint64_t* seen) {
  const uint64_t state = state_.load(std::memory_order_acquire);
  if (state == *seen) return;
  *seen = state;
  const int cpu = CpuOf(state);
  // Nothing fails here for a CPU in the daemon's mask.
  (void)base::SetThreadCpus(0, cpu >= 0 ? base::CpuSetOf(cpu) : all_);
}

}  // namespace agentix::sandbox
