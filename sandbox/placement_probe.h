// The start-up probe behind --calls_cpu=probe (issue 25): whether keeping the
// call path on one CPU pays on this machine. Pinning pays where a wake-up on
// another CPU is dear (a VM whose idle vCPUs halt: 54-72 us unpinned against
// 6-7 us on one CPU, docs/DECISIONS.md) and costs where it is cheap and
// sched_setaffinity is dear (a guest whose hypervisor wakes vCPUs cheaply:
// the pinned round trip about the unpinned one, ~3 us per
// sched_setaffinity). Little the guest can read says which machine it is
// on, so the probe measures the three figures that decide and
// ChoosePlacement turns them into a placement. The one thing it reads is
// the idle policy: vCPUs that poll before they halt (a KVM guest's haltpoll
// default) wake without the hypervisor, and there a call spread over two
// CPUs beats one kept on one CPU by pins, whatever the round trips say.
#pragma once

#include <algorithm>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace agentix::sandbox {

// What the probe measured; medians, in microseconds.
struct ProbeFigures {
  double same_cpu_us = 0;   // a round trip between two threads on one CPU
  double cross_cpu_us = 0;  // the same, the two threads pinned to two CPUs
  double affinity_us = 0;   // one sched_setaffinity of the calling thread
  int cpus = 0;             // CPUs the daemon may run on
  // Of those, the CPUs idle at least half of a short window before the round
  // trips (/proc/stat); -1: not known.
  int idle_cpus = -1;
  // How long an idle CPU polls before it halts, in ns (the haltpoll cpuidle
  // governor's guest_halt_poll_ns); 0: it halts at once; -1: not known
  // (another governor, or none).
  long long idle_poll_ns = -1;
  absl::Duration took;     // the probe's wall time
};

// An idle CPU that polls at least this long before halting catches the
// next hand-off of a call (a few to a few tens of us away) without a halt:
// the haltpoll governor's own starting window.
inline constexpr long long kPollCoversWakeNs = 50'000;

// guest_halt_poll_ns under `sys_root` when the cpuidle governor is haltpoll,
// else -1 (`agentix doctor`'s "cpu idle" check reads the same files).
long long ReadIdlePollNs(const std::string& sys_root = "/sys");

enum class Placement {
  kAll,     // the daemon's placement and the hosts' pinned waits (`auto`)
  kDaemon,  // the daemon's placement; the hosts are told not to pin
  kOff,     // nothing pinned (one CPU); the hosts are told not to pin
};

struct PlacementChoice {
  Placement placement = Placement::kAll;
  std::string why;
};

// "pin", "pin_daemon" or "off" (the names wake_ab's settings use).
const char* PlacementName(Placement placement);

// The rule (sandbox/placement_probe.cc). Figures that cannot be right
// (not finite, not positive) choose kAll, the placement before the probe.
PlacementChoice ChoosePlacement(const ProbeFigures& figures);

struct ProbeOptions {
  int round_trips = 300;  // per mode, after kWarmUp
  absl::Duration idle_window = absl::Milliseconds(50);  // for idle_cpus
  int affinity_pairs = 100;
  // Once notified, the probe ends within a round trip (its idle window at
  // once) with CancelledError: a daemon told to stop does not wait for the
  // 60-130 ms a probe takes.
  const absl::Notification* cancel = nullptr;
};

// Measures on two threads of its own, with the calling thread's CPUs; leaves
// the caller's mask as it was. One CPU allowed: only `cpus` is set.
// CancelledError once `options.cancel` is notified.
absl::StatusOr<ProbeFigures> MeasurePlacement(const ProbeOptions& options = {});

// "same-CPU round trip 8.1 us, cross-CPU 15.2 us, sched_setaffinity 2.9 us,
// 2 CPUs (2 idle), 12.3 ms; idle CPUs poll up to 200 us" (or "...; idle
// CPUs halt at once (guest_halt_poll_ns 0)"; nothing when not known)
std::string DescribeFigures(const ProbeFigures& figures);

// What the call path is doing, as a re-probe needs to know it.
struct CallPathActivity {
  bool busy = false;  // a call runs or waits, or a worker boots
  absl::Time last_call_end = absl::InfinitePast();  // the latest with none running
};

// When the probe measures again (--calls_cpu=probe): a start-up probe sees
// the machine as it was then (many sandboxes starting at once look like a
// busy machine, whose cross-CPU wake-ups are cheap), so the choice is
// measured again, at most once per `every`, and only in a pause of the
// call path: after a call ended since the last probe began (an unused daemon
// never probes again: its hosts have nothing to pin for), with no call
// running or waiting and no worker booting, `quiet` after the latest call's
// end (while calls run it looks every `quiet`, less often as they go on,
// up to every `every` / 4). The probe's ~13 ms of two threads then delays no call that was
// already there, and it measures what the start-up probe measured: the
// machine without this sandbox's calls. Not thread-safe.
class ReprobeSchedule {
 public:
  struct Options {
    absl::Duration every = absl::Seconds(60);  // ZeroDuration: never again
    absl::Duration quiet = absl::Milliseconds(100);
    // The first re-probe's period (at most `every`): the start-up probe often
    // sees a moment that is not the machine's usual (the host's own start,
    // other sandboxes booting), and a sandbox's first pause is the first
    // chance to measure it at rest.
    absl::Duration first_every = absl::Seconds(1);
    // How long the start-up probe may wait for a call path at rest (see
    // StartupProbeStep). ZeroDuration: it measures at once.
    absl::Duration startup_wait = absl::ZeroDuration();
  };
  struct Step {
    bool probe = false;
    absl::Time look_at = absl::InfiniteFuture();  // when !probe: look again then
  };

  // `probed_at`: when the start-up probe ended; `began`: when it began
  // (default: `probed_at`). A call that ended after `began` counts as use
  // since that probe: the probe measured its load as the machine's (the
  // start-up probe may begin between two of a host's first calls, which
  // then read as a busy CPU), so the first pause measures again.
  ReprobeSchedule(Options options, absl::Time probed_at,
                  absl::Time began = absl::InfiniteFuture())
      : options_(options), probed_at_(probed_at), began_(std::min(began, probed_at)) {}

  // Whether to probe now; otherwise when to call Next again.
  Step Next(const CallPathActivity& activity, absl::Time now) const;
  // A probe that began at `began` (default: `at`) ended at `at`.
  void Probed(absl::Time at, absl::Time began = absl::InfiniteFuture()) {
    probed_at_ = at;
    began_ = std::min(began, at);
    reprobed_ = true;
  }

 private:
  const Options options_;
  absl::Time probed_at_;
  absl::Time began_;  // calls that ended after it are use since the last probe
  bool reprobed_ = false;  // whether the start-up probe is the last one
};

// When the start-up probe measures. Its ~15-30 ms of two busy threads took
// CPU from a prestarted worker's boot, the cold create's critical path, and
// measured the boot's load instead of the machine (stop 34). So it waits,
// up to `options.startup_wait` after `started`, until the call path is
// watched (`watching`) and at rest: no worker booting, no call running or
// queued. No `quiet` pause is required: a daemon whose calls start at once
// is not left unpinned for long. While it waits it looks every few ms.
ReprobeSchedule::Step StartupProbeStep(const ReprobeSchedule::Options& options,
                                       bool watching, const CallPathActivity& activity,
                                       absl::Time started, absl::Time now);

}  // namespace agentix::sandbox
