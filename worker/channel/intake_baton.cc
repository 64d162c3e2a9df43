#include "worker/channel/intake_baton.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace agentix::worker {
namespace {

std::atomic<int64_t> spin_most_ns{0};
std::atomic<bool> avoid_holder_cpu{false};
std::atomic<int64_t> look_slack_ns{
    absl::ToInt64Nanoseconds(IntakeBaton::kDefaultLookSlack)};

// poll(fds, count, -1), retried on EINTR.
int PollBlocking(pollfd* fds, nfds_t count) {
  int n;
  while ((n = ::poll(fds, count, -1)) < 0 && errno == EINTR) {
  }
  return n;
}

// ppoll(fds, count) until `due`: > 0 ready, 0 at `due`, < 0 failed; retried
// on EINTR. The kernel may end the wait up to the thread's timer slack late.
int PollUntil(pollfd* fds, nfds_t count, absl::Time due) {
  int n;
  do {
    const timespec left = absl::ToTimespec(std::max(due - absl::Now(), absl::ZeroDuration()));
    n = ::ppoll(fds, count, &left, nullptr);
  } while (n < 0 && errno == EINTR);
  return n;
}

// Reads a nonblocking eventfd or timerfd: whether it had fired.
bool Consume(int fd) {
  uint64_t count = 0;
  return ::read(fd, &count, sizeof count) == sizeof count && count > 0;
}

// For as long as it lives, the calling thread is SCHED_BATCH if it was
// SCHED_OTHER: a follower woken by its timer then waits for the thread
// running on that CPU (usually one of the call chain's) to block, instead of
// preempting it mid-hop, which left the chain's thread queued for the other
// CPU to pull and spread the chain over both (docs/DECISIONS.md, "The
// sequential tail"). Best effort: if the policy cannot change, nothing does.
class BatchWhileFollowing {
 public:
  BatchWhileFollowing() {
    const sched_param none = {};
    batched_ = ::sched_getscheduler(0) == SCHED_OTHER &&
               ::sched_setscheduler(0, SCHED_BATCH, &none) == 0;
  }
  ~BatchWhileFollowing() {
    const sched_param none = {};
    if (batched_) ::sched_setscheduler(0, SCHED_OTHER, &none);
  }
  BatchWhileFollowing(const BatchWhileFollowing&) = delete;
  BatchWhileFollowing& operator=(const BatchWhileFollowing&) = delete;

 private:
  bool batched_ = false;
};

// For as long as it lives, the calling thread's timer slack is `slack` (its
// own again after: the follower goes on to run user code, whose sleeps must
// not come late). Best effort, as BatchWhileFollowing.
class SlackWhileFollowing {
 public:
  explicit SlackWhileFollowing(int64_t slack_ns) {
    const int old = ::prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    if (slack_ns > 0 && old >= 0 &&
        ::prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(slack_ns), 0, 0, 0) == 0) {
      old_ = old;
    }
  }
  ~SlackWhileFollowing() {
    if (old_ >= 0) ::prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(old_), 0, 0, 0);
  }
  SlackWhileFollowing(const SlackWhileFollowing&) = delete;
  SlackWhileFollowing& operator=(const SlackWhileFollowing&) = delete;

 private:
  int old_ = -1;
};

// For as long as it lives, the calling thread may run anywhere in `all` but
// on the CPU last given to Avoid (the call path's, when there is one and
// another CPU is allowed): a follower waits off the call path's CPU, so the
// timer it arms fires there and it is woken there (docs/DECISIONS.md, "The
// noop's p99"). It would otherwise stay where it last ran, which after a
// hand-over is the call path's CPU. Best effort, as BatchWhileFollowing.
class AwayFromCpu {
 public:
  explicit AwayFromCpu(const cpu_set_t& all) : all_(all) {}
  ~AwayFromCpu() { Avoid(-1); }
  AwayFromCpu(const AwayFromCpu&) = delete;
  AwayFromCpu& operator=(const AwayFromCpu&) = delete;

  // Moves off `cpu` (< 0: back to the whole mask); nothing if unchanged.
  void Avoid(int cpu) {
    if (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &all_) || CPU_COUNT(&all_) < 2) {
      cpu = -1;
    }
    if (cpu == avoided_) return;
    cpu_set_t mask = all_;
    if (cpu >= 0) CPU_CLR(cpu, &mask);
    if (::sched_setaffinity(0, sizeof(mask), &mask) == 0) avoided_ = cpu;
  }

 private:
  const cpu_set_t all_;
  int avoided_ = -1;
};

void Arm(int timer_fd, absl::Duration after) {
  itimerspec spec = {};
  spec.it_value = absl::ToTimespec(after);
  // Cannot fail on a valid timerfd and a positive, normalised time.
  ::timerfd_settime(timer_fd, 0, &spec, nullptr);
}

}  // namespace

void IntakeBaton::SetLookSlack(absl::Duration slack) {
  look_slack_ns.store(absl::ToInt64Nanoseconds(std::max(slack, absl::ZeroDuration())),
                      std::memory_order_relaxed);
}

void IntakeBaton::SetSpin(absl::Duration most) {
  spin_most_ns.store(absl::ToInt64Nanoseconds(most), std::memory_order_relaxed);
}

absl::StatusOr<std::unique_ptr<IntakeBaton>> IntakeBaton::Create(
    int channel_fd, const ipc::PayloadArea* placement,
    std::unique_ptr<ChannelWait> wait) {
  int fds[3] = {-1, -1, -1};
  fds[0] = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fds[0] >= 0) fds[1] = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fds[1] >= 0) {
    fds[2] = ::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
  }
  if (fds[2] < 0) {
    const int error = errno;
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
    return absl::InternalError(absl::StrCat("eventfd/timerfd: ", error));
  }
  return std::unique_ptr<IntakeBaton>(
      new IntakeBaton(channel_fd, fds[0], fds[1], fds[2], placement, std::move(wait)));
}

IntakeBaton::IntakeBaton(int channel_fd, int stop_fd, int wake_fd,
                         int timer_fd, const ipc::PayloadArea* placement,
                         std::unique_ptr<ChannelWait> wait)
    : channel_fd_(channel_fd),
      stop_fd_(stop_fd),
      wake_fd_(wake_fd),
      timer_fd_(timer_fd),
      placement_(placement),
      wait_(std::move(wait)) {
  CPU_ZERO(&all_);
  // Without the mask to go back to, nothing is pinned (PollChannel).
  if (::sched_getaffinity(0, sizeof(all_), &all_) != 0) CPU_ZERO(&all_);
}

IntakeBaton::~IntakeBaton() {
  ::close(stop_fd_);
  ::close(wake_fd_);
  ::close(timer_fd_);
}

IntakeBaton::Turn IntakeBaton::Lead(bool holding) {
  if (!holding) {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopped_) return Turn::kStopped;
    if (!pool_mode_ || (!passed_ && followers_ > 0)) return Turn::kLeave;
    ++followers_;
    lock.unlock();
    const BatchWhileFollowing batch;  // back to SCHED_OTHER before it reads
    const int64_t slack_ns = look_slack_ns.load(std::memory_order_relaxed);
    const SlackWhileFollowing slack(slack_ns);
    // Back to the whole mask before it reads, too; it follows a change of
    // the call path's CPU when it next wakes (within ~kDeferBound while
    // offers come).
    AwayFromCpu away(all_);
    const auto avoid_path = [&] { away.Avoid(PathCpu()); };
    avoid_path();
    lock.lock();
    // Waits in poll rather than on a condition variable: the offer's timer
    // must wake it without the holder's help.
    pollfd wait[3] = {
        {wake_fd_, POLLIN, 0}, {timer_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    // A look this thread waits for itself, with the slack (InfiniteFuture:
    // none); while one is due, timer_armed_ stands for it.
    absl::Time look_at = absl::InfiniteFuture();
    while (!passed_ && pool_mode_ && !stopped_) {
      lock.unlock();
      if (look_at == absl::InfiniteFuture()) {
        PollBlocking(wait, 3);
      } else {
        PollUntil(wait, 3, look_at);
      }
      // The reads and the arming are syscalls (on a VM the arming is a
      // timer reprogramming): outside the lock, which the holder takes at
      // every call, so it never sleeps on it waiting for this thread.
      Consume(wake_fd_);
      bool fired = Consume(timer_fd_);
      if (look_at != absl::InfiniteFuture() && absl::Now() >= look_at) {
        fired = true;
        look_at = absl::InfiniteFuture();
      }
      avoid_path();
      lock.lock();
      // The timer is armed once for a run of offers, not per offer: when it
      // fires, the standing offer is taken if it is old enough, else the
      // timer is armed for the rest of its time; with none standing it is
      // armed for another kDeferBound if offers came since it last fired,
      // else it stays off until the next offer. Armed here, it fires on this
      // thread's CPU: while calls stream, the holder's (the call path's) CPU
      // takes no timer interrupt and sends no wake-up to this one
      // (docs/DECISIONS.md, "The noop's p99"). Unless a follower took an
      // offer lately, this thread waits for the look itself with the slack
      // (look_at) instead: with the call path spread over every CPU there is
      // no CPU off it, and the look then rides its CPU's tick.
      absl::Duration arm = absl::ZeroDuration();
      const absl::Time now = absl::Now();
      if (fired) {
        timer_armed_ = false;
        if (deferred_) {
          const absl::Duration left = offered_at_ + kDeferBound - now;
          if (left <= absl::ZeroDuration()) {
            deferred_ = false;
            passed_ = true;
            ++handovers_;
            exact_until_ = now + kExactAfterTake;
          } else {
            arm = left;
          }
        } else if (offered_since_fire_) {
          arm = kDeferBound;
        }
        offered_since_fire_ = false;
      }
      if (arm > absl::ZeroDuration()) {
        // Marked armed first: an offer meanwhile does not arm it again.
        timer_armed_ = true;
        if (slack_ns > 0 && now >= exact_until_) {
          look_at = now + arm;
          ++slack_looks_;
        } else {
          ++exact_looks_;
          lock.unlock();
          Arm(timer_fd_, arm);
          lock.lock();
        }
      }
    }
    // A look of its own still due leaves with this thread: the next offer
    // arms the timer again.
    if (look_at != absl::InfiniteFuture()) timer_armed_ = false;
    --followers_;
    if (stopped_) return Turn::kStopped;
    if (!passed_) return Turn::kLeave;  // pool mode ended
    passed_ = false;                    // ours
  }
  // A wait_ does not see stop_fd_: a stop before it begins is seen here,
  // one during it wakes it (Stop).
  if (wait_ != nullptr && stopped_seen_.load(std::memory_order_acquire)) {
    return Turn::kStopped;
  }
  pollfd fds[2] = {{channel_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
  const int cpu = placement_ != nullptr && CPU_COUNT(&all_) > 0
                      ? placement_->WaitCpu()
                      : -1;
  cpu_set_t one;
  CPU_ZERO(&one);
  if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &one);
  // The scheduler places a woken thread by its mask at wake time, and a
  // thread keeps running where it is when its mask widens: pinned for the
  // wait only.
  const bool pinned = CPU_COUNT(&one) > 0 &&
                      ::sched_setaffinity(0, sizeof(one), &one) == 0;
  const int n = PollChannel(fds);
  if (pinned) ::sched_setaffinity(0, sizeof(all_), &all_);
  // A poll error (never expected on these fds) is reported as readable:
  // the reader's read then reports the channel's state.
  if (wait_ != nullptr) {
    if (stopped_seen_.load(std::memory_order_acquire)) return Turn::kStopped;
  } else if (n > 0 && (fds[1].revents & POLLIN) != 0) {
    return Turn::kStopped;
  }
  return Turn::kReadable;
}

int IntakeBaton::WaitOnce(pollfd* fds, int timeout_ms) {
  return wait_ != nullptr ? wait_->Wait(timeout_ms) : ::poll(fds, 2, timeout_ms);
}

int IntakeBaton::PollChannel(pollfd* fds) {
  int n = 0;
  const int64_t most = spin_most_ns.load(std::memory_order_relaxed);
  if (most > 0) {
    int64_t window = spin_window_ns_.load(std::memory_order_relaxed);
    if (window < 0) window = most;
    const absl::Time since = absl::Now();
    const absl::Time until = since + absl::Nanoseconds(window);
    if (window >= 1000) {
      do {
        n = WaitOnce(fds, 0);
      } while (n == 0 && absl::Now() < until);
    }
    if (n == 0 || (n < 0 && errno == EINTR)) {
      n = WaitBlocking(fds);
      // The whole wait counts: double after a short one, halve after a long one.
      window = absl::Now() - since <= absl::Nanoseconds(most)
                   ? std::min(most, std::max<int64_t>(window * 2, 1000))
                   : window / 2;
    }
    spin_window_ns_.store(window, std::memory_order_relaxed);
  } else {
    n = WaitBlocking(fds);
  }
  return n;
}

int IntakeBaton::WaitBlocking(pollfd* fds) {
  int n;
  while ((n = WaitOnce(fds, -1)) < 0 && errno == EINTR) {
  }
  return n;
}

void IntakeBaton::WakeFollower() {
  const uint64_t one = 1;
  // Cannot fail short of a programming error (the counter is far from full).
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof one);
}

void IntakeBaton::Withdraw() {
  // The timer stays armed: it fires once, finds no offer and stays off.
  deferred_ = false;
}

bool IntakeBaton::Pass() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (followers_ == 0 || stopped_ || !pool_mode_) return false;
    Withdraw();
    passed_ = true;
    ++handovers_;
  }
  WakeFollower();
  return true;
}

void IntakeBaton::SetAvoidHolderCpu(bool on) {
  avoid_holder_cpu.store(on, std::memory_order_relaxed);
}

int IntakeBaton::PathCpu() const {
  const int placed = placement_ != nullptr ? placement_->WaitCpu() : -1;
  if (placed >= 0 || !avoid_holder_cpu.load(std::memory_order_relaxed)) return placed;
  return offer_cpu_.load(std::memory_order_relaxed);
}

bool IntakeBaton::Defer() {
  // Where the call path runs when nothing is placed (direct calls: the
  // daemon, which places, sees no call): read before the lock, a vDSO call.
  offer_cpu_.store(::sched_getcpu(), std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mu_);
  if (followers_ == 0 || stopped_ || !pool_mode_ || passed_) return false;
  deferred_ = true;
  offered_since_fire_ = true;
  offered_at_ = absl::Now();
  if (!timer_armed_) {
    Arm(timer_fd_, kDeferBound);
    timer_armed_ = true;
    ++holder_arms_;
  }
  return true;
}

bool IntakeBaton::Reclaim() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!deferred_) return false;
  Withdraw();
  return true;
}

void IntakeBaton::ToPool() {
  std::lock_guard<std::mutex> lock(mu_);
  pool_mode_ = true;
  passed_ = false;
  Withdraw();
}

void IntakeBaton::ToLoop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pool_mode_ = false;
    passed_ = false;
    Withdraw();
  }
  WakeFollower();
}

void IntakeBaton::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    stopped_seen_.store(true, std::memory_order_release);
  }
  const uint64_t one = 1;
  // Cannot fail short of a programming error (the counter is far from full).
  [[maybe_unused]] ssize_t n = ::write(stop_fd_, &one, sizeof one);
  if (wait_ != nullptr) wait_->Wake();
}

int IntakeBaton::followers() {
  std::lock_guard<std::mutex> lock(mu_);
  return followers_;
}

int64_t IntakeBaton::holder_arms() {
  std::lock_guard<std::mutex> lock(mu_);
  return holder_arms_;
}

int64_t IntakeBaton::slack_looks() {
  std::lock_guard<std::mutex> lock(mu_);
  return slack_looks_;
}

int64_t IntakeBaton::exact_looks() {
  std::lock_guard<std::mutex> lock(mu_);
  return exact_looks_;
}

int64_t IntakeBaton::handovers() {
  std::lock_guard<std::mutex> lock(mu_);
  return handovers_;
}

}  // namespace agentix::worker
