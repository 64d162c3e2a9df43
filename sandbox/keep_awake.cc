#include "sandbox/keep_awake.h"

#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/cpu_affinity.h"

namespace agentix::sandbox {
namespace {

// Lets the sibling hyperthread (and the VM's host) have the core's pipeline
// while this thread waits.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Pauses between two looks at the activity counter and the clock (~1 us on
// x86: a clock read per pause would be most of the loop).
constexpr int kPausesPerLook = 16;

absl::Status MakeIdlePriority() {
  sched_param param{};
  param.sched_priority = 0;
  // pid 0: the calling thread (Linux schedules threads, not processes).
  if (::sched_setscheduler(0, SCHED_IDLE, &param) != 0) {
    return absl::ErrnoToStatus(errno, "sched_setscheduler(SCHED_IDLE)");
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<int> KeepAwake::AllowedCpus() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  std::vector<int> out;
  if (::sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return out;
  for (int cpu = 0; cpu < CPU_SETSIZE && static_cast<int>(out.size()) < kMaxCpus; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) out.push_back(cpu);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<KeepAwake>> KeepAwake::Start(std::vector<int> cpus,
                                                           absl::Duration window) {
  if (cpus.empty()) return absl::InvalidArgumentError("keep-awake: no CPU to keep awake");
  if (window < absl::Microseconds(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "keep-awake: the window must be at least 1us (got ", absl::FormatDuration(window), ")"));
  }
  std::unique_ptr<KeepAwake> awake(new KeepAwake(window));
  {
    absl::MutexLock lock(&awake->mu_);
    awake->tids_.assign(cpus.size(), 0);
    awake->started_.assign(cpus.size(), absl::UnknownError("not started"));
  }
  for (size_t i = 0; i < cpus.size(); ++i) {
    awake->threads_.emplace_back([self = awake.get(), i, cpu = cpus[i]] {
      self->SpinnerLoop(i, cpu);
    });
  }
  absl::Status failed;
  {
    absl::MutexLock lock(&awake->mu_);
    awake->mu_.Await(absl::Condition(
        +[](KeepAwake* k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu_) {
          for (pid_t tid : k->tids_) {
            if (tid == 0) return false;
          }
          return true;
        },
        awake.get()));
    for (size_t i = 0; i < cpus.size(); ++i) {
      if (!awake->started_[i].ok() && failed.ok()) {
        failed = absl::Status(awake->started_[i].code(),
                              absl::StrCat("keep-awake spinner on CPU ", cpus[i], ": ",
                                           awake->started_[i].message()));
      }
    }
  }
  if (!failed.ok()) return failed;  // the destructor stops the others
  return awake;
}

KeepAwake::~KeepAwake() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  stopping_.store(true, std::memory_order_relaxed);
  for (std::thread& thread : threads_) thread.join();
}

std::vector<pid_t> KeepAwake::thread_ids() const {
  absl::MutexLock lock(&mu_);
  return tids_;
}

void KeepAwake::WakeSpinners() {
  absl::MutexLock lock(&mu_);
  ++wakes_;
}

void KeepAwake::SpinnerLoop(size_t index, int cpu) {
  pthread_setname_np(pthread_self(), "agx-awake");
  absl::Status status = base::SetThreadCpus(0, base::CpuSetOf(cpu));
  if (status.ok()) status = MakeIdlePriority();
  {
    absl::MutexLock lock(&mu_);
    tids_[index] = static_cast<pid_t>(::syscall(SYS_gettid));
    started_[index] = status;
  }
  if (!status.ok()) return;

  uint64_t seen = activity_.load(std::memory_order_relaxed);
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      // Announce the sleep before the last look at the counter: a Touch
      // after that look sees sleeping_ and wakes us (both sequentially
      // consistent, so one of the two sees the other).
      sleeping_.fetch_add(1, std::memory_order_seq_cst);
      if (!stop_ && activity_.load(std::memory_order_seq_cst) == seen) {
        const uint64_t wakes = wakes_;
        auto woken = [this, wakes]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || wakes_ != wakes;
        };
        mu_.Await(absl::Condition(&woken));
      }
      sleeping_.fetch_sub(1, std::memory_order_seq_cst);
      if (stop_) return;
    }
    // Spin until the window has passed without a Touch.
    seen = activity_.load(std::memory_order_relaxed);
    absl::Time last = absl::Now();
    while (!stopping_.load(std::memory_order_relaxed)) {
      for (int i = 0; i < kPausesPerLook; ++i) CpuRelax();
      const uint64_t now_seen = activity_.load(std::memory_order_relaxed);
      const absl::Time now = absl::Now();
      if (now_seen != seen) {
        seen = now_seen;
        last = now;
      } else if (now - last >= window_) {
        break;
      }
    }
  }
}

}  // namespace agentix::sandbox
