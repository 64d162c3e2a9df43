// Who reads the frame channel while the driver's pool threads do
// (leader/follower; worker/README.md, "Leader/follower intake"): at most one
// pool thread holds the baton and polls the channel; the one that reads a
// sync call runs it itself, so the call costs no thread hand-off. It offers
// the baton first (Defer): a follower takes it only if the call still runs
// after kDeferBound (a timerfd wakes it, armed once per kDeferBound while
// offers come, by the follower itself after the first), so a short call
// wakes no second thread and a long one holds up the next frames for at
// most about 2 x kDeferBound.
// Followers wait here without the GIL, so a hand-over wakes one thread and
// touches no Python. The event loop reads the channel instead
// whenever the baton is not in pool mode (the driver switches).
#pragma once

#include <poll.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include <sched.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/ipc/payload_area.h"

namespace agentix::worker {

// How a holder waits for a channel whose reader wants what the wait saw
// (the direct connections' poll set: DirectConns::WaitReady keeps the events
// for the read's look, one system call instead of a poll and a look).
class ChannelWait {
 public:
  virtual ~ChannelWait() = default;
  // Waits up to `timeout_ms` (-1: no limit) for the channel: > 0 ready, 0
  // nothing, < 0 failed (errno).
  virtual int Wait(int timeout_ms) = 0;
  // Makes a Wait return: the one waiting now, or else the next at once.
  virtual void Wake() = 0;
};

class IntakeBaton {
 public:
  enum class Turn {
    kReadable,  // the caller holds the baton and the channel is readable
    kLeave,     // not needed as a reader: back to the pool
    kStopped,   // Stop() was called
  };

  // `channel_fd` is polled, never closed or read here. `placement` (may be
  // null; it must outlive the baton): the holder's poll runs pinned to its
  // WaitCpu() when there is one (the daemon's --calls_cpu, sandbox/calls_cpu.h),
  // so the daemon's frame wakes it on the call path's CPU; Lead() returns
  // with the thread's mask back to the one the process had here, so the call
  // it runs next (and the threads that call starts) is never pinned.
  // With a `wait`, the holder waits in it instead of polling `channel_fd`
  // (which it then never touches), and Stop() wakes it there.
  static absl::StatusOr<std::unique_ptr<IntakeBaton>> Create(
      int channel_fd, const ipc::PayloadArea* placement = nullptr,
      std::unique_ptr<ChannelWait> wait = nullptr);
  ~IntakeBaton();
  IntakeBaton(const IntakeBaton&) = delete;
  IntakeBaton& operator=(const IntakeBaton&) = delete;

  // Blocks (call without the GIL). With `holding`, the caller already holds
  // the baton and just polls; otherwise it waits as a follower until the
  // baton is passed to it: kLeave at once if a follower waits already (one
  // is enough) or pool mode is off, and kLeave later if pool mode ends.
  // A SCHED_OTHER follower waits as SCHED_BATCH, and is SCHED_OTHER again
  // when this returns; with a `placement` CPU (and another one allowed) it
  // waits off that CPU — with none published (direct calls bypass the
  // daemon that places) and SetAvoidHolderCpu, off the CPU the holder last
  // offered from, so the
  // offer's timer, which it arms, never fires on the call path's CPU — and
  // has the process's mask back before it polls or returns.
  Turn Lead(bool holding);

  // The holder hands the baton to a waiting follower: true if one was
  // waiting (it is woken and polls next); false, and the caller still holds
  // the baton, if none was.
  bool Pass();

  // The holder, about to run a call it read, offers the baton: the waiting
  // follower takes it (and polls) if the holder has not called Reclaim()
  // within kDeferBound. False (nothing offered, the caller still holds the
  // baton) if no follower waits, pool mode is off or Stop() was called.
  bool Defer();
  // The holder, back from the call: true if the baton is still its own (the
  // offer is withdrawn; poll with Lead(true)); false if a follower took it
  // or nothing was offered (wait as a follower with Lead(false)).
  bool Reclaim();

  // Pool mode on: the caller (the loop, which stopped reading) makes a
  // thread the holder (Lead(true)).
  void ToPool();
  // Pool mode off (the holder gives the channel to the loop); waiting
  // followers leave.
  void ToLoop();
  // Every Lead() returns kStopped, now and later; wakes a polling holder.
  void Stop();

  // For tests: followers waiting now; hand-overs so far (passes, and offers
  // a follower took); offers that armed the offer's timer (the holder's CPU
  // takes its interrupt) so far; looks the followers waited for with the
  // slack, and exact ones they armed the timer for.
  int followers();
  int64_t handovers();
  int64_t holder_arms();
  int64_t slack_looks();
  int64_t exact_looks();

  // Whether a follower with no published CPU waits off the holder's (the
  // worker's --direct_calls, process-wide, set once at start; off: it waits
  // with the whole mask, as --calls_cpu=off promises the relayed path).
  static void SetAvoidHolderCpu(bool on);

  // How long a Defer()'s offer stands before the follower takes the baton.
  static constexpr absl::Duration kDeferBound = absl::Milliseconds(1);

  // While short calls stream, the follower's looks (one per kDeferBound)
  // may come up to this much late (`SetLookSlack`; the default): it waits
  // for them in ppoll with this timer slack instead of arming the timerfd,
  // so the kernel expires them with the next tick of its CPU (every 4 ms at
  // HZ=250) rather than with an interrupt of their own on a CPU that a
  // spread call path uses (docs/DECISIONS.md, "stop-45: the intake
  // follower's looks ride the tick"). A long call then holds up the next
  // frames for up to kDeferBound + the slack; after a look found one (the
  // follower took the baton) the looks are exact for kExactAfterTake.
  // Zero: always exact.
  static constexpr absl::Duration kDefaultLookSlack = absl::Milliseconds(4);
  static constexpr absl::Duration kExactAfterTake = absl::Seconds(10);
  static void SetLookSlack(absl::Duration slack);

  // The holder's poll first polls without sleeping for up to `most` (the
  // worker's --intake-spin-us; process-wide, set once at start), adapting
  // as the daemon's reader (sandbox/worker_process.h, read_spin): a wait
  // longer than `most` halves the next window, a shorter one doubles it.
  // Zero (default): it blocks at once.
  static void SetSpin(absl::Duration most);

 private:
  IntakeBaton(int channel_fd, int stop_fd, int wake_fd, int timer_fd,
              const ipc::PayloadArea* placement,
              std::unique_ptr<ChannelWait> wait);
  // The holder's wait for the channel (or a stop): > 0 ready, < 0 failed.
  int PollChannel(pollfd* fds);
  // One look or wait of PollChannel's, in wait_ or on `fds`, for up to
  // `timeout_ms` (0: a look).
  int WaitOnce(pollfd* fds, int timeout_ms);
  // WaitOnce with no time limit, again while it ends in EINTR.
  int WaitBlocking(pollfd* fds);
  // Under mu_: withdraws an offer.
  void Withdraw();
  // Follower: wakes it to look at the state again.
  void WakeFollower();
  // The CPU a follower waits off: the placement's WaitCpu() if published,
  // else (with SetAvoidHolderCpu) the CPU of the holder's latest offer
  // (-1: none yet).
  int PathCpu() const;

  const int channel_fd_;
  const int stop_fd_;   // eventfd, readable once stopped
  const int wake_fd_;   // eventfd: a follower looks at the state again
  const int timer_fd_;  // timerfd, armed while an offer stands
  const ipc::PayloadArea* const placement_;
  const std::unique_ptr<ChannelWait> wait_;  // null: poll channel_fd_
  // stopped_, for a holder that waits in wait_ (which does not see
  // stop_fd_): read without the lock before and after its wait.
  std::atomic<bool> stopped_seen_{false};
  cpu_set_t all_;  // the process's mask at Create: restored after a pinned wait
  std::mutex mu_;
  bool pool_mode_ = false;
  bool passed_ = false;    // handed to the followers, not yet taken
  bool deferred_ = false;  // offered (Defer), neither taken nor reclaimed
  absl::Time offered_at_;   // when the standing offer was made
  bool timer_armed_ = false;  // armed, or fired and not yet consumed
  bool offered_since_fire_ = false;  // Defer() since the timer last fired
  int64_t holder_arms_ = 0;
  int64_t slack_looks_ = 0;
  int64_t exact_looks_ = 0;
  // Until then a follower's looks are exact (a follower took an offer: long
  // calls come, and their hold-up is kept to ~2 x kDeferBound).
  absl::Time exact_until_ = absl::InfinitePast();
  int64_t handovers_ = 0;
  bool stopped_ = false;
  int followers_ = 0;
  // sched_getcpu() at the latest Defer(): the call path's CPU when there is
  // no placement to follow.
  std::atomic<int> offer_cpu_{-1};
  // The current spin window (ns); only the holder uses it.
  std::atomic<int64_t> spin_window_ns_{-1};
};

}  // namespace agentix::worker
