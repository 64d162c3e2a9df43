#include "providers/core/testing/fake_backend.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace agentix::providers::testing {

int FakeWorld::live_with_label(const std::string& key, const std::string& value) {
  absl::MutexLock lock(&mu);
  int n = 0;
  for (auto& [ref, s] : sandboxes) {
    auto it = s.spec.labels.find(key);
    if (it != s.spec.labels.end() && it->second == value) ++n;
  }
  return n;
}

std::string FakeWorld::AddOrphan(const std::string& instance) {
  absl::MutexLock lock(&mu);
  std::string ref = absl::StrCat("fake-orphan-", next_ref_++);
  FakeSandbox& s = sandboxes[ref];
  s.spec.instance = instance;
  s.spec.sandbox_id = ref;
  s.ref = ref;
  s.launched = absl::Now();
  s.observed.state = Observed::State::kRunning;
  return ref;
}

absl::StatusOr<pb::BackendCapabilities> FakeBackend::Probe() {
  pb::BackendCapabilities caps;
  caps.set_name(name_);
  caps.set_network_none(true);
  caps.set_version("fake");
  return caps;
}

absl::Status FakeBackend::Validate(const LaunchSpec& spec) const {
  if (spec.spec.image() == world_->config().invalid_image) {
    return absl::InvalidArgumentError(
        absl::StrCat("image '", spec.spec.image(), "' is not a valid reference"));
  }
  if (spec.spec.resources().gpus() > 0) {
    return absl::FailedPreconditionError("no GPU on this machine");
  }
  return absl::OkStatus();
}

absl::StatusOr<BackendRef> FakeBackend::Launch(const LaunchSpec& spec, absl::Time deadline) {
  FakeConfig config;
  {
    absl::MutexLock lock(&world_->mu);
    config = world_->config_;
    world_->launches_++;
    world_->in_flight_++;
    world_->max_in_flight_ = std::max(world_->max_in_flight_, world_->in_flight_);
    if (world_->config_.fail_launches != 0) {
      if (world_->config_.fail_launches > 0) world_->config_.fail_launches--;
      world_->in_flight_--;
      return absl::FailedPreconditionError(
          absl::StrCat("bootstrap exited with code 1; output:\nboom from ", spec.sandbox_id));
    }
  }
  if (config.launch_latency > absl::ZeroDuration()) absl::SleepFor(config.launch_latency);
  absl::MutexLock lock(&world_->mu);
  world_->in_flight_--;
  std::string ref = absl::StrCat("fake-", world_->next_ref_++, "-", spec.sandbox_id);
  FakeSandbox& s = world_->sandboxes[ref];
  s.spec = spec;
  s.ref = ref;
  s.launched = absl::Now();
  s.log = absl::StrCat("bootstrap of ", spec.sandbox_id, " starting\n");
  s.launched_by = this;
  s.observed.state = Observed::State::kRunning;
  if (config.exit_before_ready || config.oom_before_ready) {
    s.observed.state = Observed::State::kExited;
    s.observed.exit_code = config.oom_before_ready ? 137 : 3;
    s.observed.oom_killed = config.oom_before_ready;
    s.log += "fatal: the entry point failed\n";
  }
  return BackendRef{ref};
}

absl::StatusOr<pb::Endpoint> FakeBackend::ResolveEndpoint(const BackendRef& ref) {
  absl::MutexLock lock(&world_->mu);
  ++world_->resolves_;
  auto it = world_->sandboxes.find(ref.value);
  if (it == world_->sandboxes.end()) return absl::NotFoundError("gone");
  if (it->second.launched_by != this && !world_->config_.survive_restart) {
    return absl::NotFoundError("gone with its providerd");
  }
  if (it->second.observed.state != Observed::State::kRunning ||
      absl::Now() < it->second.launched + world_->config_.ready_after) {
    return absl::UnavailableError("socket not there yet");
  }
  pb::Endpoint endpoint;
  endpoint.set_target(absl::StrCat("fake://", it->second.spec.sandbox_id));
  return endpoint;
}

absl::StatusOr<Observed> FakeBackend::Inspect(const BackendRef& ref) {
  absl::MutexLock lock(&world_->mu);
  auto it = world_->sandboxes.find(ref.value);
  if (it == world_->sandboxes.end()) return Observed{};
  if (it->second.launched_by != this && !world_->config_.survive_restart) {
    return Observed{};  // died with the providerd that launched it
  }
  return it->second.observed;
}

absl::Status FakeBackend::Destroy(const BackendRef& ref, absl::Duration grace) {
  absl::MutexLock lock(&world_->mu);
  if (world_->sandboxes.erase(ref.value)) world_->destroyed_.push_back(ref.value);
  return absl::OkStatus();
}

absl::Status FakeBackend::Extend(const BackendRef& ref, absl::Time expire) {
  absl::MutexLock lock(&world_->mu);
  auto it = world_->sandboxes.find(ref.value);
  if (it == world_->sandboxes.end()) return absl::NotFoundError(ref.value);
  it->second.extended_to = expire;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<BackendRef>> FakeBackend::ListOwned(absl::string_view instance) {
  absl::MutexLock lock(&world_->mu);
  std::vector<BackendRef> out;
  for (auto& [ref, s] : world_->sandboxes) {
    if (s.spec.instance == instance) out.push_back(BackendRef{ref});
  }
  return out;
}

absl::Status FakeBackend::Watch(EventSink* sink) {
  absl::MutexLock lock(&mu_);
  sink_ = sink;
  return absl::OkStatus();
}

absl::Status FakeBackend::StreamLogs(const BackendRef& ref, int64_t offset, bool follow,
                                     LogSink* sink) {
  std::string log;
  {
    absl::MutexLock lock(&world_->mu);
    auto it = world_->sandboxes.find(ref.value);
    if (it != world_->sandboxes.end()) log = it->second.log;
  }
  if (offset < static_cast<int64_t>(log.size())) sink->OnLogData(offset, log.substr(offset), false);
  return absl::OkStatus();
}

std::string FakeBackend::LogTail(const BackendRef& ref, size_t max_bytes) {
  absl::MutexLock lock(&world_->mu);
  auto it = world_->sandboxes.find(ref.value);
  if (it == world_->sandboxes.end()) return "";
  const std::string& log = it->second.log;
  return log.size() > max_bytes ? log.substr(log.size() - max_bytes) : log;
}

void FakeBackend::Shutdown() {
  absl::MutexLock lock(&mu_);
  sink_ = nullptr;
}

bool FakeBackend::Exit(const std::string& sandbox_id, int code, bool oom) {
  BackendRef ref;
  Observed observed;
  {
    absl::MutexLock lock(&world_->mu);
    for (auto& [r, s] : world_->sandboxes) {
      if (s.spec.sandbox_id == sandbox_id) {
        s.observed.state = Observed::State::kExited;
        s.observed.exit_code = code;
        s.observed.oom_killed = oom;
        s.log += oom ? "Killed\n" : absl::StrCat("exited with ", code, "\n");
        ref.value = r;
        observed = s.observed;
      }
    }
  }
  if (ref.value.empty()) return false;
  absl::MutexLock lock(&mu_);
  if (sink_) sink_->OnObserved(ref, observed);
  return true;
}

}  // namespace agentix::providers::testing
