#include "sandbox/placement_prober.h"

#include <catch2/catch.hpp>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace agentix::sandbox {
namespace {

ProbeFigures Figures(double same, double cross, double affinity) {
  ProbeFigures f;
  f.same_cpu_us = same;
  f.cross_cpu_us = cross;
  f.affinity_us = affinity;
  f.cpus = 2;
  return f;
}

// Idle vCPUs that halt (whole placement) and cheap wake-ups (hosts unpinned).
const ProbeFigures kQuiet = Figures(6.5, 54, 0.65);
const ProbeFigures kBusy = Figures(7, 7, 0.65);

// Hands out the figures queued, then the last one again.
class Measures {
 public:
  explicit Measures(std::deque<absl::StatusOr<ProbeFigures>> queued)
      : queued_(std::move(queued)) {}
  PlacementProber::Measure measure() {
    return [this](const absl::Notification&) -> absl::StatusOr<ProbeFigures> {
      absl::MutexLock lock(&mu_);
      ++taken_;
      absl::StatusOr<ProbeFigures> next = queued_.front();
      if (queued_.size() > 1) queued_.pop_front();
      return next;
    };
  }
  int taken() {
    absl::MutexLock lock(&mu_);
    return taken_;
  }
  bool TakenAtLeast(int n, absl::Duration within) {
    auto enough = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return taken_ >= n; };
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&enough), within);
  }

 private:
  absl::Mutex mu_;
  std::deque<absl::StatusOr<ProbeFigures>> queued_ ABSL_GUARDED_BY(mu_);
  int taken_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST_CASE("Until the first probe, nothing is pinned and hosts that ask are not told yet") {
  auto calls_cpu = std::make_shared<CallsCpu>(CallsCpu::kRunningCpu);
  Measures measures({kBusy});
  PlacementProber prober(calls_cpu, {}, measures.measure());
  CHECK(calls_cpu->host_waits() == CallsCpu::HostWaits::kUnknown);
  CHECK(prober.ProbeOnce(/*first=*/true).placement == Placement::kDaemon);
  CHECK(calls_cpu->host_waits() == CallsCpu::HostWaits::kOff);
}

TEST_CASE("A re-probe that chooses otherwise changes what hosts are told, either way") {
  auto calls_cpu = std::make_shared<CallsCpu>(CallsCpu::kRunningCpu);
  Measures measures({kBusy, kBusy, kQuiet, kBusy});
  PlacementProber prober(calls_cpu, {}, measures.measure());
  prober.ProbeOnce(/*first=*/true);
  CHECK(calls_cpu->host_waits() == CallsCpu::HostWaits::kOff);
  prober.ProbeOnce(/*first=*/false);
  CHECK(calls_cpu->host_waits() == CallsCpu::HostWaits::kOff);
  CHECK(prober.ProbeOnce(/*first=*/false).placement == Placement::kAll);
  CHECK(calls_cpu->host_waits() == CallsCpu::HostWaits::kPin);
  prober.ProbeOnce(/*first=*/false);
  CHECK(calls_cpu->host_waits() == CallsCpu::HostWaits::kOff);
}

TEST_CASE("Each changed answer, and only a changed one, is given to OnHostWaits") {
  auto calls_cpu = std::make_shared<CallsCpu>(CallsCpu::kRunningCpu);
  Measures measures({kBusy, kBusy, kQuiet, kQuiet, kBusy});
  PlacementProber prober(calls_cpu, {}, measures.measure());
  std::vector<CallsCpu::HostWaits> told;
  prober.OnHostWaits([&told](CallsCpu::HostWaits waits) { told.push_back(waits); });
  prober.ProbeOnce(/*first=*/true);
  for (int i = 0; i < 4; ++i) prober.ProbeOnce(/*first=*/false);
  CHECK(told == std::vector<CallsCpu::HostWaits>{CallsCpu::HostWaits::kOff,
                                                 CallsCpu::HostWaits::kPin,
                                                 CallsCpu::HostWaits::kOff});
}

TEST_CASE("A probe that fails chooses the placement before the probe") {
  auto calls_cpu = std::make_shared<CallsCpu>(CallsCpu::kRunningCpu);
  Measures measures({kBusy, absl::InternalError("socketpair: errno 24")});
  PlacementProber prober(calls_cpu, {}, measures.measure());
  prober.ProbeOnce(/*first=*/true);
  CHECK(prober.ProbeOnce(/*first=*/false).placement == Placement::kAll);
  CHECK(calls_cpu->host_waits() == CallsCpu::HostWaits::kPin);
}

TEST_CASE("The prober's thread probes at start-up, and again only in the call path's pauses") {
  auto calls_cpu = std::make_shared<CallsCpu>(CallsCpu::kRunningCpu);
  Measures measures({kBusy, kQuiet});
  ReprobeSchedule::Options options;
  options.every = absl::Milliseconds(20);
  options.quiet = absl::Milliseconds(1);
  PlacementProber prober(calls_cpu, options, measures.measure());
  prober.Start();
  REQUIRE(measures.TakenAtLeast(1, absl::Seconds(30)));
  // Not watching anything: no call can have run, no re-probe.
  absl::SleepFor(absl::Milliseconds(100));
  CHECK(measures.taken() == 1);
  // Watching a call path that has paused after a call since.
  const absl::Time ended = absl::Now();
  prober.Watch([ended] { return CallPathActivity{false, ended}; });
  REQUIRE(measures.TakenAtLeast(2, absl::Seconds(30)));
  prober.Stop();
  CHECK(calls_cpu->host_waits() == CallsCpu::HostWaits::kPin);
  // The paused call path is probed no more: no call ended since.
  const int taken = measures.taken();
  CHECK(taken == 2);
}

TEST_CASE("A call that ends while the start-up probe measures brings a re-probe at the next pause") {
  // The start-up probe may begin between two of a host's first calls; the
  // calls that end while it measures are load it saw, not the machine's.
  auto calls_cpu = std::make_shared<CallsCpu>(CallsCpu::kRunningCpu);
  absl::Mutex mu;
  absl::Time call_end = absl::InfinitePast();
  int taken = 0;
  ReprobeSchedule::Options options;
  options.every = absl::Seconds(3600);
  options.first_every = absl::Milliseconds(20);
  options.quiet = absl::Milliseconds(1);
  PlacementProber prober(calls_cpu, options,
                         [&](const absl::Notification&) -> absl::StatusOr<ProbeFigures> {
                           absl::MutexLock lock(&mu);
                           if (++taken == 1) {
                             absl::SleepFor(absl::Milliseconds(5));
                             call_end = absl::Now();  // a call ends mid-probe
                             absl::SleepFor(absl::Milliseconds(5));
                             return kBusy;
                           }
                           return kQuiet;
                         });
  prober.Watch([&] {
    absl::MutexLock lock(&mu);
    return CallPathActivity{false, call_end};
  });
  prober.Start();
  auto reprobed = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return taken >= 2; };
  {
    absl::MutexLock lock(&mu);
    CHECK(mu.AwaitWithTimeout(absl::Condition(&reprobed), absl::Seconds(30)));
  }
  prober.Stop();
  // The re-probe measured the machine at rest: the hosts pin their waits.
  CHECK(calls_cpu->host_waits() == CallsCpu::HostWaits::kPin);
}

TEST_CASE("A call path that never pauses is never re-probed") {
  auto calls_cpu = std::make_shared<CallsCpu>(CallsCpu::kRunningCpu);
  Measures measures({kBusy});
  ReprobeSchedule::Options options;
  options.every = absl::Milliseconds(5);
  options.quiet = absl::Milliseconds(1);
  PlacementProber prober(calls_cpu, options, measures.measure());
  prober.Watch([] { return CallPathActivity{true, absl::Now()}; });
  prober.Start();
  REQUIRE(measures.TakenAtLeast(1, absl::Seconds(30)));
  absl::SleepFor(absl::Milliseconds(100));
  prober.Stop();
  CHECK(measures.taken() == 1);
}

// A call path whose business the test sets (a worker booting, say).
class Path {
 public:
  void SetBusy(bool busy) {
    absl::MutexLock lock(&mu_);
    busy_ = busy;
  }
  std::function<CallPathActivity()> activity() {
    return [this] {
      absl::MutexLock lock(&mu_);
      return CallPathActivity{busy_, absl::InfinitePast()};
    };
  }

 private:
  absl::Mutex mu_;
  bool busy_ ABSL_GUARDED_BY(mu_) = true;
};

ReprobeSchedule::Options StartupWait(absl::Duration wait) {
  ReprobeSchedule::Options options;
  options.every = absl::ZeroDuration();
  options.startup_wait = wait;
  return options;
}

TEST_CASE("A start-up probe that may wait measures once the booting worker is ready, not before") {
  auto calls_cpu = std::make_shared<CallsCpu>(CallsCpu::kRunningCpu);
  Measures measures({kBusy});
  Path path;  // a prestarted worker boots
  PlacementProber prober(calls_cpu, StartupWait(absl::Seconds(60)), measures.measure());
  prober.Start();
  absl::SleepFor(absl::Milliseconds(30));  // not watched yet
  prober.Watch(path.activity());
  absl::SleepFor(absl::Milliseconds(70));
  CHECK(measures.taken() == 0);
  CHECK(calls_cpu->host_waits() == CallsCpu::HostWaits::kUnknown);
  path.SetBusy(false);  // booted, no call
  REQUIRE(measures.TakenAtLeast(1, absl::Seconds(30)));
  prober.Stop();
  CHECK(measures.taken() == 1);
  CHECK(calls_cpu->host_waits() == CallsCpu::HostWaits::kOff);
}

TEST_CASE("A start-up probe whose call path never rests measures when its wait runs out") {
  auto calls_cpu = std::make_shared<CallsCpu>(CallsCpu::kRunningCpu);
  Measures measures({kQuiet});
  Path path;
  PlacementProber prober(calls_cpu, StartupWait(absl::Milliseconds(20)), measures.measure());
  prober.Watch(path.activity());
  prober.Start();
  REQUIRE(measures.TakenAtLeast(1, absl::Seconds(30)));
  prober.Stop();
  CHECK(calls_cpu->host_waits() == CallsCpu::HostWaits::kPin);
}

TEST_CASE("A daemon stopped while its start-up probe waits stops without measuring") {
  auto calls_cpu = std::make_shared<CallsCpu>(CallsCpu::kRunningCpu);
  Measures measures({kBusy});
  Path path;
  PlacementProber prober(calls_cpu, StartupWait(absl::Hours(1)), measures.measure());
  prober.Watch(path.activity());
  prober.Start();
  absl::SleepFor(absl::Milliseconds(20));
  prober.Stop();  // returns: the wait ends with the stop, not the hour
  CHECK(measures.taken() == 0);
  CHECK(calls_cpu->host_waits() == CallsCpu::HostWaits::kUnknown);
}

TEST_CASE("A daemon stopped while a probe measures cuts the probe short and applies nothing") {
  auto calls_cpu = std::make_shared<CallsCpu>(CallsCpu::kRunningCpu);
  absl::Notification measuring;
  std::vector<CallsCpu::HostWaits> told;
  // A measurement that lasts until the prober is stopped (the real one
  // takes 60-130 ms; a daemon told to stop must not wait for it).
  PlacementProber prober(calls_cpu, StartupWait(absl::ZeroDuration()),
                         [&measuring](const absl::Notification& stopping)
                             -> absl::StatusOr<ProbeFigures> {
                           measuring.Notify();
                           stopping.WaitForNotification();
                           return absl::CancelledError("the probe was stopped");
                         });
  prober.OnHostWaits([&told](CallsCpu::HostWaits waits) { told.push_back(waits); });
  prober.Start();
  REQUIRE(measuring.WaitForNotificationWithTimeout(absl::Seconds(30)));
  prober.Stop();  // returns: the measurement ends with the stop
  prober.Stop();  // idempotent
  CHECK(calls_cpu->host_waits() == CallsCpu::HostWaits::kUnknown);
  CHECK(told.empty());
}

TEST_CASE("The real measurement is cut short by Stop() too") {
  auto calls_cpu = std::make_shared<CallsCpu>(CallsCpu::kRunningCpu);
  absl::Notification measuring;
  absl::StatusOr<ProbeFigures> measured = ProbeFigures{};
  PlacementProber prober(calls_cpu, StartupWait(absl::ZeroDuration()),
                         [&](const absl::Notification& stopping) {
                           ProbeOptions options;
                           options.idle_window = absl::Hours(1);  // ends only with the stop
                           options.cancel = &stopping;
                           measuring.Notify();
                           measured = MeasurePlacement(options);
                           return measured;
                         });
  prober.Start();
  REQUIRE(measuring.WaitForNotificationWithTimeout(absl::Seconds(30)));
  prober.Stop();
  if (calls_cpu->host_waits() == CallsCpu::HostWaits::kUnknown) {
    // Two CPUs or more: the hour-long idle window was cut short.
    CHECK(absl::IsCancelled(measured.status()));
  } else {
    // One CPU: nothing to wait for, the probe chose `off` at once.
    REQUIRE(measured.ok());
    CHECK(measured->cpus < 2);
  }
}

}  // namespace
}  // namespace agentix::sandbox
