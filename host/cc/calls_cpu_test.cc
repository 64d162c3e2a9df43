// $AGENTIX_CALLS_CPU's values and ThreadPin (agentix/calls_cpu.h).
#include "agentix/calls_cpu.h"

#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <set>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "testing/status_matchers.h"
#include "testing/cpu_masks.h"

namespace agentix::client_internal {
namespace {

TEST_CASE("AGENTIX_CALLS_CPU names a CPU to wait on, or nothing") {
  const std::set<int> allowed = testing::CpusOf();
  const int high = *allowed.rbegin();
  const int low = *allowed.begin();
  for (const char* off : {"", "off", " OFF "}) CHECK(*ParseCallsCpu(off) == -1);
  CHECK(*ParseCallsCpu("auto") == high);
  CHECK(*ParseCallsCpu("wait:auto") == high);
  CHECK(*ParseCallsCpu(absl::StrCat(low)) == low);
  CHECK(*ParseCallsCpu(absl::StrCat("Wait:", low)) == low);
  absl::StatusOr<int> current = ParseCallsCpu("wait");  // the CPU this thread is on
  REQUIRE_OK(current.status());
  CHECK(allowed.count(*current) == 1);
  for (const char* bad : {"fast", "-1", "1.0", "wait:", "wait:x", "waiting", "auto:1", "4096", "wait:4096"}) {
    absl::StatusOr<int> refused = ParseCallsCpu(bad);
    CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(refused.status().message(), "AGENTIX_CALLS_CPU="));
  }
}

TEST_CASE("an unset or empty AGENTIX_CALLS_CPU is the default setting") {
  const int fallback = *ParseCallsCpu(kDefaultCallsCpu);
  ::unsetenv("AGENTIX_CALLS_CPU");
  CHECK(*CallsCpuFromEnv() == fallback);
  ::setenv("AGENTIX_CALLS_CPU", "", 1);
  CHECK(*CallsCpuFromEnv() == fallback);
  ::setenv("AGENTIX_CALLS_CPU", "wait:auto", 1);
  CHECK(*CallsCpuFromEnv() == *testing::CpusOf().rbegin());
  ::setenv("AGENTIX_CALLS_CPU", "nope", 1);
  CHECK(CallsCpuFromEnv().status().code() == absl::StatusCode::kInvalidArgument);
  ::unsetenv("AGENTIX_CALLS_CPU");
}

TEST_CASE("PinBudget times one pin in 16 and rests while pinned waits queue for the CPU") {
  absl::Time now = absl::UnixEpoch();
  PinBudget budget([&] { return now; });
  const absl::Duration busy = base::PinBackoff::kWaitPerCall * 2;
  const absl::Duration quiet = base::PinBackoff::kWaitPerCall / 4;
  // One judgement's worth of pins, each timed one waiting `wait`: how many
  // were allowed.
  auto window = [&](absl::Duration wait) {
    int64_t allowed = 0, timed_count = 0;
    for (int64_t i = 0; i < PinBudget::kTimeEvery * PinBudget::kTimedPerJudgement; ++i) {
      bool timed = false;
      if (!budget.MayPin(&timed)) continue;
      ++allowed;
      if (timed) {
        ++timed_count;
        budget.NoteTimed(wait);
      }
    }
    CHECK(timed_count <= PinBudget::kTimedPerJudgement);
    return allowed;
  };
  const int64_t all = PinBudget::kTimeEvery * PinBudget::kTimedPerJudgement;
  CHECK(window(busy) == all);  // the first judgement (warming up) is not one
  CHECK_FALSE(budget.resting());
  CHECK(window(quiet) == all);
  CHECK_FALSE(budget.resting());
  CHECK(window(busy) == all);  // judged at the window's last pin
  CHECK(budget.resting());
  bool timed = true;
  CHECK_FALSE(budget.MayPin(&timed));
  CHECK_FALSE(timed);
  now += base::PinBackoff::kFirst;
  CHECK(window(quiet) == all);
  CHECK_FALSE(budget.resting());
}

TEST_CASE("ThreadPin times the pinned thread's run-queue wait, unpinned from another thread") {
  const std::set<int> before = testing::CpusOf();
  REQUIRE(before.size() >= 2);
  // Enough pins for a judgement: the budget must see timed waits (not rest:
  // this thread's pinned waits here queue behind nothing).
  for (int64_t i = 0; i < PinBudget::kTimeEvery * PinBudget::kTimedPerJudgement; ++i) {
    ThreadPin pin;
    REQUIRE(pin.Pin(*before.begin()));
    std::thread([&] { pin.Unpin(); }).join();
    REQUIRE(testing::CpusOf() == before);
  }
}

TEST_CASE("ThreadPin pins the calling thread and gives it its own mask back from any thread") {
  const std::set<int> allowed = testing::CpusOf();
  REQUIRE(allowed.size() >= 2);  // pinning is only visible with two CPUs allowed
  const int cpu = *allowed.rbegin();
  ThreadPin pin;
  REQUIRE(pin.Pin(cpu));
  CHECK(pin.pinned());
  CHECK(testing::CpusOf() == std::set<int>{cpu});
  CHECK_FALSE(pin.Pin(cpu));  // pinned already: nothing changes
  std::thread([&pin] { pin.Unpin(); }).join();  // (Wait may run on another thread)
  CHECK_FALSE(pin.pinned());
  CHECK(testing::CpusOf() == allowed);
  pin.Unpin();  // not pinned: nothing
  CHECK(testing::CpusOf() == allowed);

  // A thread already on that CPU alone is left alone (and nothing is restored).
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  REQUIRE(::sched_setaffinity(0, sizeof(one), &one) == 0);
  ThreadPin again;
  CHECK_FALSE(again.Pin(cpu));
  again.Unpin();
  CHECK(testing::CpusOf() == std::set<int>{cpu});
  cpu_set_t all;
  CPU_ZERO(&all);
  for (int i : allowed) CPU_SET(i, &all);
  REQUIRE(::sched_setaffinity(0, sizeof(all), &all) == 0);
}

// Drives `trial` with `n` lone calls at `now` (a call's time moves the
// clock): pinned ones take `pinned_us`, unpinned ones `unpinned_us`, and
// with `after_switch_us` >= 0 the first kSkip after each switch of the way
// take that instead. Returns how many waited pinned.
int LoneCalls(PinTrial& trial, absl::Time& now, int n, double pinned_us, double unpinned_us,
              double after_switch_us = -1) {
  int pinned = 0;
  int since_switch = 0;
  bool last = true;
  for (int i = 0; i < n; ++i) {
    trial.Begin(now);
    const bool pins = trial.PinsNow();
    since_switch = pins == last ? since_switch + 1 : 0;
    last = pins;
    pinned += pins;
    double took = pins ? pinned_us : unpinned_us;
    if (after_switch_us >= 0 && since_switch < PinTrial::kSkip) took = after_switch_us;
    now += absl::Microseconds(took);
    if (trial.running()) trial.End(absl::Microseconds(took), now);
  }
  return pinned;
}

TEST_CASE("PinTrial times the thread's lone calls both ways and keeps the faster") {
  absl::Time now = absl::UnixEpoch();
  PinTrial trial;
  const int trial_calls = PinTrial::kBlock * PinTrial::kBlocks;
  // Warming up: pinned, no trial.
  CHECK(LoneCalls(trial, now, PinTrial::kFirstAfter, 64, 49) == PinTrial::kFirstAfter);
  CHECK_FALSE(trial.running());
  CHECK(trial.last_pinned() == absl::ZeroDuration());
  // The trial: blocks pinned and unpinned in turn, half of its calls each.
  CHECK(LoneCalls(trial, now, trial_calls, 64, 49) == trial_calls / 2);
  CHECK_FALSE(trial.running());
  CHECK_FALSE(trial.pin());
  CHECK(trial.last_pinned() == absl::Microseconds(64));
  CHECK(trial.last_unpinned() == absl::Microseconds(49));
  // Unpinned until the next trial is due: 1 s, then 2, 4 ... up to kEvery.
  CHECK(LoneCalls(trial, now, 500, 64, 49) == 0);
  absl::Duration every = PinTrial::kFirstEvery;
  for (int i = 0; i < 8; ++i) {
    now += every - absl::Milliseconds(40);  // (the 500 calls took ~25 ms)
    CHECK(LoneCalls(trial, now, 1, 64, 49) == 0);
    CHECK_FALSE(trial.running());
    now += absl::Milliseconds(40);
    CHECK(LoneCalls(trial, now, trial_calls, 64, 49) == trial_calls / 2);
    CHECK_FALSE(trial.running());
    CHECK_FALSE(trial.pin());
    every = std::min(every * 2, PinTrial::kEvery);
  }
  CHECK(every == PinTrial::kEvery);
  now += every;
  // The machine changed: pinned is the faster now, and is kept.
  CHECK(LoneCalls(trial, now, trial_calls, 40, 70) == trial_calls / 2);
  CHECK(trial.pin());
  CHECK(LoneCalls(trial, now, 100, 40, 70) == 100);
}

TEST_CASE("PinTrial keeps pinned unless unpinned is faster by the margin") {
  absl::Time now = absl::UnixEpoch();
  PinTrial trial;
  LoneCalls(trial, now, PinTrial::kFirstAfter + PinTrial::kBlock * PinTrial::kBlocks, 100,
            100 * PinTrial::kMargin + 1);
  CHECK(trial.last_pinned() == absl::Microseconds(100));
  CHECK(trial.pin());
}

TEST_CASE("PinTrial does not time the calls right after a switch") {
  absl::Time now = absl::UnixEpoch();
  PinTrial trial;
  LoneCalls(trial, now, PinTrial::kFirstAfter + PinTrial::kBlock * PinTrial::kBlocks, 64, 49,
            /*after_switch_us=*/1000);
  CHECK(trial.last_pinned() == absl::Microseconds(64));
  CHECK(trial.last_unpinned() == absl::Microseconds(49));
  CHECK_FALSE(trial.pin());
}

TEST_CASE("the default's trial and budget are the calling thread's own") {
  PinTrial* mine = &ThreadPinTrial();
  CHECK(&ThreadPinTrial() == mine);
  PinTrial* other = nullptr;
  PinBudget* other_budget = nullptr;
  std::thread([&] {
    other = &ThreadPinTrial();
    other_budget = &ThreadPinBudget();
  }).join();
  CHECK(other != mine);
  CHECK(other_budget != &ThreadPinBudget());
  CHECK_FALSE(ThreadPinBudget().RestsNow());
}

}  // namespace
}  // namespace agentix::client_internal
