// $AGENTIX_CALLS_CPU's values and ThreadPin (agentix/calls_cpu.h).
#include "agentix/calls_cpu.h"

#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

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

}  // namespace
}  // namespace agentix::client_internal
