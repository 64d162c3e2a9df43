// A Backend that runs nothing: "sandboxes" are entries in a FakeWorld shared
// between backend instances (so a second controller over the same state dir
// sees what the first one left). Latency, launch failures, exits before
// readiness and OOM kills are configurable; tests deliver exits with Exit().
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "providers/backend.h"

namespace agentix::providers::testing {

struct FakeConfig {
  absl::Duration launch_latency = absl::ZeroDuration();
  // After Launch, ResolveEndpoint is UNAVAILABLE for this long.
  absl::Duration ready_after = absl::ZeroDuration();
  // Launches fail (FAILED_PRECONDITION with "boom" output) while > 0;
  // each failure decrements it. -1: always.
  int fail_launches = 0;
  // The sandbox exits (code 3, or OOM) right after launch, before ready.
  bool exit_before_ready = false;
  bool oom_before_ready = false;
  // Validate refuses specs whose image is this.
  std::string invalid_image = "invalid-image";
  // Sandboxes outlive the backend object that launched them (containers,
  // which are not providerd's children). false: like the local backend's,
  // they die with it, so another backend object finds them Missing.
  bool survive_restart = false;
};

struct FakeSandbox {
  LaunchSpec spec;
  std::string ref;
  absl::Time launched;
  Observed observed;
  std::string log;
  const void* launched_by = nullptr;  // the FakeBackend object
  absl::Time extended_to = absl::InfinitePast();  // the last Extend's expiry
};

class FakeWorld {
 public:
  FakeConfig config() {
    absl::MutexLock lock(&mu);
    return config_;
  }
  void set_config(const FakeConfig& c) {
    absl::MutexLock lock(&mu);
    config_ = c;
  }
  // ResolveEndpoint calls so far.
  int resolves() {
    absl::MutexLock lock(&mu);
    return resolves_;
  }
  // Live sandboxes (launched, not destroyed).
  int live() {
    absl::MutexLock lock(&mu);
    return sandboxes.size();
  }
  int live_with_label(const std::string& key, const std::string& value);
  int launches() {
    absl::MutexLock lock(&mu);
    return launches_;
  }
  std::vector<std::string> destroyed() {
    absl::MutexLock lock(&mu);
    return destroyed_;
  }
  int max_concurrent_launches() {
    absl::MutexLock lock(&mu);
    return max_in_flight_;
  }
  // Pretends `instance` left a sandbox behind (an orphan for ListOwned).
  std::string AddOrphan(const std::string& instance);

  absl::Mutex mu;
  FakeConfig config_ ABSL_GUARDED_BY(mu);
  std::map<std::string, FakeSandbox> sandboxes ABSL_GUARDED_BY(mu);  // by ref
  std::vector<std::string> destroyed_ ABSL_GUARDED_BY(mu);
  int launches_ ABSL_GUARDED_BY(mu) = 0;
  int resolves_ ABSL_GUARDED_BY(mu) = 0;
  int in_flight_ ABSL_GUARDED_BY(mu) = 0;
  int max_in_flight_ ABSL_GUARDED_BY(mu) = 0;
  int next_ref_ ABSL_GUARDED_BY(mu) = 1;
};

class FakeBackend : public Backend {
 public:
  explicit FakeBackend(std::shared_ptr<FakeWorld> world, std::string name = "local")
      : world_(std::move(world)), name_(std::move(name)) {}

  absl::string_view name() const override { return name_; }
  absl::StatusOr<pb::BackendCapabilities> Probe() override;
  absl::Status Validate(const LaunchSpec& spec) const override;
  absl::StatusOr<BackendRef> Launch(const LaunchSpec& spec, absl::Time deadline) override;
  absl::StatusOr<pb::Endpoint> ResolveEndpoint(const BackendRef& ref) override;
  absl::StatusOr<Observed> Inspect(const BackendRef& ref) override;
  absl::Status Destroy(const BackendRef& ref, absl::Duration grace) override;
  absl::Status Extend(const BackendRef& ref, absl::Time expire) override;
  absl::StatusOr<std::vector<BackendRef>> ListOwned(absl::string_view instance) override;
  absl::Status Watch(EventSink* sink) override;
  absl::Status StreamLogs(const BackendRef& ref, int64_t offset, bool follow,
                          LogSink* sink) override;
  std::string LogTail(const BackendRef& ref, size_t max_bytes) override;
  void Shutdown() override;
  bool SandboxesSurviveRestart() const override { return world_->config().survive_restart; }

  // Makes the sandbox with `sandbox_id` exit (as its backend would report).
  bool Exit(const std::string& sandbox_id, int code, bool oom);

 private:
  std::shared_ptr<FakeWorld> world_;
  const std::string name_;
  absl::Mutex mu_;
  EventSink* sink_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace agentix::providers::testing
