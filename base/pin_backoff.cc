#include "base/pin_backoff.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace agentix::base {

bool PinBackoff::NotePinned(int64_t calls, absl::Duration wait,
                            absl::Time now) {
  if (calls <= 0) return false;
  if (wait / calls <= kWaitPerCall) {
    period_ = kFirst;
    after_backoff_ = false;
    return false;
  }
  // Still busy right after a back-off: the next one is longer.
  if (after_backoff_) period_ = std::min(period_ * 2, kLongest);
  after_backoff_ = true;
  until_ = now + period_;
  return true;
}

namespace {

constexpr size_t kSchedstatBytes = 96;

// "<on-CPU ns> <run-queue wait ns> <timeslices>\n", `n` bytes of it read
// into `text` (kSchedstatBytes, room for the terminator) -> the wait; zero
// for nothing read.
absl::Duration ParseWait(char* text, ssize_t n) {
  if (n <= 0) return absl::ZeroDuration();
  text[n] = '\0';
  char* end = nullptr;
  std::strtoull(text, &end, 10);
  const unsigned long long waited = std::strtoull(end, nullptr, 10);
  return absl::Nanoseconds(static_cast<int64_t>(waited));
}

// The calling thread's own schedstat, opened at its first reading and kept
// for the thread's life: each reading is one pread (~2 us). Opening the file
// at every reading put an openat of 17-57 us (median 34, traced) on the
// result path of one call in CallsCpu::kSampleCalls (256) in the daemon's
// worker reader: that call's median latency was ~1.6x p50 (PERFORMANCE.md,
// "stop-35: the slow call every 256 calls"). Bound to the thread id it was
// opened by: a forked child's copy of the thread opens its own, and leaves
// the inherited descriptor alone (the child may have closed it, and its
// number may name another file by now).
class OwnSchedstat {
 public:
  ~OwnSchedstat() {
    if (fd_ >= 0) ::close(fd_);
  }

  // `tid`: the calling thread's id.
  absl::Duration Read(pid_t tid) {
    if (tid != tid_) {
      fd_ = ::open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
      tid_ = tid;
    }
    if (fd_ < 0) return absl::ZeroDuration();  // the kernel does not keep it
    char text[kSchedstatBytes];
    return ParseWait(text, ::pread(fd_, text, sizeof(text) - 1, 0));
  }

 private:
  int fd_ = -1;
  pid_t tid_ = 0;
};

}  // namespace

absl::Duration ThreadRunQueueWait(pid_t tid) {
  const pid_t self = ::gettid();
  if (tid == 0 || tid == self) {
    thread_local OwnSchedstat own;
    return own.Read(self);
  }
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/task/%d/schedstat", static_cast<int>(tid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ZeroDuration();
  char text[kSchedstatBytes];
  const ssize_t n = ::read(fd, text, sizeof(text) - 1);
  ::close(fd);
  return ParseWait(text, n);
}

}  // namespace agentix::base
