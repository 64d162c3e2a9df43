// SandboxController: the provider service's domain, in plain C++ (no grpcpp).
// It owns the sandbox records and their state machine
// (PENDING -> STARTING -> READY -> TERMINATING -> TERMINATED), the journal
// that makes a restart lose nothing, request-id idempotency, the TTL/idle
// reaper, the watch hub and the warm pools. Backends only launch and
// destroy; the DaemonAgent checks readiness and arms sandboxes.
//
// Threading: every method may be called from any thread and never blocks on
// a sandbox. Long operations (create until READY, wait, delete until
// TERMINATED) complete through a callback, invoked exactly once, from a
// controller thread, possibly before the method returns. Callbacks must not
// block.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agentix/provider/v1/provider.pb.h"
#include "providers/backend.h"
#include "providers/core/daemon_agent.h"

namespace agentix::providers {

struct ControllerOptions {
  std::string instance = "providerd";  // ownership label; ListOwned key
  std::string state_dir;               // journal lives here
  std::string default_backend = "local";
  absl::Duration default_ttl = absl::Seconds(300);
  absl::Duration max_lifetime = absl::Hours(24);
  absl::Duration default_ready_timeout = absl::Seconds(120);
  absl::Duration retention = absl::Hours(1);       // terminal records kept
  absl::Duration request_id_retention = absl::Hours(1);
  absl::Duration default_delete_grace = absl::Seconds(2);
  int watch_history = 4096;                        // events kept for resume
  absl::Duration bookmark_interval = absl::Seconds(10);
  int max_sandboxes = 0;                           // 0: no limit
  // A warm pool's refill waits until no claim has come for this long (at
  // most 5x this after the first claim it waits for), so claims do not share
  // the CPU with members booting; never while a claim waits for a member.
  // Zero: refill at once.
  absl::Duration pool_refill_delay = absl::Milliseconds(50);
  std::string version;
};

// Counters and latency histograms for the Prometheus listener.
struct Histogram {
  std::vector<double> bounds_seconds;  // upper bounds, ascending
  std::vector<uint64_t> counts;        // per bucket (non-cumulative), +Inf last
  double sum_seconds = 0;
  uint64_t count = 0;
};
struct MetricsSnapshot {
  // {backend, phase name} -> count of records in that phase
  std::map<std::pair<std::string, std::string>, int64_t> sandboxes;
  // pool name -> {ready, creating, total}
  std::map<std::string, pb::WarmPoolStatus> pools;
  Histogram create_seconds;       // CreateSandbox to READY, cold
  Histogram acquire_seconds;      // CreateSandbox to READY, warm
  Histogram delete_seconds;       // DeleteSandbox to TERMINATED
  std::map<std::string, uint64_t> counters;  // e.g. "reaped_ttl",
      // "reaped_idle", "start_failures", "backend_lost", "replays",
      // "pool_claims", "pool_cold_fallbacks", "watch_relists"
};

// Receives watch events in resource-version order from a controller thread.
// Must not block; it may buffer. Returning false ends the subscription.
class WatchObserver {
 public:
  virtual ~WatchObserver() = default;
  virtual bool OnEvent(const pb::SandboxEvent& event) = 0;
};

class WatchHandle {
 public:
  virtual ~WatchHandle() = default;  // unsubscribes; no OnEvent after it returns
};

struct CreateResult {
  pb::Sandbox sandbox;
  std::string access_token;
  bool replayed = false;
};

class SandboxController {
 public:
  // Backends by name ("local", ...). Takes ownership.
  static absl::StatusOr<std::unique_ptr<SandboxController>> Create(
      ControllerOptions options,
      std::vector<std::unique_ptr<Backend>> backends,
      std::unique_ptr<DaemonAgent> agent);
  virtual ~SandboxController() = default;

  // Replays the journal, adopts again the READY sandboxes that survived the
  // restart (Inspect: running, and the daemon passes CheckReady; bounded to
  // a few seconds), marks those that did not BACKEND_LOST,
  // destroys every owned leftover the journal does not keep, probes the
  // backends and starts the reaper and the pools.
  virtual absl::Status Start() = 0;
  // New creates are refused (UNAVAILABLE); pool members are destroyed;
  // with `destroy_all`, every sandbox too.
  virtual void Shutdown(bool destroy_all) = 0;

  using CreateCallback = std::function<void(absl::StatusOr<CreateResult>)>;
  // The request's own request_id, or `idempotency_key` (metadata alias)
  // when that is empty.
  virtual void CreateSandbox(const pb::CreateSandboxRequest& request,
                             std::string idempotency_key,
                             CreateCallback done) = 0;
  virtual absl::StatusOr<pb::Sandbox> GetSandbox(const std::string& id) = 0;
  virtual absl::StatusOr<pb::Credentials> GetCredentials(
      const std::string& id) = 0;
  virtual absl::StatusOr<pb::ListSandboxesResponse> ListSandboxes(
      const pb::ListSandboxesRequest& request) = 0;
  // OUT_OF_RANGE when (epoch, resource_version) cannot be resumed.
  virtual absl::StatusOr<std::unique_ptr<WatchHandle>> Watch(
      const pb::WatchSandboxesRequest& request, WatchObserver* observer) = 0;
  using WaitCallback = std::function<void(absl::StatusOr<pb::WaitSandboxResponse>)>;
  virtual void WaitSandbox(const pb::WaitSandboxRequest& request,
                           WaitCallback done) = 0;
  virtual absl::StatusOr<pb::Sandbox> ExtendSandbox(
      const pb::ExtendSandboxRequest& request) = 0;
  using DeleteCallback = std::function<void(absl::StatusOr<pb::Sandbox>)>;
  virtual void DeleteSandbox(const pb::DeleteSandboxRequest& request,
                             DeleteCallback done) = 0;
  // Blocks the calling thread (run it on a thread of the adapter's own).
  virtual absl::Status StreamLogs(const pb::StreamSandboxLogsRequest& request,
                                  LogSink* sink) = 0;

  virtual absl::StatusOr<pb::WarmPool> CreateWarmPool(const pb::WarmPool& pool) = 0;
  virtual absl::StatusOr<pb::WarmPool> UpdateWarmPool(const pb::WarmPool& pool) = 0;
  virtual absl::StatusOr<pb::WarmPool> GetWarmPool(const std::string& name) = 0;
  virtual std::vector<pb::WarmPool> ListWarmPools() = 0;
  virtual absl::Status DeleteWarmPool(const std::string& name,
                                      bool allow_missing) = 0;

  virtual pb::Capabilities GetCapabilities() = 0;
  virtual MetricsSnapshot Metrics() = 0;
};

}  // namespace agentix::providers
