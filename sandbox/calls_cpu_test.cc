#include "sandbox/calls_cpu.h"

#include <sched.h>

#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "base/cpu_affinity.h"

namespace agentix::sandbox {
namespace {

// base_cpu_affinity_test checks "auto" against sched_getaffinity itself.
int HighestAllowed() { return *base::ParseCpuSetting("auto"); }

std::vector<int> AllowedList() {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(::sched_getaffinity(0, sizeof(set), &set) == 0);
  std::vector<int> out;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) out.push_back(cpu);
  }
  return out;
}

// A clock, a run-queue wait and a running CPU the test sets.
struct Fakes {
  absl::Time now = absl::UnixEpoch() + absl::Hours(1);
  absl::Duration waited;
  int running = 0;
  CallsCpu::Hooks hooks() {
    return {[this] { return waited; }, [this] { return now; },
            [this] { return running; }};
  }
};

void SequentialCalls(CallsCpu& placement, Fakes& fakes, int calls,
                     absl::Duration wait_each) {
  for (int i = 0; i < calls; ++i) {
    fakes.waited += wait_each;
    placement.NoteRead(1);
  }
}

TEST_CASE("Calls that overlap unpin the call path; a run of one-at-a-time calls pins it again") {
  CallsCpu placement(HighestAllowed());
  CHECK(placement.PinnedCpu() == HighestAllowed());  // a named CPU pins at once
  placement.NoteRead(1);
  placement.NoteRead(0);  // a read with only logs or chunks says nothing
  CHECK(placement.pinned());
  placement.NoteRead(2);  // two results in one read: callers overlap
  CHECK_FALSE(placement.pinned());
  for (int i = 0; i < CallsCpu::kSequentialReads - 1; ++i) placement.NoteRead(1);
  CHECK_FALSE(placement.pinned());
  placement.NoteRead(3);  // the run is broken: it starts over
  for (int i = 0; i < CallsCpu::kSequentialReads - 1; ++i) placement.NoteRead(1);
  CHECK_FALSE(placement.pinned());
  placement.NoteRead(1);
  CHECK(placement.PinnedCpu() == HighestAllowed());
}

TEST_CASE("auto pins to the CPU the reader runs on when it pins, chosen again at each pin") {
  const std::vector<int> allowed = AllowedList();
  Fakes fakes;
  fakes.running = allowed.front();
  CallsCpu placement(CallsCpu::kRunningCpu, fakes.hooks());
  CHECK_FALSE(placement.pinned());  // nothing to go by before the first call
  placement.NoteRead(1);
  CHECK(placement.PinnedCpu() == allowed.front());
  fakes.running = allowed.back();
  placement.NoteRead(1);  // kept while pinned: the reader moving does not move it
  CHECK(placement.PinnedCpu() == allowed.front());
  placement.NoteRead(2);
  CHECK_FALSE(placement.pinned());
  for (int i = 0; i < CallsCpu::kSequentialReads; ++i) placement.NoteRead(1);
  CHECK(placement.PinnedCpu() == allowed.back());  // where the reader is now
}

TEST_CASE("auto never pins to a CPU the daemon may not use") {
  Fakes fakes;
  fakes.running = -1;  // sched_getcpu failed
  CallsCpu placement(CallsCpu::kRunningCpu, fakes.hooks());
  placement.NoteRead(1);
  CHECK_FALSE(placement.pinned());
}

TEST_CASE("A host's CPU places the call path under auto; the latest host wins; a named CPU wins over it") {
  const std::vector<int> allowed = AllowedList();
  Fakes fakes;
  fakes.running = allowed.back();
  CallsCpu placement(CallsCpu::kRunningCpu, fakes.hooks());
  placement.NoteRead(1);
  REQUIRE(placement.PinnedCpu() == allowed.back());
  CHECK(placement.PreferCpu(allowed.front()));
  CHECK(placement.PinnedCpu() == allowed.front());  // moved at once
  CHECK(placement.PreferCpu(allowed.back()));
  CHECK(placement.PinnedCpu() == allowed.back());
  // Not a CPU this daemon may use: ignored, the last good one stays.
  CHECK_FALSE(placement.PreferCpu(-1));
  CHECK_FALSE(placement.PreferCpu(CPU_SETSIZE));
  CHECK_FALSE(placement.PreferCpu(CPU_SETSIZE - 1));
  CHECK(placement.PinnedCpu() == allowed.back());
  // Overlapping calls still unpin; the host's CPU comes back with the pin.
  placement.NoteRead(2);
  CHECK_FALSE(placement.pinned());
  fakes.running = allowed.front();
  for (int i = 0; i < CallsCpu::kSequentialReads; ++i) placement.NoteRead(1);
  CHECK(placement.PinnedCpu() == allowed.back());

  CallsCpu named(allowed.front(), fakes.hooks());
  CHECK(named.PreferCpu(allowed.back()));
  CHECK(named.PinnedCpu() == allowed.front());
}

TEST_CASE("An inactive placement (the probe not done, or it chose off) pins nothing until made active") {
  const std::vector<int> allowed = AllowedList();
  Fakes fakes;
  fakes.running = allowed.back();
  CallsCpu placement(CallsCpu::kRunningCpu, fakes.hooks());
  CHECK(placement.host_waits() == CallsCpu::HostWaits::kNone);  // no probe: nothing to tell
  placement.SetActive(false);
  placement.NoteRead(1);
  CHECK(placement.PreferCpu(allowed.front()));  // remembered, not applied
  for (int i = 0; i < CallsCpu::kSequentialReads; ++i) placement.NoteRead(1);
  CHECK_FALSE(placement.pinned());
  placement.SetActive(true);
  CHECK(placement.PinnedCpu() == allowed.front());  // the host's CPU, at once
  placement.SetActive(false);
  CHECK_FALSE(placement.pinned());

  // Without a host's CPU the reader's is taken at its next call's end.
  CallsCpu own(CallsCpu::kRunningCpu, fakes.hooks());
  own.SetActive(false);
  own.SetActive(true);
  CHECK_FALSE(own.pinned());
  own.NoteRead(1);
  CHECK(own.PinnedCpu() == allowed.back());
  own.SetHostWaits(CallsCpu::HostWaits::kOff);
  CHECK(own.host_waits() == CallsCpu::HostWaits::kOff);
}

TEST_CASE("A following host's CPU left at a hand-over places the call path once hosts are told to pin") {
  const std::vector<int> allowed = AllowedList();
  Fakes fakes;
  fakes.running = allowed.back();
  // The probe has not answered: the direct host's CPU waits, no call end is needed.
  CallsCpu placement(CallsCpu::kRunningCpu, fakes.hooks());
  placement.SetActive(false);
  placement.SetHostWaits(CallsCpu::HostWaits::kUnknown);
  CHECK(placement.PreferCpuOncePinned(allowed.front()));
  CHECK_FALSE(placement.PreferCpuOncePinned(CPU_SETSIZE));  // not one it may use
  placement.SetActive(true);
  CHECK_FALSE(placement.pinned());  // not the host's CPU before it is told to pin
  placement.SetHostWaits(CallsCpu::HostWaits::kOff);
  CHECK_FALSE(placement.pinned());
  const uint64_t before = placement.state();
  placement.SetHostWaits(CallsCpu::HostWaits::kPin);  // a re-probe's change
  CHECK(placement.PinnedCpu() == allowed.front());
  CHECK(placement.state() != before);  // a new state: the worker is given it
  // Told to pin already: at once.
  CHECK(placement.PreferCpuOncePinned(allowed.back()));
  CHECK(placement.PinnedCpu() == allowed.back());
}

TEST_CASE("A busy CPU unpins the call path for the back-off period, then it pins again") {
  const int cpu = HighestAllowed();
  Fakes fakes;
  CallsCpu placement(cpu, fakes.hooks());
  const absl::Duration busy = base::PinBackoff::kWaitPerCall * 3;
  const absl::Duration quiet = base::PinBackoff::kWaitPerCall / 4;
  // A quiet CPU: the samples say so, it stays pinned.
  SequentialCalls(placement, fakes, 4 * CallsCpu::kSampleCalls, quiet);
  CHECK(placement.pinned());
  // Busy: the first sample is the baseline of its window; the next backs off.
  SequentialCalls(placement, fakes, 2 * CallsCpu::kSampleCalls, busy);
  CHECK_FALSE(placement.pinned());
  CHECK(placement.backoffs() == 1);
  fakes.now += base::PinBackoff::kFirst - absl::Milliseconds(1);
  SequentialCalls(placement, fakes, 100, busy);
  CHECK_FALSE(placement.pinned());
  fakes.now += absl::Milliseconds(1);
  placement.NoteRead(1);
  CHECK(placement.PinnedCpu() == cpu);
  // Waits while unpinned never count (those 100 busy calls would put this
  // window above the threshold): a new baseline, then the next window.
  SequentialCalls(placement, fakes, CallsCpu::kSampleCalls, quiet);
  CHECK(placement.pinned());
  SequentialCalls(placement, fakes, CallsCpu::kSampleCalls, busy);
  CHECK_FALSE(placement.pinned());
  CHECK(placement.backoffs() == 2);
}

TEST_CASE("Threads follow the placement when they next look; other threads are untouched") {
  const int cpu = HighestAllowed();
  const std::string all = base::AllowedCpus(0);
  CallsCpu placement(cpu);
  std::string first, unpinned, again;
  std::thread follower([&] {
    uint64_t seen = CallsCpu::kNever;
    placement.Follow(&seen);
    first = base::AllowedCpus(0);
    placement.NoteRead(2);
    placement.Follow(&seen);
    unpinned = base::AllowedCpus(0);
    for (int i = 0; i < CallsCpu::kSequentialReads; ++i) placement.NoteRead(1);
    placement.Follow(&seen);
    again = base::AllowedCpus(0);
  });
  follower.join();
  CHECK(first == std::to_string(cpu));
  CHECK(unpinned == all);
  CHECK(again == std::to_string(cpu));
  CHECK(base::AllowedCpus(0) == all);
}

}  // namespace
}  // namespace agentix::sandbox
