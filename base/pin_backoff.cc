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

absl::Duration ThreadRunQueueWait(pid_t tid) {
  // "<on-CPU ns> <run-queue wait ns> <timeslices>\n"
  char path[64] = "/proc/thread-self/schedstat";
  if (tid != 0) std::snprintf(path, sizeof(path), "/proc/self/task/%d/schedstat", static_cast<int>(tid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ZeroDuration();
  char text[96];
  const ssize_t n = ::read(fd, text, sizeof(text) - 1);
  ::close(fd);
  if (n <= 0) return absl::ZeroDuration();
  text[n] = '\0';
  char* end = nullptr;
  std::strtoull(text, &end, 10);
  const unsigned long long waited = std::strtoull(end, nullptr, 10);
  return absl::Nanoseconds(static_cast<int64_t>(waited));
}

}  // namespace agentix::base
