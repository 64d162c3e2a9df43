// The daemon flags that change the worker's command line, and the worker
// arguments they make. The daemon's spawn and agentix-launch both take the
// arguments from WorkerArgsFor, so an early worker is the one the daemon
// would spawn (adoption checks the command line and refuses any other).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "sandbox/worker_process.h"

namespace agentix::sandbox {

// The daemon's defaults for these flags (its ABSL_FLAGs use them): the
// launcher reads a daemon command line that may leave them out.
// Direct calls on since stop 43 (docs/DIRECT-CALLS.md, "Flag and default").
inline constexpr bool kDirectCallsByDefault = true;
inline constexpr bool kCallsSocketByDefault = true;
inline constexpr int64_t kWorkerIntakeSpinUsByDefault = 0;
// The worker's IntakeBaton::kDefaultLookSlack, in us (its --intake-look-slack-us
// default): the daemon leaves the flag off a worker's command line at this value.
inline constexpr int64_t kWorkerIntakeLookSlackUsByDefault = 4000;
inline constexpr char kCallsCpuByDefault[] = "probe";
inline constexpr uint64_t kMaxRetainedResultsByDefault = 4096;

struct DaemonWorkerFlags {
  std::string python_home;                   // --python_home
  int64_t worker_intake_spin_us = kWorkerIntakeSpinUsByDefault;
  bool direct_calls = kDirectCallsByDefault;  // --direct_calls
  bool calls_socket = kCallsSocketByDefault;  // --calls_socket
  bool calls_cpu_off = false;                 // --calls_cpu pins nothing
  uint64_t max_retained_results = kMaxRetainedResultsByDefault;
  int64_t worker_intake_look_slack_us = kWorkerIntakeLookSlackUsByDefault;
};

// Whether the daemon hands connections to its workers: --direct_calls, and
// the frame wire's socket to take them from.
bool ServesDirectCalls(const DaemonWorkerFlags& flags);

// The worker's arguments after --venv / --python-path, in the daemon's order.
std::vector<std::string> WorkerArgsFor(const DaemonWorkerFlags& flags);

// What the flags make of a worker's options: its extra arguments
// (WorkerArgsFor) and, with direct calls, its ledger's call slots.
void SetWorkerOptionsFor(const DaemonWorkerFlags& flags, WorkerOptions& options);

// Whether a --calls_cpu value pins nothing, as the daemon reads it ("" or
// "off"; "auto" and "probe" place the call path). kInvalidArgument for a
// value the daemon refuses.
absl::StatusOr<bool> CallsCpuPinsNothing(const std::string& value);

// Those flags from a daemon's arguments (without its path), read as absl
// reads them: --name=V, --name V (not for bools), --noname for bools,
// dashes or underscores in names, one or two leading dashes, the last
// occurrence wins, nothing after a bare "--". Other arguments are skipped
// (another flag's separate value counts only if it spells one of these).
// kInvalidArgument for a value of these flags the daemon would refuse.
absl::StatusOr<DaemonWorkerFlags> DaemonWorkerFlagsFrom(
    const std::vector<std::string>& args);

}  // namespace agentix::sandbox
