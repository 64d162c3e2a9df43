#include "worker/channel/intake_baton.h"

#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace agentix::worker {
namespace {

std::atomic<int64_t> spin_most_ns{0};

// poll(fds, 2, -1), retried on EINTR.
int PollBlocking(pollfd* fds) {
  int n;
  while ((n = ::poll(fds, 2, -1)) < 0 && errno == EINTR) {
  }
  return n;
}

}  // namespace

void IntakeBaton::SetSpin(absl::Duration most) {
  spin_most_ns.store(absl::ToInt64Nanoseconds(most), std::memory_order_relaxed);
}

absl::StatusOr<std::unique_ptr<IntakeBaton>> IntakeBaton::Create(
    int channel_fd) {
  const int stop_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd < 0) {
    return absl::InternalError(absl::StrCat("eventfd: ", errno));
  }
  return std::unique_ptr<IntakeBaton>(new IntakeBaton(channel_fd, stop_fd));
}

IntakeBaton::IntakeBaton(int channel_fd, int stop_fd)
    : channel_fd_(channel_fd), stop_fd_(stop_fd) {}

IntakeBaton::~IntakeBaton() { ::close(stop_fd_); }

IntakeBaton::Turn IntakeBaton::Lead(bool holding) {
  if (!holding) {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopped_) return Turn::kStopped;
    if (!pool_mode_ || (!passed_ && followers_ > 0)) return Turn::kLeave;
    ++followers_;
    cv_.wait(lock, [this] { return passed_ || !pool_mode_ || stopped_; });
    --followers_;
    if (stopped_) return Turn::kStopped;
    if (!passed_) return Turn::kLeave;  // pool mode ended
    passed_ = false;                    // ours
  }
  pollfd fds[2] = {{channel_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
  int n = 0;
  const int64_t most = spin_most_ns.load(std::memory_order_relaxed);
  if (most > 0) {
    int64_t window = spin_window_ns_.load(std::memory_order_relaxed);
    if (window < 0) window = most;
    const absl::Time since = absl::Now();
    const absl::Time until = since + absl::Nanoseconds(window);
    if (window >= 1000) {
      do {
        n = ::poll(fds, 2, 0);
      } while (n == 0 && absl::Now() < until);
    }
    if (n == 0 || (n < 0 && errno == EINTR)) {
      n = PollBlocking(fds);
      // The whole wait counts: double after a short one, halve after a long one.
      window = absl::Now() - since <= absl::Nanoseconds(most)
                   ? std::min(most, std::max<int64_t>(window * 2, 1000))
                   : window / 2;
    }
    spin_window_ns_.store(window, std::memory_order_relaxed);
  } else {
    n = PollBlocking(fds);
  }
  // A poll error (never expected on these fds) is reported as readable:
  // the reader's read then reports the channel's state.
  if (n > 0 && (fds[1].revents & POLLIN) != 0) return Turn::kStopped;
  return Turn::kReadable;
}

bool IntakeBaton::Pass() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (followers_ == 0 || stopped_ || !pool_mode_) return false;
    passed_ = true;
  }
  cv_.notify_one();
  return true;
}

void IntakeBaton::ToPool() {
  std::lock_guard<std::mutex> lock(mu_);
  pool_mode_ = true;
  passed_ = false;
}

void IntakeBaton::ToLoop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pool_mode_ = false;
    passed_ = false;
  }
  cv_.notify_all();
}

void IntakeBaton::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  cv_.notify_all();
  const uint64_t one = 1;
  // Cannot fail short of a programming error (the counter is far from full).
  [[maybe_unused]] ssize_t n = ::write(stop_fd_, &one, sizeof one);
}

int IntakeBaton::followers() {
  std::lock_guard<std::mutex> lock(mu_);
  return followers_;
}

}  // namespace agentix::worker
