// IntakeBaton: one holder polls, followers wait without spinning, a pass
// wakes exactly the next reader, Stop and ToLoop release everyone; a
// follower waits as SCHED_BATCH.
#include "worker/channel/intake_baton.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <set>
#include <string>
#include <future>
#include <thread>

#include "testing/cpu_masks.h"

namespace agentix::worker {
namespace {

using Turn = IntakeBaton::Turn;
using namespace std::chrono_literals;

struct Sockets {
  int fds[2];
  Sockets() { REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0); }
  ~Sockets() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  void Write() { REQUIRE(::write(fds[1], "x", 1) == 1); }
};

std::unique_ptr<IntakeBaton> Make(int fd) {
  auto baton = IntakeBaton::Create(fd);
  REQUIRE(baton.ok());
  return std::move(*baton);
}

// Waits (bounded) until `n` followers wait.
void AwaitFollowers(IntakeBaton& baton, int n) {
  for (int i = 0; i < 2000 && baton.followers() != n; ++i) {
    std::this_thread::sleep_for(1ms);
  }
  REQUIRE(baton.followers() == n);
}

// Starts one follower (a pool thread waiting for the baton) and waits
// until it waits; its Lead's outcome is the future's.
std::future<Turn> StartFollower(IntakeBaton& baton) {
  auto follower = std::async(std::launch::async,
                             [&baton] { return baton.Lead(false); });
  AwaitFollowers(baton, 1);
  return follower;
}

TEST_CASE("outside pool mode nobody follows and nothing is passed",
          "[intake]") {
  Sockets s;
  auto baton = Make(s.fds[0]);
  CHECK(baton->Lead(false) == Turn::kLeave);
  CHECK_FALSE(baton->Pass());
}

TEST_CASE("the holder polls; a pass reaches the waiting follower only",
          "[intake]") {
  Sockets s;
  auto baton = Make(s.fds[0]);
  baton->ToPool();
  CHECK_FALSE(baton->Pass());  // no follower: the caller keeps the baton
  auto follower = StartFollower(*baton);
  // One follower is enough: a second thread goes back to the pool.
  CHECK(baton->Lead(false) == Turn::kLeave);
  // The follower keeps waiting while the channel is readable but the baton
  // is not passed: it is not a second reader.
  s.Write();
  CHECK(follower.wait_for(50ms) == std::future_status::timeout);
  REQUIRE(baton->Pass());
  REQUIRE(follower.wait_for(5s) == std::future_status::ready);
  CHECK(follower.get() == Turn::kReadable);
  CHECK(baton->followers() == 0);
}

TEST_CASE("a holder's poll blocks until the channel is readable",
          "[intake]") {
  Sockets s;
  auto baton = Make(s.fds[0]);
  baton->ToPool();
  auto holder = std::async(std::launch::async,
                           [&] { return baton->Lead(true); });
  CHECK(holder.wait_for(50ms) == std::future_status::timeout);
  s.Write();
  REQUIRE(holder.wait_for(5s) == std::future_status::ready);
  CHECK(holder.get() == Turn::kReadable);
}

TEST_CASE("ToLoop sends followers back; Stop ends holders and followers",
          "[intake]") {
  Sockets s;
  auto baton = Make(s.fds[0]);
  baton->ToPool();
  auto follower = StartFollower(*baton);
  baton->ToLoop();
  REQUIRE(follower.wait_for(5s) == std::future_status::ready);
  CHECK(follower.get() == Turn::kLeave);
  CHECK_FALSE(baton->Pass());

  baton->ToPool();
  auto holder = std::async(std::launch::async,
                           [&] { return baton->Lead(true); });
  auto second = std::async(std::launch::async,
                           [&] { return baton->Lead(false); });
  AwaitFollowers(*baton, 1);
  baton->Stop();
  REQUIRE(holder.wait_for(5s) == std::future_status::ready);
  REQUIRE(second.wait_for(5s) == std::future_status::ready);
  CHECK(holder.get() == Turn::kStopped);
  CHECK(second.get() == Turn::kStopped);
  CHECK(baton->Lead(false) == Turn::kStopped);
  CHECK(baton->Lead(true) == Turn::kStopped);  // stopped before polling
}

// A ChannelWait over a socket: polls it and its own wake eventfd (never
// drained, as nobody reads for it here), counting the waits.
class SocketWait final : public ChannelWait {
 public:
  explicit SocketWait(int fd) : fd_(fd), wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}
  ~SocketWait() override { ::close(wake_); }
  int Wait(int timeout_ms) override {
    ++waits;
    pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_, POLLIN, 0}};
    return ::poll(fds, 2, timeout_ms);
  }
  void Wake() override {
    const uint64_t one = 1;
    REQUIRE(::write(wake_, &one, sizeof one) == sizeof one);
  }
  std::atomic<int> waits{0};

 private:
  const int fd_;
  const int wake_;
};

TEST_CASE("with a ChannelWait the holder waits in it, and Stop wakes it there", "[intake]") {
  Sockets s;
  // A descriptor that is never readable: the holder must not poll it.
  Sockets unused;
  auto wait = std::make_unique<SocketWait>(s.fds[0]);
  SocketWait& waits = *wait;
  auto made = IntakeBaton::Create(unused.fds[0], nullptr, std::move(wait));
  REQUIRE(made.ok());
  IntakeBaton& baton = **made;
  baton.ToPool();
  auto holder = std::async(std::launch::async, [&] { return baton.Lead(true); });
  CHECK(holder.wait_for(50ms) == std::future_status::timeout);
  s.Write();
  REQUIRE(holder.wait_for(5s) == std::future_status::ready);
  CHECK(holder.get() == Turn::kReadable);
  CHECK(waits.waits >= 1);
  char byte;
  REQUIRE(::read(s.fds[0], &byte, 1) == 1);

  // A stop during the wait ends it: kStopped, though the channel has nothing.
  auto stopped = std::async(std::launch::async, [&] { return baton.Lead(true); });
  CHECK(stopped.wait_for(50ms) == std::future_status::timeout);
  baton.Stop();
  REQUIRE(stopped.wait_for(5s) == std::future_status::ready);
  CHECK(stopped.get() == Turn::kStopped);
  // After the stop a holder does not wait at all.
  const int before = waits.waits;
  CHECK(baton.Lead(true) == Turn::kStopped);
  CHECK(waits.waits == before);
}

// Context switches of thread `tid` of this process so far.
long Switches(pid_t tid) {
  std::ifstream status("/proc/self/task/" + std::to_string(tid) + "/status");
  std::string line;
  long total = 0;
  while (std::getline(status, line)) {
    if (line.rfind("voluntary_ctxt_switches:", 0) == 0 ||
        line.rfind("nonvoluntary_ctxt_switches:", 0) == 0) {
      total += std::stol(line.substr(line.find(':') + 1));
    }
  }
  return total;
}

TEST_CASE("an offer the holder reclaims in time wakes no follower; one it "
          "does not is taken after the bound",
          "[intake]") {
  Sockets s;
  auto baton = Make(s.fds[0]);
  CHECK_FALSE(baton->Defer());  // not in pool mode
  baton->ToPool();
  CHECK_FALSE(baton->Defer());  // no follower: nothing offered
  CHECK_FALSE(baton->Reclaim());
  std::atomic<pid_t> follower_tid{0};
  auto follower = std::async(std::launch::async, [&] {
    follower_tid = ::gettid();
    return baton->Lead(false);
  });
  AwaitFollowers(*baton, 1);
  const long before = Switches(follower_tid);
  // Short calls: offered and reclaimed well within the bound.
  for (int i = 0; i < 200; ++i) {
    REQUIRE(baton->Defer());
    REQUIRE(baton->Reclaim());
  }
  // The timer (armed once for the run) fires once and finds no offer.
  std::this_thread::sleep_for(20ms);
  CHECK(Switches(follower_tid) - before <= 3);
  CHECK(baton->handovers() == 0);
  CHECK(follower.wait_for(0ms) == std::future_status::timeout);
  CHECK(baton->followers() == 1);
  // A long call: the follower takes the baton after kDeferBound and polls.
  s.Write();
  const auto start = std::chrono::steady_clock::now();
  REQUIRE(baton->Defer());
  REQUIRE(follower.wait_for(5s) == std::future_status::ready);
  CHECK(std::chrono::steady_clock::now() - start >= 1ms);
  CHECK(follower.get() == Turn::kReadable);
  CHECK(baton->handovers() == 1);
  CHECK_FALSE(baton->Reclaim());  // taken: the old holder follows now
}

// A run of short calls as the holder made it: how many offers, and the
// longest gap between two (the holder's thread was preempted if it is long).
struct ShortCalls {
  int offers = 0;
  std::chrono::steady_clock::duration longest_gap{};
  // Whether the offers came as a stream: no gap long enough for a look of
  // the follower's to find none since the last (that look rightly leaves the
  // timer off, and the next offer arms it again).
  bool Streamed() const { return longest_gap < absl::ToChronoNanoseconds(IntakeBaton::kDeferBound); }
};

// Offers reclaimed at once, one per ~100 us, for `how_long` and then until
// `enough()` holds (for at most a second more).
template <typename Enough>
ShortCalls StreamShortCalls(IntakeBaton& baton, std::chrono::milliseconds how_long,
                            Enough enough) {
  const auto start = std::chrono::steady_clock::now();
  const auto until = start + how_long;
  const auto cap = until + 1s;
  ShortCalls run;
  auto last = start;
  while (true) {
    const auto now = std::chrono::steady_clock::now();
    if (run.offers > 0) run.longest_gap = std::max(run.longest_gap, now - last);
    if ((now >= until && enough()) || now >= cap) break;
    last = now;
    REQUIRE(baton.Defer());
    REQUIRE(baton.Reclaim());
    ++run.offers;
    std::this_thread::sleep_for(100us);
  }
  return run;
}

ShortCalls StreamShortCalls(IntakeBaton& baton, std::chrono::milliseconds how_long) {
  return StreamShortCalls(baton, how_long, [] { return true; });
}

// After offers stop the timer fires at most twice more and stays off: waits
// up to 10 windows of 20 ms for one in which thread `tid` does not switch
// (a timer that kept firing, every kDeferBound, would switch it in every
// one; a loaded machine may run its last looks late). Whether one came.
bool AwaitQuiet(pid_t tid) {
  for (int window = 0; window < 10; ++window) {
    const long settled = Switches(tid);
    std::this_thread::sleep_for(20ms);
    if (Switches(tid) == settled) return true;
  }
  return false;
}

// Up to this many runs of short calls until one streamed: on a loaded
// machine the test's own thread, the holder here, can be preempted mid-run.
constexpr int kStreamAttempts = 8;

TEST_CASE("while short calls stream, the follower keeps the offer's timer "
          "going itself: only the stream's first offer arms it",
          "[intake]") {
  Sockets s;
  auto baton = Make(s.fds[0]);
  baton->ToPool();
  std::atomic<pid_t> follower_tid{0};
  auto follower = std::async(std::launch::async, [&] {
    follower_tid = ::gettid();
    return baton->Lead(false);
  });
  AwaitFollowers(*baton, 1);
  ShortCalls run;
  int64_t arms = 0;
  long looks = 0;
  bool quiet = false;
  for (int attempt = 0; attempt == 0 || (attempt < kStreamAttempts && !run.Streamed());
       ++attempt) {
    const int64_t arms_before = baton->holder_arms();
    const long before = Switches(follower_tid);
    // Short calls for at least ~30 kDeferBound, and until the follower
    // looked 5 times.
    run = StreamShortCalls(*baton, 30ms,
                           [&] { return Switches(follower_tid) - before >= 5; });
    arms = baton->holder_arms() - arms_before;
    looks = Switches(follower_tid) - before;
    // Offers stop: the timer stays off once it fired with none since.
    quiet = AwaitQuiet(follower_tid);
  }
  REQUIRE(run.Streamed());
  // The holder armed the timer once; after that it fired on the follower,
  // which looked again by itself while offers came (about once per
  // kDeferBound, up to the look slack late: slack looks since stop 45).
  CHECK(arms == 1);
  CHECK(looks >= 5);
  CHECK(baton->handovers() == 0);
  CHECK(quiet);
  // The next stream's first offer arms it again.
  const int64_t arms_before = baton->holder_arms();
  REQUIRE(baton->Defer());
  REQUIRE(baton->Reclaim());
  CHECK(baton->holder_arms() == arms_before + 1);
  CHECK(run.offers > 30);
  baton->ToLoop();
  CHECK(follower.get() == Turn::kLeave);
}

// The timer slack of thread `tid` of this process (ns), -1 if unreadable.
long TimerSlackOf(pid_t tid) {
  std::ifstream in("/proc/" + std::to_string(tid) + "/timerslack_ns");  // a thread id names one too
  long slack = -1;
  in >> slack;
  return in ? slack : -1;
}

TEST_CASE("while short calls stream the follower's looks wait with the slack, not the "
          "timer; once it took an offer they are exact, and a long call is taken either way",
          "[intake]") {
  Sockets s;
  auto baton = Make(s.fds[0]);
  baton->ToPool();
  std::atomic<pid_t> tid{0};
  std::atomic<long> slack_after{-1};
  auto follow = [&] {
    tid = ::gettid();
    const long before = ::prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    const Turn turn = baton->Lead(false);
    // The thread goes on to run calls: its sleeps are as precise as before.
    slack_after = ::prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) == before ? before : -2;
    return turn;
  };
  auto follower = std::async(std::launch::async, follow);
  AwaitFollowers(*baton, 1);
  CHECK(TimerSlackOf(tid) == absl::ToInt64Nanoseconds(IntakeBaton::kDefaultLookSlack));
  ShortCalls run;
  int64_t arms = 0;
  for (int attempt = 0; attempt == 0 || (attempt < kStreamAttempts && !run.Streamed());
       ++attempt) {
    const int64_t arms_before = baton->holder_arms();
    run = StreamShortCalls(*baton, 30ms);
    arms = baton->holder_arms() - arms_before;
    if (!run.Streamed()) AwaitQuiet(tid);
  }
  REQUIRE(run.Streamed());
  CHECK(run.offers > 30);
  CHECK(arms == 1);  // the stream's first offer, as before
  CHECK(baton->slack_looks() >= 1);
  CHECK(baton->exact_looks() == 0);
  CHECK(baton->handovers() == 0);
  // A long call: still taken, after kDeferBound and well within a second.
  s.Write();
  const auto start = std::chrono::steady_clock::now();
  REQUIRE(baton->Defer());
  REQUIRE(follower.wait_for(5s) == std::future_status::ready);
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took >= 1ms);
  CHECK(took < 1s);
  CHECK(follower.get() == Turn::kReadable);
  CHECK(slack_after > 0);
  CHECK(baton->handovers() == 1);
  // Long calls come now: the next follower's looks are exact (the timer).
  auto next = std::async(std::launch::async, follow);
  AwaitFollowers(*baton, 1);
  const int64_t slack_looks = baton->slack_looks();
  StreamShortCalls(*baton, 30ms);
  CHECK(baton->exact_looks() >= 1);
  CHECK(baton->slack_looks() == slack_looks);
  baton->ToLoop();
  REQUIRE(next.wait_for(5s) == std::future_status::ready);
  CHECK(next.get() == Turn::kLeave);
}

TEST_CASE("with no slack every look is exact and the timer slack is left alone", "[intake]") {
  IntakeBaton::SetLookSlack(absl::ZeroDuration());
  Sockets s;
  auto baton = Make(s.fds[0]);
  baton->ToPool();
  std::atomic<pid_t> tid{0};
  auto follower = std::async(std::launch::async, [&] {
    tid = ::gettid();
    return baton->Lead(false);
  });
  AwaitFollowers(*baton, 1);
  CHECK(TimerSlackOf(tid) == ::prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0));
  StreamShortCalls(*baton, 30ms);
  CHECK(baton->exact_looks() >= 1);
  CHECK(baton->slack_looks() == 0);
  baton->ToLoop();
  REQUIRE(follower.wait_for(5s) == std::future_status::ready);
  IntakeBaton::SetLookSlack(IntakeBaton::kDefaultLookSlack);
}

TEST_CASE("a follower waits as SCHED_BATCH and reads or leaves as it came",
          "[intake]") {
  Sockets s;
  auto baton = Make(s.fds[0]);
  baton->ToPool();
  REQUIRE(::sched_getscheduler(0) == SCHED_OTHER);
  std::atomic<pid_t> tid{0};
  std::atomic<int> policy_after{-1};
  auto follow = [&] {
    tid = ::gettid();
    const Turn turn = baton->Lead(false);
    policy_after = ::sched_getscheduler(0);
    return turn;
  };
  // Taken by a pass: the new reader runs as it did before it followed.
  auto follower = std::async(std::launch::async, follow);
  AwaitFollowers(*baton, 1);
  CHECK(::sched_getscheduler(tid) == SCHED_BATCH);
  s.Write();  // the new reader's poll returns at once
  REQUIRE(baton->Pass());
  REQUIRE(follower.wait_for(5s) == std::future_status::ready);
  CHECK(follower.get() == Turn::kReadable);
  CHECK(policy_after == SCHED_OTHER);
  // Sent back to the pool (ToLoop): the same.
  policy_after = -1;
  auto leaver = std::async(std::launch::async, follow);
  AwaitFollowers(*baton, 1);
  CHECK(::sched_getscheduler(tid) == SCHED_BATCH);
  baton->ToLoop();
  REQUIRE(leaver.wait_for(5s) == std::future_status::ready);
  CHECK(leaver.get() == Turn::kLeave);
  CHECK(policy_after == SCHED_OTHER);
  // A thread with a policy of its own keeps it.
  baton->ToPool();
  policy_after = -1;
  auto idle = std::async(std::launch::async, [&] {
    const sched_param none = {};
    REQUIRE(::sched_setscheduler(0, SCHED_IDLE, &none) == 0);
    return follow();
  });
  AwaitFollowers(*baton, 1);
  CHECK(::sched_getscheduler(tid) == SCHED_IDLE);
  baton->Stop();
  REQUIRE(idle.wait_for(5s) == std::future_status::ready);
  CHECK(idle.get() == Turn::kStopped);
  CHECK(policy_after == SCHED_IDLE);
}

TEST_CASE("a pass or ToLoop withdraws a standing offer", "[intake]") {
  Sockets s;
  auto baton = Make(s.fds[0]);
  baton->ToPool();
  auto follower = StartFollower(*baton);
  REQUIRE(baton->Defer());
  baton->ToLoop();
  REQUIRE(follower.wait_for(5s) == std::future_status::ready);
  CHECK(follower.get() == Turn::kLeave);
  CHECK_FALSE(baton->Reclaim());
  CHECK(baton->handovers() == 0);
}

// The calling thread's CPU time.
std::chrono::microseconds ThreadCpu() {
  rusage usage{};
  ::getrusage(RUSAGE_THREAD, &usage);
  return std::chrono::seconds(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         std::chrono::microseconds(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

TEST_CASE("a spinning holder finds frames, stops spinning on a paced channel "
          "and still stops",
          "[intake_baton]") {
  // A long window makes the adaptation measurable: without it every frame
  // of a channel paced slower than the window costs a full window of CPU
  // (30 x 25 ms here); with it, about two windows in all.
  IntakeBaton::SetSpin(absl::Milliseconds(25));
  Sockets s;
  auto baton = Make(s.fds[0]);
  baton->ToPool();
  std::atomic<bool> done{false};
  std::chrono::microseconds paced_cpu{0};
  std::thread holder([&] {
    char byte;
    for (int i = 0; i < 20; ++i) {  // back to back
      REQUIRE(baton->Lead(true) == Turn::kReadable);
      REQUIRE(::read(s.fds[0], &byte, 1) == 1);
    }
    const auto before = ThreadCpu();
    for (int i = 0; i < 30; ++i) {  // paced
      REQUIRE(baton->Lead(true) == Turn::kReadable);
      REQUIRE(::read(s.fds[0], &byte, 1) == 1);
    }
    paced_cpu = ThreadCpu() - before;
    CHECK(baton->Lead(true) == Turn::kStopped);
    done = true;
  });
  for (int i = 0; i < 20; ++i) s.Write();
  for (int i = 0; i < 30; ++i) {
    std::this_thread::sleep_for(30ms);
    s.Write();
  }
  std::this_thread::sleep_for(50ms);
  baton->Stop();
  holder.join();
  IntakeBaton::SetSpin(absl::ZeroDuration());
  INFO("holder CPU over the paced frames: " << paced_cpu.count() << " us");
  CHECK(paced_cpu < 250ms);
  CHECK(done);
}

TEST_CASE("the holder waits pinned to the published CPU and returns with the whole mask",
          "[intake]") {
  const std::set<int> all = testing::CpusOf(0);
  REQUIRE(!all.empty());
  const int cpu = *all.rbegin();
  auto area = ipc::PayloadArea::Create(64 * 1024);
  REQUIRE(area.ok());
  Sockets s;
  auto baton = IntakeBaton::Create(s.fds[0], area->get());
  REQUIRE(baton.ok());
  (*baton)->ToPool();
  for (const int published : {cpu, -1}) {
    (*area)->PublishWaitCpu(published);
    std::atomic<pid_t> tid{0};
    std::set<int> after;
    Turn turn = Turn::kStopped;
    std::thread holder([&] {
      tid = ::gettid();
      turn = (*baton)->Lead(true);
      after = testing::CpusOf(0);  // what the call it would run next gets
      char c;
      (void)!::read(s.fds[0], &c, 1);
    });
    while (tid.load() == 0) std::this_thread::sleep_for(1ms);
    // Waiting in its poll (bounded): the mask it waits with.
    std::set<int> waiting = testing::CpusOf(tid);
    for (int i = 0; i < 2000 && published >= 0 && waiting.size() != 1; ++i) {
      std::this_thread::sleep_for(1ms);
      waiting = testing::CpusOf(tid);
    }
    if (published >= 0) {
      CHECK(waiting == std::set<int>{cpu});
    } else {
      std::this_thread::sleep_for(20ms);
      CHECK(testing::CpusOf(tid) == all);
    }
    s.Write();
    holder.join();
    CHECK(turn == Turn::kReadable);
    CHECK(after == all);
  }
}

TEST_CASE("a follower waits off the published CPU, follows it, and leaves with the whole "
          "mask",
          "[intake]") {
  const std::set<int> all = testing::CpusOf(0);
  REQUIRE(!all.empty());
  const int cpu = *all.rbegin();
  auto area = ipc::PayloadArea::Create(64 * 1024);
  REQUIRE(area.ok());
  Sockets s;
  for (const int published : {cpu, -1}) {
    // A fresh baton: no offer yet, whose CPU a follower would avoid with
    // nothing published (the next test).
    auto baton = IntakeBaton::Create(s.fds[0], area->get());
    REQUIRE(baton.ok());
    (*baton)->ToPool();
    (*area)->PublishWaitCpu(published);
    std::atomic<pid_t> tid{0};
    std::set<int> after;
    auto follower = std::async(std::launch::async, [&] {
      tid = ::gettid();
      const Turn turn = (*baton)->Lead(false);
      after = testing::CpusOf(0);
      return turn;
    });
    AwaitFollowers(**baton, 1);
    std::set<int> expected = all;
    if (published >= 0 && all.size() > 1) expected.erase(published);
    std::set<int> waiting = testing::CpusOf(tid);
    for (int i = 0; i < 2000 && waiting != expected; ++i) {
      std::this_thread::sleep_for(1ms);
      waiting = testing::CpusOf(tid);
    }
    CHECK(waiting == expected);
    if (published >= 0) {
      // The call path moves: the follower moves off the new CPU when it next
      // wakes (here its timer, armed by an offer).
      const int moved = *all.begin();
      (*area)->PublishWaitCpu(moved);
      REQUIRE((*baton)->Defer());
      REQUIRE((*baton)->Reclaim());
      expected = all;
      if (all.size() > 1) expected.erase(moved);
      for (int i = 0; i < 2000 && testing::CpusOf(tid) != expected; ++i) {
        std::this_thread::sleep_for(1ms);
      }
      CHECK(testing::CpusOf(tid) == expected);
    }
    (*baton)->ToLoop();  // followers leave
    CHECK(follower.get() == Turn::kLeave);
    CHECK(after == all);
  }
}

// Runs a holder's offer (Defer, then Reclaim) on a thread pinned to `cpu`.
void OfferFrom(IntakeBaton& baton, int cpu) {
  bool pinned = false, offered = false, reclaimed = false;
  std::thread holder([&] {  // Catch's macros stay on the test's thread
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    pinned = ::sched_setaffinity(0, sizeof(one), &one) == 0;
    offered = baton.Defer();
    reclaimed = baton.Reclaim();
  });
  holder.join();
  REQUIRE(pinned);
  REQUIRE(offered);
  REQUIRE(reclaimed);
}

// Direct calls bypass the daemon, so nothing is published: the follower's
// timer would fire on the CPU it last ran on, after a hand-over the call
// path's (docs/PERFORMANCE.md, "stop-39: the direct noop's p99").
TEST_CASE("with no published CPU a follower waits off the CPU the holder offered from, "
          "and follows it; not unless serving direct calls",
          "[intake]") {
  const std::set<int> all = testing::CpusOf(0);
  REQUIRE(!all.empty());
  auto area = ipc::PayloadArea::Create(64 * 1024);
  REQUIRE(area.ok());
  (*area)->PublishWaitCpu(-1);
  Sockets s;
  auto baton = IntakeBaton::Create(s.fds[0], area->get());
  REQUIRE(baton.ok());
  (*baton)->ToPool();
  std::atomic<pid_t> tid{0};
  std::set<int> after;
  auto follower = std::async(std::launch::async, [&] {
    tid = ::gettid();
    const Turn turn = (*baton)->Lead(false);
    after = testing::CpusOf(0);
    return turn;
  });
  AwaitFollowers(**baton, 1);
  CHECK(testing::CpusOf(tid) == all);  // nothing offered yet: nothing to avoid
  // A relayed worker (--calls_cpu=off publishes nothing either): the
  // follower, woken by the offer's timer, keeps the whole mask.
  IntakeBaton::SetAvoidHolderCpu(false);
  OfferFrom(**baton, *all.rbegin());
  std::this_thread::sleep_for(20ms);
  CHECK(testing::CpusOf(tid) == all);
  // Serving direct calls: the holder offers from one CPU, then from
  // another; the follower, woken by the offer's timer, moves off each.
  IntakeBaton::SetAvoidHolderCpu(true);
  for (const int holder_cpu : {*all.rbegin(), *all.begin()}) {
    OfferFrom(**baton, holder_cpu);
    std::set<int> expected = all;
    if (all.size() > 1) expected.erase(holder_cpu);
    for (int i = 0; i < 2000 && testing::CpusOf(tid) != expected; ++i) {
      std::this_thread::sleep_for(1ms);
    }
    CHECK(testing::CpusOf(tid) == expected);
  }
  // A published CPU wins over the offer's.
  const int placed = *all.rbegin();
  (*area)->PublishWaitCpu(placed);
  REQUIRE((*baton)->Defer());  // from this thread, wherever it runs
  REQUIRE((*baton)->Reclaim());
  std::set<int> expected = all;
  if (all.size() > 1) expected.erase(placed);
  for (int i = 0; i < 2000 && testing::CpusOf(tid) != expected; ++i) {
    std::this_thread::sleep_for(1ms);
  }
  CHECK(testing::CpusOf(tid) == expected);
  (*baton)->ToLoop();
  CHECK(follower.get() == Turn::kLeave);
  CHECK(after == all);
  IntakeBaton::SetAvoidHolderCpu(false);
}

}  // namespace
}  // namespace agentix::worker
