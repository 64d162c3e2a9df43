#include "worker/channel/intake_baton.h"

#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace agentix::worker {

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
  while (true) {
    const int n = ::poll(fds, 2, -1);
    if (n < 0 && errno == EINTR) continue;
    // A poll error (never expected on these fds) is reported as readable:
    // the reader's read then reports the channel's state.
    if (n > 0 && (fds[1].revents & POLLIN) != 0) return Turn::kStopped;
    return Turn::kReadable;
  }
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
