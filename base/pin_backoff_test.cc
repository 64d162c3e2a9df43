#include "base/pin_backoff.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include <catch2/catch.hpp>

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

}  // namespace
}  // namespace agentix::base
