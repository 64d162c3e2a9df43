#include "sandbox/placement_probe.h"

#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "base/cpu_affinity.h"

namespace agentix::sandbox {
namespace {

// A sequential call hands off four times relayed (host -> daemon -> worker ->
// daemon -> host), twice direct (host -> worker -> host). The hosts' pinned
// waits keep the host's two hand-offs a call (its request's and its reply's:
// a round trip) on the call path's CPU and pay two sched_setaffinity per call
// in the host, where a pin from Python cost ~4x the bare system call (stop
// 25: 5-6 us of loop CPU for two, against 0.65 us a call in a tight loop).
// Pinning pays only where an unpinned call path would spread over CPUs that
// halt: with another CPU idle the scheduler wakes each side there, and a
// round trip across CPUs costs what it costs two threads pinned apart; with
// no other CPU idle (a busy core on two CPUs, a loaded machine) it keeps the
// chain on one CPU by itself and the pins are pure cost (stop 43, two CPUs:
// idle, pinned 0.67x the direct noop's p50 and 0.82x the relayed one; one
// busy core, 1.41x and 1.16x). Until stop 43 the rule read one unpinned pair
// of threads, which the scheduler kept on one CPU in some runs and spread in
// others on the same idle machine (9 or 29 us), and weighed half of it
// against the pins: it chose pin_daemon in many quiet starts. The daemon's own
// placement is kept even where a hand-off saves nothing: on the machine
// whose wake-ups are cheap it measured no worse than off (p50 0.89-1.08x
// off, 0.83-0.91x the whole placement; docs/PERFORMANCE.md, stop 30/31).
constexpr double kHostPinFactor = 4.0;
// Below this a round trip's saving is the probe's own noise.
constexpr double kMinGainUs = 2.0;
// A CPU idle for at least this share of the window counts as idle.
constexpr double kIdleShare = 0.5;
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

bool Cancelled(const absl::Notification* cancel) {
  return cancel != nullptr && cancel->HasBeenNotified();
}

absl::Status CancelledProbe() { return absl::CancelledError("the probe was stopped"); }

// One byte each way between this thread and an echo thread, over a Unix
// socketpair (the call path's own kind of hand-off). `cpus`: this thread's
// mask for the whole run, `echo_cpus` the echo thread's.
absl::StatusOr<double> RoundTrip(const cpu_set_t& cpus, const cpu_set_t& echo_cpus,
                                 int round_trips, const absl::Notification* cancel) {
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
    echo = std::thread([fd = fds[1], echo_cpus] {
      // A new thread inherits its creator's name; the prober's own
      // ("agx-probe") is the one tools and tests look for.
      pthread_setname_np(pthread_self(), "agx-probe-echo");
      (void)base::SetThreadCpus(0, echo_cpus);
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
  bool cancelled = false;
  for (int i = 0; !broken && i < kWarmUp + round_trips; ++i) {
    if (Cancelled(cancel)) {
      cancelled = true;
      break;
    }
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
  if (cancelled) return CancelledProbe();
  if (broken) return absl::InternalError("the probe's socketpair broke");
  return Median(std::move(times));
}

// Idle + iowait jiffies of each CPU of `cpus`, in /proc/stat's order; empty
// if it cannot be read.
std::vector<long long> IdleJiffies(const cpu_set_t& cpus) {
  std::vector<long long> out;
  std::FILE* stat = std::fopen("/proc/stat", "re");
  if (stat == nullptr) return out;
  char line[512];
  while (std::fgets(line, sizeof(line), stat) != nullptr) {
    int cpu = -1;
    long long user, nice, system, idle, iowait;
    if (std::sscanf(line, "cpu%d %lld %lld %lld %lld %lld", &cpu, &user, &nice, &system,
                    &idle, &iowait) == 6 &&
        cpu >= 0 && cpu < CPU_SETSIZE && CPU_ISSET(cpu, &cpus)) {
      out.push_back(idle + iowait);
    }
  }
  std::fclose(stat);
  return out;
}

// How many CPUs of `cpus` were idle at least kIdleShare of `window` (slept
// through by this thread); -1 if /proc/stat cannot say; CancelledError if
// `cancel` is notified meanwhile.
absl::StatusOr<int> IdleCpus(const cpu_set_t& cpus, absl::Duration window,
                             const absl::Notification* cancel) {
  const std::vector<long long> before = IdleJiffies(cpus);
  const double start = NowUs();
  if (cancel == nullptr) {
    absl::SleepFor(window);
  } else if (cancel->WaitForNotificationWithTimeout(window)) {
    return CancelledProbe();
  }
  const double slept_s = (NowUs() - start) / 1e6;
  const std::vector<long long> after = IdleJiffies(cpus);
  const long ticks = ::sysconf(_SC_CLK_TCK);
  if (before.empty() || before.size() != after.size() || ticks <= 0 || slept_s <= 0) {
    return -1;
  }
  int idle = 0;
  for (size_t i = 0; i < before.size(); ++i) {
    const double idle_s = static_cast<double>(after[i] - before[i]) / ticks;
    if (idle_s >= kIdleShare * slept_s) ++idle;
  }
  return idle;
}

// The calling thread pinned to its CPU and given its mask back, per call.
double AffinityUs(const cpu_set_t& all, int pairs, const absl::Notification* cancel) {
  const int cpu = ::sched_getcpu();
  if (cpu < 0) return 0;
  const cpu_set_t one = base::CpuSetOf(cpu);
  std::vector<double> times;
  times.reserve(pairs);
  for (int i = 0; i < pairs && !Cancelled(cancel); ++i) {
    const double start = NowUs();
    if (::sched_setaffinity(0, sizeof(one), &one) != 0 ||
        ::sched_setaffinity(0, sizeof(all), &all) != 0) {
      return 0;
    }
    times.push_back((NowUs() - start) / 2);
  }
  return Median(std::move(times));
}

// The first line of a small sysfs file, without its newline; "" if unreadable.
std::string FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return "";
  return line;
}

}  // namespace

long long ReadIdlePollNs(const std::string& sys_root) {
  const std::string cpuidle = sys_root + "/devices/system/cpu/cpuidle/";
  std::string governor = FirstLine(cpuidle + "current_governor_ro");
  if (governor.empty()) governor = FirstLine(cpuidle + "current_governor");
  if (absl::StripAsciiWhitespace(governor) != "haltpoll") return -1;
  long long poll_ns = -1;
  const std::string text =
      FirstLine(sys_root + "/module/haltpoll/parameters/guest_halt_poll_ns");
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &poll_ns) || poll_ns < 0) return -1;
  return poll_ns;
}

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
  if (!Finite(f.same_cpu_us) || !Finite(f.cross_cpu_us) || !Finite(f.affinity_us)) {
    return {Placement::kAll, "no usable figures: the placement before the probe"};
  }
  const double pins = kHostPinFactor * f.affinity_us;
  // Idle vCPUs that poll before halting wake without the hypervisor: a call
  // whose host and worker run on two CPUs overlaps their work and wakes each
  // side cheaply, where pins put it all on one CPU and add their system
  // calls. The round trips do not show this (pinned apart they measured
  // 20-30 us against 9 on one CPU, yet unpinned the direct noop took 27 us
  // against 53-57 pinned, the relayed one 49 against 89; stop 45).
  if (f.idle_poll_ns >= kPollCoversWakeNs) {
    return {Placement::kDaemon,
            absl::StrFormat("idle CPUs poll up to %lld us before halting: a call spread over "
                            "CPUs wakes each side cheaply, a host's pins cost ~%.1f us",
                            f.idle_poll_ns / 1000, pins)};
  }
  // No other CPU idle: the scheduler keeps a call path on one CPU by itself.
  if (f.idle_cpus >= 0 && f.idle_cpus < 2) {
    return {Placement::kDaemon,
            absl::StrFormat("%d of %d CPUs idle: an unpinned call path stays on one CPU, "
                            "a host's pins cost ~%.1f us",
                            f.idle_cpus, f.cpus, pins)};
  }
  // What a call's round trip (the host's two hand-offs) saves on one CPU
  // against one spread over two; a pair pinned apart that came out faster
  // saves nothing.
  const double gain = std::max(0.0, f.cross_cpu_us - f.same_cpu_us);
  if (gain < kMinGainUs || gain <= pins) {
    return {Placement::kDaemon,
            absl::StrFormat("a round trip saves %.1f us on one CPU, a host's pins cost ~%.1f us",
                            gain, pins)};
  }
  return {Placement::kAll,
          absl::StrFormat("a round trip saves %.1f us on one CPU: more than a host's "
                          "pins (~%.1f us)",
                          gain, pins)};
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
    // Idleness first, before this probe's own threads run.
    absl::StatusOr<int> idle = IdleCpus(all, options.idle_window, options.cancel);
    if (!idle.ok()) return idle.status();
    figures.idle_cpus = *idle;
    const int cpu = std::max(0, ::sched_getcpu());
    int other = -1;
    for (int c = 0; c < CPU_SETSIZE && other < 0; ++c) {
      if (c != cpu && CPU_ISSET(c, &all)) other = c;
    }
    const cpu_set_t here = base::CpuSetOf(cpu);
    absl::StatusOr<double> cross =
        RoundTrip(here, base::CpuSetOf(other), options.round_trips, options.cancel);
    if (!cross.ok()) return cross.status();
    absl::StatusOr<double> same = RoundTrip(here, here, options.round_trips, options.cancel);
    if (!same.ok()) return same.status();
    figures.cross_cpu_us = *cross;
    figures.same_cpu_us = *same;
    figures.affinity_us = AffinityUs(all, options.affinity_pairs, options.cancel);
    if (Cancelled(options.cancel)) return CancelledProbe();
    figures.idle_poll_ns = ReadIdlePollNs();
  }
  figures.took = absl::Microseconds(NowUs() - start);
  return figures;
}

ReprobeSchedule::Step ReprobeSchedule::Next(const CallPathActivity& activity,
                                             absl::Time now) const {
  if (options_.every <= absl::ZeroDuration()) return {};
  const absl::Duration period =
      reprobed_ ? options_.every : std::min(options_.every, options_.first_every);
  const absl::Time due = probed_at_ + period;
  if (now < due) return {false, due};
  // Unused since the last probe: nothing to decide for; a look per period
  // costs an idle daemon one wake-up (one a `first_every` in the start-up
  // probe's first `every`, so that a sandbox's first calls are not left
  // with the start-up answer for a minute).
  if (!activity.busy && activity.last_call_end <= began_) {
    const bool first = !reprobed_ && now < probed_at_ + options_.every;
    return {false, now + (first ? period : options_.every)};
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
  std::string idle;
  if (f.idle_poll_ns == 0) {
    idle = "; idle CPUs halt at once (guest_halt_poll_ns 0)";
  } else if (f.idle_poll_ns > 0) {
    idle = absl::StrFormat("; idle CPUs poll up to %lld us", f.idle_poll_ns / 1000);
  }
  return absl::StrFormat(
      "same-CPU round trip %.1f us, cross-CPU %.1f us, sched_setaffinity %.2f us, "
      "%d CPUs (%d idle), %.1f ms%s",
      f.same_cpu_us, f.cross_cpu_us, f.affinity_us, f.cpus, f.idle_cpus,
      absl::ToDoubleMilliseconds(f.took), idle);
}

}  // namespace agentix::sandbox
