// Providerd: agentix-providerd put together (the binary only parses flags):
// the state directory and its lock, the backends, the daemon agent, the
// SandboxController, the gRPC server (ProviderService, grpc.health.v1,
// reflection) on every --listen address, and the optional metrics listener;
// and the graceful stop. A library so tests can run the whole service in
// process with fake backends.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "auth/server_auth.h"
#include "base/unique_fd.h"
#include "providers/backend.h"
#include "providers/core/controller.h"
#include "providers/core/daemon_agent.h"
#include "providers/service/metrics_http.h"
#include "providers/service/provider_service.h"

namespace agentix::providers {

// The local backend's settings as providerd's flags give them.
struct LocalFlags {
  std::string bwrap = "bwrap";
  int64_t pids_max = 1024;
  int64_t memory_bytes = 0;
  int64_t tmp_bytes = int64_t{1} << 30;
  int64_t run_bytes = int64_t{16} << 20;
  int64_t shm_bytes = int64_t{64} << 20;
  int64_t log_max_bytes = int64_t{16} << 20;
  bool seccomp = true;
  bool require_limits = true;
  std::string cgroup_root = "/sys/fs/cgroup";
  std::string cgroup_parent = "agentix";
  std::vector<std::string> extra_bwrap_args;
};

// The container engines to serve, each only when its socket is given.
struct EngineFlags {
  std::string docker_socket;  // --docker-socket
  std::string podman_socket;  // --podman-socket
};

// The Kubernetes backend's settings as providerd's flags give them. The
// backend is added when `kubeconfig` is set or `in_cluster` is true.
struct KubernetesFlags {
  std::string kubeconfig;    // a kubeconfig file
  std::string context;       // empty: its current-context
  bool in_cluster = false;   // the Pod's service account instead
  std::string ns;            // empty: the context's / service account's
  int runtime_port = 50051;  // the daemon's port inside the Pod
};

struct ProviderdConfig {
  // gRPC addresses: "unix:///abs/path" or "HOST:PORT" (port 0 picks one).
  // Empty: DefaultSocketPath(), whose directory is made owner-only.
  std::vector<std::string> listen;
  // Empty: DefaultStateDir().
  std::string state_dir;
  // state_dir is set from the above.
  ControllerOptions controller;
  LocalFlags local;
  // Backends "docker" / "podman" (spec.backend), their run dirs under
  // <state_dir>/dk and <state_dir>/pm.
  EngineFlags engines;
  KubernetesFlags kubernetes;
  ProviderServiceOptions service;
  bool destroy_on_exit = true;
  // "HOST:PORT" of the metrics listener; empty: none.
  std::string metrics_listen;
  // Instead of the local backend / the gRPC daemon agent (tests).
  std::function<absl::StatusOr<std::vector<std::unique_ptr<Backend>>>(
      const std::string& sandbox_dir)>
      make_backends;
  std::function<std::unique_ptr<DaemonAgent>()> make_agent;
};

// Longest state directory: the local backend keeps each sandbox's socket at
// <state_dir>/sb/<63-char id>/run/agentix.sock, within sun_path's 107 bytes.
inline constexpr size_t kMaxStateDirBytes = 22;

// $XDG_RUNTIME_DIR/agentix/providerd.sock when XDG_RUNTIME_DIR is set and
// is a directory, else /tmp/agentix-<uid>/providerd.sock.
std::string DefaultSocketPath();
// /var/tmp/agx-<uid>: short (kMaxStateDirBytes), survives providerd
// restarts.
std::string DefaultStateDir();
// "1024", "64k", "16m", "2g", "1t" (powers of 1024; a trailing "b"/"ib" is
// accepted) -> bytes. InvalidArgument otherwise.
absl::StatusOr<int64_t> ParseByteSize(absl::string_view text);

class Providerd {
 public:
  // Everything up to serving. FailedPrecondition when another providerd
  // holds the state directory or a socket path, or a directory is not
  // owner-only; InvalidArgument for bad config; Unavailable when an address
  // cannot be bound.
  // `security`: the token (checked on every RPC: by the service's handlers
  // for ProviderService, so its UNAUTHENTICATED has a reason, by gRPC's auth
  // filter for health and reflection) and TLS.
  static absl::StatusOr<std::unique_ptr<Providerd>> Start(
      ProviderdConfig config, auth::ServerSecurityOptions security);
  // Stop(), if not done.
  ~Providerd();

  Providerd(const Providerd&) = delete;
  Providerd& operator=(const Providerd&) = delete;

  // Graceful stop: health says NOT_SERVING; the controller refuses new
  // creates and (with destroy_on_exit) destroys every sandbox; calls still
  // open get up to 5 s; the sockets are removed. Idempotent.
  void Stop();

  // The listen addresses as served (ports chosen by the system filled in).
  const std::vector<std::string>& addresses() const { return addresses_; }
  int metrics_port() const { return metrics_ ? metrics_->port() : 0; }
  SandboxController* controller() { return controller_.get(); }

 private:
  Providerd() = default;

  ProviderdConfig config_;
  std::vector<base::UniqueFd> locks_;  // flock()ed while serving
  std::vector<std::string> socket_paths_;
  std::vector<std::string> addresses_;
  std::unique_ptr<SandboxController> controller_;
  std::unique_ptr<ProviderServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<MetricsHttpServer> metrics_;
  // Keeps grpc++'s callback threads awake while idle (KeepCallbackThreadsAwake).
  absl::Notification stop_ticks_;
  std::thread ticker_;
  bool stopped_ = false;

  void KeepCallbackThreadsAwake(std::shared_ptr<grpc::Channel> self,
                                std::string token);
};

}  // namespace agentix::providers
