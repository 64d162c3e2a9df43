// The start-up probe behind --calls_cpu=probe (issue 25): whether keeping the
// call path on one CPU pays on this machine. Pinning pays where a wake-up on
// another CPU is dear (a VM whose idle vCPUs halt: 54-72 us unpinned against
// 6-7 us on one CPU, docs/DECISIONS.md) and costs where it is cheap and
// sched_setaffinity is dear (a guest whose hypervisor wakes vCPUs cheaply:
// the pinned round trip about the unpinned one, ~3 us per
// sched_setaffinity). Nothing the guest can read says which machine it is
// on, so the probe measures the three figures that decide and
// ChoosePlacement turns them into a placement.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace agentix::sandbox {

// What the probe measured; medians, in microseconds.
struct ProbeFigures {
  double same_cpu_us = 0;  // a round trip between two threads on one CPU
  double any_cpu_us = 0;   // the same, both unpinned (the scheduler's choice)
  double affinity_us = 0;  // one sched_setaffinity of the calling thread
  int cpus = 0;            // CPUs the daemon may run on
  absl::Duration took;     // the probe's wall time
};

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
  int affinity_pairs = 100;
};

// Measures on two threads of its own, with the calling thread's CPUs; leaves
// the caller's mask as it was. One CPU allowed: only `cpus` is set.
absl::StatusOr<ProbeFigures> MeasurePlacement(const ProbeOptions& options = {});

// "same-CPU round trip 8.1 us, any-CPU 15.2 us, sched_setaffinity 2.9 us,
// 2 CPUs, 12.3 ms"
std::string DescribeFigures(const ProbeFigures& figures);

}  // namespace agentix::sandbox
