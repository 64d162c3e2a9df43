// The thread behind --calls_cpu=probe (agx-probe): the start-up probe
// (sandbox/placement_probe.h), then the re-probes its ReprobeSchedule
// allows, each applied to the daemon's CallsCpu: whether the call path is
// pinned and what hosts that ask are told (CallsCpu::HostWaits; each
// frame-wire connection tells its host a changed answer when its thread next
// wakes: sandbox/frame_wire_server.cc).
#pragma once

#include <functional>
#include <memory>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "sandbox/calls_cpu.h"
#include "sandbox/placement_probe.h"

namespace agentix::sandbox {

class PlacementProber {
 public:
  // Measures the machine (MeasurePlacement unless set). `stopping` is
  // notified by Stop(): a measurement then ends with CancelledError (at
  // once, not after the round trips it had left), which changes nothing.
  using Measure =
      std::function<absl::StatusOr<ProbeFigures>(const absl::Notification& stopping)>;

  // Until the start-up probe has chosen, `calls_cpu` pins nothing and hosts
  // that ask are not told yet (HostWaits::kUnknown).
  PlacementProber(std::shared_ptr<CallsCpu> calls_cpu, ReprobeSchedule::Options options,
                  Measure measure = nullptr);
  ~PlacementProber();  // Stop()
  PlacementProber(const PlacementProber&) = delete;
  PlacementProber& operator=(const PlacementProber&) = delete;

  // Starts the thread: the start-up probe (at once, or when the call path
  // rests: ReprobeSchedule::Options::startup_wait), then re-probes.
  void Start();
  // From now on the re-probes wait for pauses of `activity` (called on the
  // prober's thread, never under its lock; must stay callable until Stop).
  // Until then none runs, nor a start-up probe that waits. Thread-safe.
  void Watch(std::function<CallPathActivity()> activity);
  // From now on each changed answer to hosts (HostWaits::kPin or kOff) is
  // also given to `told` (on the prober's thread, never under its lock):
  // the direct connections' hosts are told by the worker, not by a daemon
  // thread that follows CallsCpu. Thread-safe.
  void OnHostWaits(std::function<void(CallsCpu::HostWaits)> told);
  // Ends the thread; a probe that is running is cut short. Idempotent.
  void Stop();

  // One probe, applied and logged (the start-up one at info level with its
  // figures, later ones at info level only when the choice changes). A
  // probe that fails chooses Placement::kAll, the placement before the
  // probe; one cut short by Stop() changes and logs nothing. Returns the
  // placement in force. On the prober's thread; tests call it without Start.
  PlacementChoice ProbeOnce(bool first);

 private:
  void Run();
  // Waits as StartupProbeStep says; false when stopped meanwhile.
  bool AwaitStartupProbe();

  const std::shared_ptr<CallsCpu> calls_cpu_;
  const ReprobeSchedule::Options options_;
  const Measure measure_;
  std::thread thread_;
  bool chose_ = false;  // the prober's thread only
  Placement placement_ = Placement::kAll;  // the latest choice
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Notification stopping_;  // notified once, with stop_ set
  std::function<CallPathActivity()> activity_ ABSL_GUARDED_BY(mu_);
  std::function<void(CallsCpu::HostWaits)> told_ ABSL_GUARDED_BY(mu_);
};

}  // namespace agentix::sandbox
