// The Backend interface: what a place that runs sandboxes (bubblewrap on this
// machine, a container engine, a Kubernetes cluster) must do for
// agentix-providerd. Backends only map a validated spec onto their world;
// readiness, arming, TTLs, idempotency and pools live once, in
// core/SandboxController.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "agentix/provider/v1/provider.pb.h"

namespace agentix::providers {

namespace pb = ::agentix::provider::v1;

// One launch attempt of one sandbox.
struct LaunchSpec {
  std::string sandbox_id;  // [a-z0-9-]{1,63}
  std::string uid;         // unique per attempt; backends label/record with it
  pb::SandboxSpec spec;    // validated by Backend::Validate
  std::map<std::string, std::string> labels;
  // providerd <-> daemon secret. The backend hands it to the sandbox's
  // daemon (`bootstrap.sh --admin-token-file ...`) without putting it in any
  // environment or command line the sandbox can read.
  std::string admin_token;
  // This providerd's instance name: what ListOwned finds again.
  std::string instance;
  // The CreateSandbox request id and the sandbox's expiry when known (empty
  // / InfinitePast otherwise). Backends that keep no journal of their own
  // record them on what they make (Kubernetes: Pod annotations, so a create
  // retry that meets a 409 can adopt the Pod of the same request).
  std::string request_id;
  absl::Time expire_time = absl::InfinitePast();
};

// How a backend names what it launched (a pid + state dir, a container id,
// a pod name). Opaque to the controller; journaled so a restart finds it.
struct BackendRef {
  std::string value;
};

// What the backend sees of one sandbox right now.
struct Observed {
  enum class State { kCreating, kRunning, kExited, kMissing };
  State state = State::kMissing;
  std::optional<int> exit_code;
  bool oom_killed = false;
  std::string reason;  // human-readable detail
  std::string node;
};

// Called from the backend's own thread(s) when a sandbox changes (it exits,
// is OOM-killed, disappears). Must not block.
class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual void OnObserved(const BackendRef& ref, const Observed& observed) = 0;
};

// Receives a sandbox's output (bootstrap, daemon, worker stdout/stderr).
class LogSink {
 public:
  virtual ~LogSink() = default;
  // `offset` is the byte offset of data[0] in the sandbox's whole output;
  // `truncated` says bytes before it are no longer kept. Returning false
  // stops the stream.
  virtual bool OnLogData(int64_t offset, absl::string_view data,
                         bool truncated) = 0;
};

// The sandbox a warm-pool member is being handed to.
struct ClaimInfo {
  std::string sandbox_id;
  std::map<std::string, std::string> labels;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual absl::string_view name() const = 0;

  // Once, at start: what this machine lets the backend enforce.
  virtual absl::StatusOr<pb::BackendCapabilities> Probe() = 0;

  // No side effects. INVALID_ARGUMENT for a malformed spec (a bundle path
  // that is not a bundle, a bad image reference); FAILED_PRECONDITION for a
  // field this machine cannot enforce (memory without a writable memory
  // cgroup, GPU, egress lists, a foreign platform).
  virtual absl::Status Validate(const LaunchSpec& spec) const = 0;

  // Starts the sandbox and returns as soon as it is started (not ready).
  // Everything made is undone on failure. FAILED_PRECONDITION carries the
  // sandbox's output tail in the message when its entry point failed.
  virtual absl::StatusOr<BackendRef> Launch(const LaunchSpec& spec,
                                            absl::Time deadline) = 0;

  // The daemon's endpoint. UNAVAILABLE while it is not there yet (for the
  // local backend: the socket path is not yet a real socket); the controller
  // polls it together with the health check.
  virtual absl::StatusOr<pb::Endpoint> ResolveEndpoint(const BackendRef& ref) = 0;

  virtual absl::StatusOr<Observed> Inspect(const BackendRef& ref) = 0;

  // SIGTERM (or the engine's stop) then, after `grace`, kill everything;
  // remove every cgroup, mount, directory and container. Missing: OK.
  virtual absl::Status Destroy(const BackendRef& ref, absl::Duration grace) = 0;

  // Everything this backend finds on the machine that `instance` made,
  // whether or not the controller still knows it (restart recovery).
  virtual absl::StatusOr<std::vector<BackendRef>> ListOwned(
      absl::string_view instance) = 0;

  // Starts delivering exit/OOM/disappearance events to `sink` (which
  // outlives the backend's use of it) from the backend's own thread.
  virtual absl::Status Watch(EventSink* sink) = 0;

  // Writes the sandbox's output from `offset` to `sink`, then, with
  // `follow`, what comes later until the sandbox ends or the sink returns
  // false. Blocks the calling thread.
  virtual absl::Status StreamLogs(const BackendRef& ref, int64_t offset,
                                  bool follow, LogSink* sink) = 0;

  // The last `max_bytes` of the sandbox's output (for Exit.log_tail).
  virtual std::string LogTail(const BackendRef& ref, size_t max_bytes) = 0;

  // Records on the backend's side that the warm-pool member `ref` now
  // serves `claim` (Kubernetes: one PATCH of the Pod's labels with a
  // resourceVersion precondition, so two claimers cannot both win). Called
  // by the controller before it arms a claimed member. ABORTED: another
  // claimer won, leave the member alone and take the next; NOT_FOUND: the
  // member is gone. Backends whose pool bookkeeping is in-process only keep
  // the default.
  virtual absl::Status Claim(const BackendRef& ref, const ClaimInfo& claim) {
    (void)ref;
    (void)claim;
    return absl::OkStatus();
  }

  // Records on the backend's side that the sandbox `ref` now expires at
  // `expire` (ExtendSandbox; Kubernetes: one PATCH of the Pod's
  // agentix.dev/expire-time annotation). Called by the controller outside
  // its lock, after the record changed; the record stays the authority, so
  // a failure is logged, not returned to the client. Backends that keep no
  // expiry of their own keep the default.
  virtual absl::Status Extend(const BackendRef& ref, absl::Time expire) {
    (void)ref;
    (void)expire;
    return absl::OkStatus();
  }

  // Stops the backend's threads; no EventSink call after it returns.
  virtual void Shutdown() {}

  // Whether its sandboxes outlive providerd (containers, pods) so that a
  // restarted providerd may adopt them again (Inspect, ResolveEndpoint, the
  // daemon's health); false when they die with it (the local backend's,
  // under bubblewrap --die-with-parent), which a restart reports BACKEND_LOST.
  virtual bool SandboxesSurviveRestart() const { return false; }
};

}  // namespace agentix::providers
