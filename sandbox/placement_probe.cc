#include "sandbox/placement_probe.h"

#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/cpu_affinity.h"

namespace agentix::sandbox {
namespace {

// A sequential call hands off four times (host -> daemon -> worker -> daemon
// -> host). The hosts' pinned waits keep the host <-> daemon hand-offs on
// the daemon's CPU and pay two sched_setaffinity per call in the host, where
// a pin from Python cost ~4x the bare system call (stop 25: 5-6 us of loop
// CPU for two, against 0.65 us a call in a tight loop). The daemon's own
// placement is kept even where a hand-off saves nothing: on the machine
// whose wake-ups are cheap it measured no worse than off (p50 0.89-1.08x
// off, 0.83-0.91x the whole placement; docs/PERFORMANCE.md, stop 30/31).
constexpr double kHostPinFactor = 4.0;
// Below this a hand-off's saving is the probe's own noise.
constexpr double kMinGainUs = 1.0;
constexpr int kWarmUp = 30;

double NowUs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  return values[mid];
}

bool Finite(double value) { return std::isfinite(value) && value > 0; }

// One byte each way between this thread and an echo thread, over a Unix
// socketpair (the call path's own kind of hand-off). `cpus`: both threads'
// mask for the whole run.
absl::StatusOr<double> RoundTrip(const cpu_set_t& cpus, int round_trips) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return absl::InternalError(absl::StrFormat("socketpair: errno %d", errno));
  }
  const cpu_set_t before = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    ::sched_getaffinity(0, sizeof(set), &set);
    return set;
  }();
  absl::Status placed = base::SetThreadCpus(0, cpus);
  // Whatever the way out (after the echo thread, if any, has been joined):
  // the sockets closed, this thread's mask given back.
  absl::Cleanup restore = [&fds, &before] {
    ::close(fds[0]);
    ::close(fds[1]);
    (void)base::SetThreadCpus(0, before);
  };
  std::thread echo;
  try {
    echo = std::thread([fd = fds[1], cpus] {
      (void)base::SetThreadCpus(0, cpus);
      char byte;
      while (::read(fd, &byte, 1) == 1) {
        if (::write(fd, &byte, 1) != 1) break;
      }
    });
  } catch (const std::system_error& error) {
    // No thread to be had (a sandbox's pids limit reached by user code, say):
    // this probe fails, the daemon goes on (the caller keeps its placement).
    return absl::ResourceExhaustedError(
        absl::StrCat("the probe's echo thread: ", error.what()));
  }
  std::vector<double> times;
  times.reserve(round_trips);
  bool broken = !placed.ok();
  for (int i = 0; !broken && i < kWarmUp + round_trips; ++i) {
    char byte = 'p';
    const double start = NowUs();
    if (::write(fds[0], &byte, 1) != 1 || ::read(fds[0], &byte, 1) != 1) {
      broken = true;
      break;
    }
    if (i >= kWarmUp) times.push_back(NowUs() - start);
  }
  ::shutdown(fds[0], SHUT_RDWR);  // ends the echo thread's read
  echo.join();
  if (!placed.ok()) return placed;
  if (broken) return absl::InternalError("the probe's socketpair broke");
  return Median(std::move(times));
}

// The calling thread pinned to its CPU and given its mask back, per call.
double AffinityUs(const cpu_set_t& all, int pairs) {
  const int cpu = ::sched_getcpu();
  if (cpu < 0) return 0;
  const cpu_set_t one = base::CpuSetOf(cpu);
  std::vector<double> times;
  times.reserve(pairs);
  for (int i = 0; i < pairs; ++i) {
    const double start = NowUs();
    if (::sched_setaffinity(0, sizeof(one), &one) != 0 ||
        ::sched_setaffinity(0, sizeof(all), &all) != 0) {
      return 0;
    }
    times.push_back((NowUs() - start) / 2);
  }
  return Median(std::move(times));
}

}  // namespace

const char* PlacementName(Placement placement) {
  switch (placement) {
    case Placement::kAll:
      return "pin";
    case Placement::kDaemon:
      return "pin_daemon";
    case Placement::kOff:
      return "off";
  }
  return "pin";
}

PlacementChoice ChoosePlacement(const ProbeFigures& f) {
  if (f.cpus < 2) {
    return {Placement::kOff, "one CPU: every hand-off is on it anyway"};
  }
  if (!Finite(f.same_cpu_us) || !Finite(f.any_cpu_us) || !Finite(f.affinity_us)) {
    return {Placement::kAll, "no usable figures: the placement before the probe"};
  }
  // What one hand-off saves on one CPU; an unpinned pair that came out
  // faster saves nothing.
  const double gain = std::max(0.0, (f.any_cpu_us - f.same_cpu_us) / 2);
  if (gain < kMinGainUs || gain <= kHostPinFactor * f.affinity_us) {
    return {Placement::kDaemon,
            absl::StrFormat("a hand-off saves %.1f us on one CPU, a host's pin costs ~%.1f us",
                            gain, kHostPinFactor * f.affinity_us)};
  }
  return {Placement::kAll,
          absl::StrFormat("a hand-off saves %.1f us on one CPU: more than a host's "
                          "pin (~%.1f us)",
                          gain, kHostPinFactor * f.affinity_us)};
}

absl::StatusOr<ProbeFigures> MeasurePlacement(const ProbeOptions& options) {
  const double start = NowUs();
  ProbeFigures figures;
  cpu_set_t all;
  CPU_ZERO(&all);
  if (::sched_getaffinity(0, sizeof(all), &all) != 0) {
    return absl::InternalError(absl::StrFormat("sched_getaffinity: errno %d", errno));
  }
  figures.cpus = CPU_COUNT(&all);
  if (figures.cpus >= 2) {
    // Unpinned first, with fresh threads: where the scheduler puts them.
    absl::StatusOr<double> any = RoundTrip(all, options.round_trips);
    if (!any.ok()) return any.status();
    const int cpu = ::sched_getcpu();
    absl::StatusOr<double> same =
        RoundTrip(base::CpuSetOf(cpu >= 0 ? cpu : 0), options.round_trips);
    if (!same.ok()) return same.status();
    figures.any_cpu_us = *any;
    figures.same_cpu_us = *same;
    figures.affinity_us = AffinityUs(all, options.affinity_pairs);
  }
  figures.took = absl::Microseconds(NowUs() - start);
  return figures;
}

ReprobeSchedule::Step ReprobeSchedule::Next(const CallPathActivity& activity,
                                             absl::Time now) const {
  if (options_.every <= absl::ZeroDuration()) return {};
  const absl::Time due = probed_at_ + options_.every;
  if (now < due) return {false, due};
  // Unused since the last probe: nothing to decide for; a look per period
  // costs an idle daemon one wake-up.
  if (!activity.busy && activity.last_call_end <= probed_at_) {
    return {false, now + options_.every};
  }
  // A call runs: look again soon, then less often the longer it lasts (a
  // long call or a stream without a pause costs a few looks a minute).
  if (activity.busy) {
    return {false, now + std::min(std::max(options_.quiet, (now - due) / 8),
                                  std::max(options_.quiet, options_.every / 4))};
  }
  // The pause is too short yet to tell from a stream's gap.
  const absl::Time paused = activity.last_call_end + options_.quiet;
  if (now < paused) return {false, paused};
  return {true, now};
}

ReprobeSchedule::Step StartupProbeStep(const ReprobeSchedule::Options& options,
                                       bool watching, const CallPathActivity& activity,
                                       absl::Time started, absl::Time now) {
  // A look costs one lock; a worker boots in ~50-100 ms.
  constexpr absl::Duration kLook = absl::Milliseconds(5);
  const absl::Time deadline = started + options.startup_wait;
  if (now >= deadline) return {true, now};
  if (watching && !activity.busy) return {true, now};
  return {false, std::min(now + kLook, deadline)};
}

std::string DescribeFigures(const ProbeFigures& f) {
  return absl::StrFormat(
      "same-CPU round trip %.1f us, any-CPU %.1f us, sched_setaffinity %.2f us, "
      "%d CPUs, %.1f ms",
      f.same_cpu_us, f.any_cpu_us, f.affinity_us, f.cpus,
      absl::ToDoubleMilliseconds(f.took));
}

}  // namespace agentix::sandbox
