#include "sandbox/placement_prober.h"

#include <pthread.h>

#include <string>
#include <utility>

#include "absl/time/clock.h"
#include "base/log.h"

namespace agentix::sandbox {

PlacementProber::PlacementProber(std::shared_ptr<CallsCpu> calls_cpu,
                                 ReprobeSchedule::Options options, Measure measure)
    : calls_cpu_(std::move(calls_cpu)),
      options_(options),
      measure_(measure ? std::move(measure) : [](const absl::Notification& stopping) {
        ProbeOptions probe;
        probe.cancel = &stopping;
        return MeasurePlacement(probe);
      }) {
  calls_cpu_->SetActive(false);
  calls_cpu_->SetHostWaits(CallsCpu::HostWaits::kUnknown);
}

PlacementProber::~PlacementProber() { Stop(); }

void PlacementProber::Start() {
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "agx-probe");
    Run();
  });
}

void PlacementProber::Watch(std::function<CallPathActivity()> activity) {
  absl::MutexLock lock(&mu_);
  activity_ = std::move(activity);
}

void PlacementProber::OnHostWaits(
    std::function<void(CallsCpu::HostWaits)> told) {
  absl::MutexLock lock(&mu_);
  told_ = std::move(told);
}

void PlacementProber::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (!stop_) {
      stop_ = true;
      stopping_.Notify();
    }
  }
  if (thread_.joinable()) thread_.join();
}

PlacementChoice PlacementProber::ProbeOnce(bool first) {
  absl::StatusOr<ProbeFigures> figures = measure_(stopping_);
  if (stopping_.HasBeenNotified() && absl::IsCancelled(figures.status())) {
    // Stopped meanwhile: nothing measured, nothing to apply.
    PlacementChoice in_force;
    in_force.placement = placement_;
    return in_force;
  }
  PlacementChoice choice;  // a failed probe: Placement::kAll
  if (figures.ok()) choice = ChoosePlacement(*figures);
  const bool changed = !chose_ || choice.placement != placement_;
  const char* const what = first ? "probe" : "re-probe";
  if (!figures.ok()) {
    if (changed) {
      AGX_LOG(Warning, "calls_cpu {} failed ({}): pin", what,
              std::string(figures.status().message()));
    }
  } else if (first || changed) {
    AGX_LOG(Info, "calls_cpu {}: {} ({}); {}", what, PlacementName(choice.placement),
            choice.why, DescribeFigures(*figures));
  } else {
    AGX_LOG(Debug, "calls_cpu {}: {} ({}); {}", what, PlacementName(choice.placement),
            choice.why, DescribeFigures(*figures));
  }
  chose_ = true;
  placement_ = choice.placement;
  if (changed) {
    // The daemon's side first: a host told meanwhile finds it in place.
    calls_cpu_->SetActive(choice.placement != Placement::kOff);
    const CallsCpu::HostWaits waits = choice.placement == Placement::kAll
                                          ? CallsCpu::HostWaits::kPin
                                          : CallsCpu::HostWaits::kOff;
    calls_cpu_->SetHostWaits(waits);
    std::function<void(CallsCpu::HostWaits)> told;
    {
      absl::MutexLock lock(&mu_);
      told = told_;
    }
    if (told) told(waits);
  }
  return choice;
}

void PlacementProber::Run() {
  if (!AwaitStartupProbe()) return;
  const absl::Time began = absl::Now();
  ProbeOnce(/*first=*/true);
  ReprobeSchedule schedule(options_, absl::Now(), began);
  absl::Time look_at = absl::Now();
  for (;;) {
    std::function<CallPathActivity()> activity;
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithDeadline(absl::Condition(&stop_), look_at)) return;
      activity = activity_;
    }
    const absl::Time now = absl::Now();
    if (!activity) {  // not watching yet: no call can have run
      look_at = options_.every > absl::ZeroDuration() ? now + options_.every
                                                      : absl::InfiniteFuture();
      continue;
    }
    const ReprobeSchedule::Step step = schedule.Next(activity(), now);
    if (!step.probe) {
      look_at = step.look_at;
      continue;
    }
    const absl::Time reprobe_began = absl::Now();
    ProbeOnce(/*first=*/false);
    schedule.Probed(absl::Now(), reprobe_began);
    look_at = absl::Now();
  }
}

bool PlacementProber::AwaitStartupProbe() {
  const absl::Time started = absl::Now();
  for (;;) {
    std::function<CallPathActivity()> activity;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return false;
      activity = activity_;
    }
    const absl::Time now = absl::Now();
    const ReprobeSchedule::Step step = StartupProbeStep(
        options_, activity != nullptr, activity ? activity() : CallPathActivity{},
        started, now);
    if (step.probe) return true;
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithDeadline(absl::Condition(&stop_), step.look_at)) return false;
  }
}

}  // namespace agentix::sandbox
