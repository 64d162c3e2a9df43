#include "sandbox/placement_probe.h"

#include <sched.h>
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"

namespace agentix::sandbox {
namespace {

// idle_cpus -1: /proc/stat could not say, the round trips alone decide.
ProbeFigures Figures(double same, double cross, double affinity, int cpus = 2,
                     int idle_cpus = -1) {
  ProbeFigures f;
  f.same_cpu_us = same;
  f.cross_cpu_us = cross;
  f.affinity_us = affinity;
  f.cpus = cpus;
  f.idle_cpus = idle_cpus;
  return f;
}

TEST_CASE("Idle vCPUs that halt (the docs' older VM) choose the whole placement") {
  // stop 24: 54-72 us unpinned, 6-7 us on one CPU; sched_setaffinity ~0.65 us.
  CHECK(ChoosePlacement(Figures(6.5, 54, 0.65)).placement == Placement::kAll);
  CHECK(ChoosePlacement(Figures(7, 72, 0.65)).placement == Placement::kAll);
  // Even at this machine's system-call prices.
  CHECK(ChoosePlacement(Figures(8.5, 60, 3)).placement == Placement::kAll);
}

TEST_CASE("Cheap cross-CPU wake-ups with dear pins keep the daemon's placement and unpin the hosts") {
  // This machine (stop 30/31): 8.5-19 us pinned, about the same unpinned, ~3 us a pin.
  CHECK(ChoosePlacement(Figures(15.6, 15.4, 3.5)).placement == Placement::kDaemon);
  CHECK(ChoosePlacement(Figures(8.5, 15.8, 2.8)).placement == Placement::kDaemon);
  // A saving a host's pins eat (4 x 3 us against a round trip's 10 us) is not taken.
  CHECK(ChoosePlacement(Figures(8, 18, 3)).placement == Placement::kDaemon);
  CHECK(ChoosePlacement(Figures(8, 21, 3)).placement == Placement::kAll);
}

TEST_CASE("A quiet VM whose wake-ups cost a round trip 20 us pins the hosts' waits") {
  // stop 43, both CPUs idle: same-CPU 8.7 us, pinned apart 28.5 us, a pin
  // 2.03 us; pinned, the direct noop's p50 measured 0.67x and the relayed
  // 0.82x pin_daemon. A call saves the round trip's 19.8 us for one host's
  // pins (~8.1 us).
  const PlacementChoice choice = ChoosePlacement(Figures(8.7, 28.5, 2.03, 2, /*idle_cpus=*/2));
  CHECK(choice.placement == Placement::kAll);
  CHECK(choice.why.find("a round trip saves 19.8 us") != std::string::npos);
}

TEST_CASE("With no other CPU idle the hosts do not pin, however dear a cross-CPU round trip") {
  // stop 43, one busy core on two CPUs: pinned apart 19-22 us against 8.7 on
  // one CPU, yet the unpinned chain stays on the free CPU by itself and the
  // pins measured 1.41x (direct) and 1.16x (relayed) the noop's p50.
  const PlacementChoice busy_core = ChoosePlacement(Figures(8.7, 21.7, 2.03, 2, /*idle_cpus=*/1));
  CHECK(busy_core.placement == Placement::kDaemon);
  CHECK(busy_core.why.find("1 of 2 CPUs idle") != std::string::npos);
  CHECK(ChoosePlacement(Figures(11.1, 21.5, 2.56, 2, /*idle_cpus=*/0)).placement ==
        Placement::kDaemon);
  // Many CPUs, two of them idle: a spread chain is likely, the round trips decide.
  CHECK(ChoosePlacement(Figures(8.7, 28.5, 2.03, 64, /*idle_cpus=*/2)).placement ==
        Placement::kAll);
}

TEST_CASE("A pair pinned apart faster than one on one CPU saves nothing") {
  const PlacementChoice choice = ChoosePlacement(Figures(20, 10, 0.5));
  CHECK(choice.placement == Placement::kDaemon);
  CHECK(choice.why.find("saves 0.0 us") != std::string::npos);
}

TEST_CASE("A saving within the probe's noise is not taken, however cheap a pin") {
  CHECK(ChoosePlacement(Figures(8, 9.5, 0.01)).placement == Placement::kDaemon);
  CHECK(ChoosePlacement(Figures(8, 10.5, 0.01)).placement == Placement::kAll);
}

TEST_CASE("One CPU pins nothing; figures that cannot be right keep the placement before the probe") {
  CHECK(ChoosePlacement(Figures(8, 60, 1, /*cpus=*/1)).placement == Placement::kOff);
  CHECK(ChoosePlacement(Figures(0, 0, 0, /*cpus=*/1)).placement == Placement::kOff);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  CHECK(ChoosePlacement(Figures(nan, 60, 1)).placement == Placement::kAll);
  CHECK(ChoosePlacement(Figures(8, inf, 1)).placement == Placement::kAll);
  CHECK(ChoosePlacement(Figures(8, 60, 0)).placement == Placement::kAll);
  CHECK(ChoosePlacement(Figures(-1, 60, 1)).placement == Placement::kAll);
}

TEST_CASE("Idle CPUs that poll before halting keep the daemon's placement and unpin the hosts") {
  // stop 45, this VM with guest_halt_poll_ns 200000: the round trips still
  // read 8.7 / 28.5 us, yet unpinned the direct noop took 27 us against
  // 53-57 pinned (relayed 49 against 89).
  ProbeFigures polling = Figures(8.7, 28.5, 2.03, 2, /*idle_cpus=*/2);
  polling.idle_poll_ns = 200'000;
  const PlacementChoice choice = ChoosePlacement(polling);
  CHECK(choice.placement == Placement::kDaemon);
  CHECK(choice.why.find("idle CPUs poll up to 200 us") != std::string::npos);
  // Halting at once, or polling too briefly to catch a hand-off: the round trips decide.
  polling.idle_poll_ns = 0;
  CHECK(ChoosePlacement(polling).placement == Placement::kAll);
  polling.idle_poll_ns = kPollCoversWakeNs - 1;
  CHECK(ChoosePlacement(polling).placement == Placement::kAll);
  // One CPU is still one CPU.
  ProbeFigures one = Figures(8, 60, 1, /*cpus=*/1);
  one.idle_poll_ns = 200'000;
  CHECK(ChoosePlacement(one).placement == Placement::kOff);
}

std::string FakeSysfs(const char* governor, const char* poll_ns) {
  char dir[] = "/tmp/agentix-idle-policy-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string root = dir;
  if (governor != nullptr) {
    std::filesystem::create_directories(root + "/devices/system/cpu/cpuidle");
    std::ofstream(root + "/devices/system/cpu/cpuidle/current_governor_ro") << governor << "\n";
  }
  if (poll_ns != nullptr) {
    std::filesystem::create_directories(root + "/module/haltpoll/parameters");
    std::ofstream(root + "/module/haltpoll/parameters/guest_halt_poll_ns") << poll_ns << "\n";
  }
  return root;
}

TEST_CASE("The idle policy is read from the haltpoll governor's parameter, and only from it") {
  const std::string polling = FakeSysfs("haltpoll", "200000");
  const std::string halting = FakeSysfs("haltpoll", "0");
  const std::string menu = FakeSysfs("menu", "200000");
  const std::string bare = FakeSysfs("haltpoll", nullptr);
  const std::string garbage = FakeSysfs("haltpoll", "lots");
  const std::string none = FakeSysfs(nullptr, nullptr);
  CHECK(ReadIdlePollNs(polling) == 200'000);
  CHECK(ReadIdlePollNs(halting) == 0);
  CHECK(ReadIdlePollNs(menu) == -1);  // another governor does not use the parameter
  CHECK(ReadIdlePollNs(bare) == -1);
  CHECK(ReadIdlePollNs(garbage) == -1);
  CHECK(ReadIdlePollNs(none) == -1);
  for (const std::string& root : {polling, halting, menu, bare, garbage, none}) {
    std::filesystem::remove_all(root);
  }
}

TEST_CASE("The probe's log line says how idle CPUs wait, when it is known") {
  ProbeFigures f = Figures(8.7, 28.5, 2.03, 2, 2);
  CHECK(DescribeFigures(f).find("idle CPUs") == std::string::npos);
  f.idle_poll_ns = 0;
  CHECK(DescribeFigures(f).find("; idle CPUs halt at once (guest_halt_poll_ns 0)") != std::string::npos);
  f.idle_poll_ns = 200'000;
  CHECK(DescribeFigures(f).find("2 CPUs (2 idle), 0.0 ms; idle CPUs poll up to 200 us") !=
        std::string::npos);
}

TEST_CASE("Placements have wake_ab's names") {
  CHECK(std::string(PlacementName(Placement::kAll)) == "pin");
  CHECK(std::string(PlacementName(Placement::kDaemon)) == "pin_daemon");
  CHECK(std::string(PlacementName(Placement::kOff)) == "off");
}

TEST_CASE("The probe measures every figure on a machine with two CPUs, and leaves the mask alone") {
  cpu_set_t before;
  CPU_ZERO(&before);
  REQUIRE(::sched_getaffinity(0, sizeof(before), &before) == 0);
  ProbeOptions options;
  options.round_trips = 20;
  options.affinity_pairs = 5;
  options.idle_window = absl::Milliseconds(20);
  absl::StatusOr<ProbeFigures> figures = MeasurePlacement(options);
  REQUIRE(figures.ok());
  CHECK(figures->cpus == CPU_COUNT(&before));
  if (figures->cpus >= 2) {
    CHECK(figures->same_cpu_us > 0);
    CHECK(figures->cross_cpu_us > 0);
    CHECK(figures->idle_cpus >= 0);
    CHECK(figures->idle_cpus <= figures->cpus);
    CHECK(figures->affinity_us > 0);
  }
  CHECK(DescribeFigures(*figures).find("CPUs (") != std::string::npos);
  cpu_set_t after;
  CPU_ZERO(&after);
  REQUIRE(::sched_getaffinity(0, sizeof(after), &after) == 0);
  CHECK(CPU_EQUAL(&before, &after));
}

TEST_CASE("A probe whose cancel is notified ends with CancelledError and leaves the mask alone") {
  cpu_set_t before;
  CPU_ZERO(&before);
  REQUIRE(::sched_getaffinity(0, sizeof(before), &before) == 0);
  if (CPU_COUNT(&before) < 2) return;  // one CPU: nothing is measured, nothing to cut
  // Cancelled during each long step in turn: the idle window, the round
  // trips, the pins (each made to last far longer than the test's timeout).
  for (const std::string step : {"idle window", "round trips", "pins"}) {
    CAPTURE(step);
    absl::Notification cancel;
    ProbeOptions options;
    options.cancel = &cancel;
    options.idle_window = step == "idle window" ? absl::Hours(1) : absl::Milliseconds(1);
    options.round_trips = step == "round trips" ? 1'000'000'000 : 20;
    options.affinity_pairs = step == "pins" ? 1'000'000'000 : 5;
    std::thread canceller([&cancel] {
      absl::SleepFor(absl::Milliseconds(30));
      cancel.Notify();
    });
    absl::StatusOr<ProbeFigures> figures = MeasurePlacement(options);
    canceller.join();
    CHECK(absl::IsCancelled(figures.status()));
    cpu_set_t after;
    CPU_ZERO(&after);
    REQUIRE(::sched_getaffinity(0, sizeof(after), &after) == 0);
    CHECK(CPU_EQUAL(&before, &after));
  }
}

// The re-probe's schedule (defaults: at most one a minute, after a 0.1 s pause).
const absl::Time kStart = absl::FromUnixSeconds(1000);

CallPathActivity Idle(absl::Time last_call_end) { return {false, last_call_end}; }
CallPathActivity Busy(absl::Time last_call_end) { return {true, last_call_end}; }

// The schedules below test the period after a re-probe; the first one after
// the start-up probe has its own (`first_every`, tested last).
ReprobeSchedule AfterAReprobe(ReprobeSchedule::Options options = {}) {
  ReprobeSchedule schedule(options, kStart - absl::Hours(1));
  schedule.Probed(kStart);
  return schedule;
}

TEST_CASE("A re-probe waits for its period after the last probe") {
  const ReprobeSchedule schedule = AfterAReprobe();
  const absl::Time call_end = kStart + absl::Seconds(5);
  const ReprobeSchedule::Step early = schedule.Next(Idle(call_end), kStart + absl::Seconds(30));
  CHECK_FALSE(early.probe);
  CHECK(early.look_at == kStart + absl::Seconds(60));
  CHECK(schedule.Next(Idle(call_end), kStart + absl::Seconds(60)).probe);
}

TEST_CASE("A daemon unused since the last probe is not probed again, and looks once a period") {
  const ReprobeSchedule schedule = AfterAReprobe();
  const absl::Time now = kStart + absl::Seconds(90);
  const ReprobeSchedule::Step step = schedule.Next(Idle(kStart - absl::Seconds(1)), now);
  CHECK_FALSE(step.probe);
  CHECK(step.look_at == now + absl::Seconds(60));
}

TEST_CASE("A re-probe never runs while a call runs or a worker boots, and looks less often as it lasts") {
  const ReprobeSchedule schedule = AfterAReprobe();
  const absl::Time due = kStart + absl::Seconds(60);
  const ReprobeSchedule::Step soon = schedule.Next(Busy(kStart - absl::Seconds(1)), due);
  CHECK_FALSE(soon.probe);
  CHECK(soon.look_at == due + absl::Milliseconds(100));
  const ReprobeSchedule::Step later =
      schedule.Next(Busy(kStart + absl::Seconds(1)), due + absl::Seconds(16));
  CHECK_FALSE(later.probe);
  CHECK(later.look_at == due + absl::Seconds(18));
  // A call that never ends is looked at every quarter period at most.
  const ReprobeSchedule::Step capped =
      schedule.Next(Busy(kStart + absl::Seconds(1)), due + absl::Hours(1));
  CHECK(capped.look_at == due + absl::Hours(1) + absl::Seconds(15));
}

TEST_CASE("A re-probe runs only once the call path has paused for `quiet`") {
  const ReprobeSchedule schedule = AfterAReprobe();
  const absl::Time now = kStart + absl::Seconds(70);
  const absl::Time call_end = now - absl::Milliseconds(30);
  const ReprobeSchedule::Step step = schedule.Next(Idle(call_end), now);
  CHECK_FALSE(step.probe);
  CHECK(step.look_at == call_end + absl::Milliseconds(100));
  CHECK(schedule.Next(Idle(call_end), step.look_at).probe);
}

TEST_CASE("After a re-probe the next one waits a whole period again") {
  ReprobeSchedule schedule({}, kStart);
  const absl::Time probed = kStart + absl::Seconds(75);
  schedule.Probed(probed);
  const absl::Time call_end = probed + absl::Seconds(1);
  CHECK(schedule.Next(Idle(call_end), probed + absl::Seconds(59)).look_at ==
        probed + absl::Seconds(60));
  CHECK(schedule.Next(Idle(call_end), probed + absl::Seconds(60)).probe);
}

TEST_CASE("A zero period never probes again") {
  ReprobeSchedule::Options never;
  never.every = absl::ZeroDuration();
  const ReprobeSchedule schedule(never, kStart);
  const ReprobeSchedule::Step step =
      schedule.Next(Idle(kStart + absl::Seconds(1)), kStart + absl::Hours(5));
  CHECK_FALSE(step.probe);
  CHECK(step.look_at == absl::InfiniteFuture());
}

TEST_CASE("The first re-probe after the start-up probe may come after `first_every`, in a pause") {
  const ReprobeSchedule schedule({}, kStart);  // the start-up probe ended at kStart
  const absl::Time call_end = kStart + absl::Milliseconds(900);
  const ReprobeSchedule::Step early = schedule.Next(Idle(call_end), kStart + absl::Milliseconds(500));
  CHECK_FALSE(early.probe);
  CHECK(early.look_at == kStart + absl::Seconds(1));
  CHECK(schedule.Next(Idle(call_end), kStart + absl::Seconds(1)).probe);
  // Still only in a pause of `quiet`.
  CHECK_FALSE(schedule.Next(Busy(call_end), kStart + absl::Seconds(1)).probe);
  // Unused so far: it looks each `first_every` during the first period, then once a period.
  CHECK(schedule.Next(Idle(kStart), kStart + absl::Seconds(2)).look_at == kStart + absl::Seconds(3));
  CHECK(schedule.Next(Idle(kStart), kStart + absl::Seconds(61)).look_at ==
        kStart + absl::Seconds(121));
  // A period shorter than first_every wins.
  ReprobeSchedule::Options short_period;
  short_period.every = absl::Milliseconds(500);
  const ReprobeSchedule fast(short_period, kStart);
  CHECK(fast.Next(Idle(call_end), kStart + absl::Milliseconds(100)).look_at ==
        kStart + absl::Milliseconds(500));
}

TEST_CASE("A call that ended while a probe measured is use since it: the next pause measures again") {
  // The start-up probe began between two of a host's first calls (kStart -
  // 100 ms) and ended at kStart; the last call ended meanwhile.
  const absl::Time began = kStart - absl::Milliseconds(100);
  const absl::Time call_end = kStart - absl::Milliseconds(40);
  const ReprobeSchedule schedule({}, kStart, began);
  CHECK(schedule.Next(Idle(call_end), kStart + absl::Seconds(1)).probe);
  // A call that ended before the probe began is not.
  const ReprobeSchedule::Step unused =
      schedule.Next(Idle(began - absl::Milliseconds(1)), kStart + absl::Seconds(1));
  CHECK_FALSE(unused.probe);
  CHECK(unused.look_at == kStart + absl::Seconds(2));
  // The same for a re-probe: its period counts from its end.
  ReprobeSchedule after({}, kStart);
  const absl::Time reprobe_end = kStart + absl::Seconds(80);
  after.Probed(reprobe_end, reprobe_end - absl::Milliseconds(50));
  const absl::Time during = reprobe_end - absl::Milliseconds(10);
  CHECK_FALSE(after.Next(Idle(during), reprobe_end + absl::Seconds(59)).probe);
  CHECK(after.Next(Idle(during), reprobe_end + absl::Seconds(60)).probe);
}

ReprobeSchedule::Options WaitUpTo(absl::Duration wait) {
  ReprobeSchedule::Options options;
  options.startup_wait = wait;
  return options;
}

TEST_CASE("A start-up probe that may not wait measures at once, even while a worker boots") {
  const CallPathActivity booting{true, kStart};
  CHECK(StartupProbeStep(WaitUpTo(absl::ZeroDuration()), true, booting, kStart, kStart).probe);
  CHECK(StartupProbeStep({}, false, {}, kStart, kStart).probe);
}

TEST_CASE("A start-up probe waits while a worker boots or a call runs, looking again within ms") {
  const ReprobeSchedule::Options options = WaitUpTo(absl::Seconds(1));
  const absl::Time now = kStart + absl::Milliseconds(30);
  const ReprobeSchedule::Step step =
      StartupProbeStep(options, true, CallPathActivity{true, kStart}, kStart, now);
  CHECK_FALSE(step.probe);
  CHECK(step.look_at > now);
  CHECK(step.look_at <= now + absl::Milliseconds(10));
}

TEST_CASE("A start-up probe waits until the call path is watched") {
  const ReprobeSchedule::Options options = WaitUpTo(absl::Seconds(1));
  CHECK_FALSE(StartupProbeStep(options, false, {}, kStart, kStart).probe);
  CHECK(StartupProbeStep(options, true, {}, kStart, kStart + absl::Milliseconds(2)).probe);
}

TEST_CASE("A start-up probe measures as soon as the call path rests, however recent the last call") {
  const ReprobeSchedule::Options options = WaitUpTo(absl::Seconds(1));
  const absl::Time now = kStart + absl::Milliseconds(80);
  CHECK(StartupProbeStep(options, true, CallPathActivity{false, now}, kStart, now).probe);
}

TEST_CASE("A start-up probe waits no longer than its limit") {
  const ReprobeSchedule::Options options = WaitUpTo(absl::Milliseconds(12));
  const CallPathActivity busy{true, kStart};
  const ReprobeSchedule::Step last =
      StartupProbeStep(options, true, busy, kStart, kStart + absl::Milliseconds(10));
  CHECK_FALSE(last.probe);
  CHECK(last.look_at == kStart + absl::Milliseconds(12));
  CHECK(StartupProbeStep(options, true, busy, kStart, kStart + absl::Milliseconds(12)).probe);
  CHECK(StartupProbeStep(options, false, {}, kStart, kStart + absl::Seconds(3)).probe);
}

}  // namespace
}  // namespace agentix::sandbox
