#include "base/pin_backoff.h"

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <thread>

#include <catch2/catch.hpp>

#include "absl/time/clock.h"

namespace agentix::base {
namespace {

TEST_CASE("PinBackoff: unpinned while the wait per call is above the threshold, for doubling periods") {
  PinBackoff backoff;
  absl::Time now = absl::UnixEpoch();
  const int64_t calls = 100;
  const absl::Duration below = PinBackoff::kWaitPerCall * calls;
  const absl::Duration above = below + absl::Microseconds(calls);
  CHECK(backoff.Over(now));
  CHECK_FALSE(backoff.NotePinned(calls, below, now));
  CHECK_FALSE(backoff.NotePinned(0, above, now));  // no calls: no evidence
  CHECK(backoff.NotePinned(calls, above, now));
  CHECK(backoff.until() == now + PinBackoff::kFirst);
  CHECK_FALSE(backoff.Over(now + PinBackoff::kFirst - absl::Milliseconds(1)));
  CHECK(backoff.Over(now + PinBackoff::kFirst));
  // Still busy when pinned again: twice as long each time, up to kLongest.
  absl::Duration expected = PinBackoff::kFirst;
  for (int i = 0; i < 10; ++i) {
    now = backoff.until();
    REQUIRE(backoff.NotePinned(calls, above, now));
    expected = std::min(expected * 2, PinBackoff::kLongest);
    CHECK(backoff.until() - now == expected);
  }
  CHECK(expected == PinBackoff::kLongest);
  // One quiet sample and the next back-off is short again.
  now = backoff.until();
  CHECK_FALSE(backoff.NotePinned(calls, below, now));
  CHECK(backoff.NotePinned(calls, above, now));
  CHECK(backoff.until() - now == PinBackoff::kFirst);
}

TEST_CASE("ThreadRunQueueWait reads this thread's schedstat and never goes back") {
  const absl::Duration first = ThreadRunQueueWait();
  CHECK(first >= absl::ZeroDuration());
  for (int i = 0; i < 50; ++i) std::this_thread::yield();
  CHECK(ThreadRunQueueWait() >= first);
  // Another thread's, by its id: the same figure as its own reading.
  std::atomic<pid_t> tid{0};
  std::atomic<bool> done{false};
  absl::Duration own;
  std::thread other([&] {
    for (int i = 0; i < 50; ++i) std::this_thread::yield();
    own = ThreadRunQueueWait();
    tid = ::gettid();
    while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  while (tid.load() == 0) std::this_thread::yield();
  CHECK(ThreadRunQueueWait(tid.load()) >= own);
  done = true;
  other.join();
  CHECK(ThreadRunQueueWait(tid.load()) == absl::ZeroDuration());  // ended
}

// The calling thread's run-queue wait, from its schedstat opened here.
absl::Duration WaitReadAfresh() {
  std::FILE* file = std::fopen("/proc/thread-self/schedstat", "r");
  if (file == nullptr) return absl::ZeroDuration();
  unsigned long long ran = 0, waited = 0;
  const int fields = std::fscanf(file, "%llu %llu", &ran, &waited);
  std::fclose(file);
  return fields == 2 ? absl::Nanoseconds(static_cast<int64_t>(waited)) : absl::ZeroDuration();
}

// Two threads spinning on one CPU for `each`: each waits in the run queue
// while the other runs. The first calls `before` and `after` around its spin.
void SpinTogetherOnOneCpu(absl::Duration each, const std::function<void()>& before,
                          const std::function<void()>& after) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(::sched_getcpu(), &one);
  std::atomic<int> started{0};
  auto spin = [&](bool first) {
    if (first) before();
    (void)::sched_setaffinity(0, sizeof(one), &one);
    ++started;
    while (started.load() < 2) {
    }
    const absl::Time end = absl::Now() + each;
    while (absl::Now() < end) {
    }
    if (first) after();
  };
  std::thread a(spin, true), b(spin, false);
  a.join();
  b.join();
}

TEST_CASE("ThreadRunQueueWait: a thread's later readings see the wait it gathered since") {
  absl::Duration before, after, by_id;
  std::atomic<pid_t> spinner{0};
  SpinTogetherOnOneCpu(
      absl::Milliseconds(60),
      [&] {
        before = ThreadRunQueueWait();
        spinner = ::gettid();
      },
      [&] {
        after = ThreadRunQueueWait(::gettid());  // its own id: the kept file too
        // Read by id from another thread: the file opened afresh.
        std::thread([&] { by_id = ThreadRunQueueWait(spinner.load()); }).join();
      });
  CHECK(after > before);
  CHECK(by_id >= after);
}

TEST_CASE("ThreadRunQueueWait: a forked child reads its own thread's, not its parent's") {
  // The forking thread has gathered a wait and read it (the file it keeps).
  absl::Duration parent;
  pid_t child = -1;
  int status = -1;
  SpinTogetherOnOneCpu(
      absl::Milliseconds(60), [] { (void)ThreadRunQueueWait(); },
      [&] {
        parent = ThreadRunQueueWait();
        child = ::fork();
        if (child == 0) {
          // A new task's wait starts from zero: the copy's reading lies
          // between two readings of its own file by id.
          const absl::Duration low = WaitReadAfresh();
          const absl::Duration own = ThreadRunQueueWait();
          const absl::Duration high = WaitReadAfresh();
          ::_exit(low <= own && own <= high ? 0 : 1);
        }
        if (child > 0) (void)::waitpid(child, &status, 0);
      });
  REQUIRE(parent > absl::ZeroDuration());
  REQUIRE(child > 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace agentix::base
