// agentix-providerd: the provider service. Parses flags, builds the local
// backend, the daemon agent and the SandboxController, serves
// agentix.provider.v1.ProviderService (plus grpc.health.v1 and reflection)
// and, optionally, Prometheus metrics, until SIGTERM/SIGINT.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "auth/server_auth.h"
#include "base/flags.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "base/unique_fd.h"
#include "providers/core/controller.h"
#include "providers/providerd.h"
#include "providers/service/metrics_http.h"
#include "providers/service/metrics_text.h"
#include "providers/service/provider_service.h"

ABSL_FLAG(std::string, state_dir, "",
          "directory of the journal (sandboxes and request ids survive a "
          "restart through it) and of the local sandboxes' directories, "
          "which hold their sockets: keep it short (at most 22 bytes, "
          "unix socket paths are limited to 107). Default /var/tmp/agx-<uid>");
ABSL_FLAG(std::string, instance, "providerd",
          "this providerd's name: sandboxes are labelled with it, and on "
          "start every leftover sandbox of this instance the journal does "
          "not keep is destroyed");
ABSL_FLAG(std::string, token_file, "",
          "file holding the bearer token every RPC (health and reflection "
          "too) must carry as 'authorization: Bearer <token>' (mode 0600; "
          "none: no token check). There is no environment variable: "
          "sandboxes inherit providerd's environment");
ABSL_FLAG(std::string, tls_cert, "", "PEM server certificate (chain) for TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: require client certificates it signed (mutual TLS)");
ABSL_FLAG(std::string, metrics_listen, "",
          "HOST:PORT for Prometheus metrics (GET /metrics, plain HTTP, no "
          "token: bind it to a trusted interface); empty: no listener");
ABSL_FLAG(int64_t, default_ttl_s, 300,
          "lifetime of a sandbox whose spec sets no ttl, in seconds");
ABSL_FLAG(int64_t, max_lifetime_s, 86400,
          "largest ttl a spec or ExtendSandbox may ask for, in seconds "
          "(above: INVALID_ARGUMENT TTL_ABOVE_MAX_LIFETIME)");
ABSL_FLAG(int64_t, ready_timeout_s, 120,
          "how long a create waits for READY when the request sets no "
          "ready_timeout, in seconds");
ABSL_FLAG(int64_t, retention_s, 3600,
          "how long TERMINATED records stay visible to Get/List/Wait, in "
          "seconds");
ABSL_FLAG(int64_t, max_sandboxes, 0,
          "live sandboxes at once, pool members included (0: no limit; "
          "beyond: RESOURCE_EXHAUSTED QUOTA_EXCEEDED)");
ABSL_FLAG(int64_t, pool_refill_delay_ms, 50,
          "a warm pool starts refill members once no claim has come for this "
          "many milliseconds (at most 5x this after the first claim waiting "
          "for it; at once while a claim waits for a member), so claims do "
          "not share the CPU with booting members; 0: refill at once");
ABSL_FLAG(bool, destroy_on_exit, true,
          "on SIGTERM/SIGINT destroy every sandbox (they die with providerd "
          "anyway: bubblewrap --die-with-parent); false keeps only the "
          "journal's records, whose sandboxes a restart reports "
          "BACKEND_LOST");
ABSL_FLAG(int, ready_fd, -1,
          "after the server listens, write one byte to this inherited fd and "
          "close it (for a parent waiting on a pipe)");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");
ABSL_FLAG(std::string, bwrap, "bwrap",
          "bubblewrap binary of the local backend (a name is looked up on "
          "PATH)");
ABSL_FLAG(int64_t, local_pids_max, 1024,
          "local backend: pids.max of a sandbox whose spec sets none (0: no "
          "default)");
ABSL_FLAG(std::string, local_memory, "0",
          "local backend: memory limit of a sandbox whose spec sets none, "
          "e.g. 2g (0: none)");
ABSL_FLAG(std::string, local_tmp_size, "1g",
          "local backend: size of a sandbox's /tmp tmpfs when its spec sets "
          "no scratch_bytes");
ABSL_FLAG(std::string, local_run_size, "16m",
          "local backend: size of a sandbox's /run tmpfs");
ABSL_FLAG(std::string, local_shm_size, "64m",
          "local backend: size of a sandbox's /dev/shm tmpfs");
ABSL_FLAG(std::string, local_log_max_bytes, "16m",
          "local backend: cap on a sandbox's kept output (older output is "
          "dropped; StreamSandboxLogs reports it as truncated)");
ABSL_FLAG(bool, local_seccomp, true,
          "local backend: install the seccomp filter in every sandbox");
ABSL_FLAG(bool, local_require_limits, true,
          "local backend: refuse (FAILED_PRECONDITION LIMIT_NOT_ENFORCEABLE) "
          "a spec asking for a limit this machine cannot enforce; false: "
          "log it and go on without the limit");
ABSL_FLAG(std::string, local_cgroup_root, "/sys/fs/cgroup",
          "local backend: where the cgroup v1 controllers are mounted");
ABSL_FLAG(std::string, local_cgroup_parent, "agentix",
          "local backend: the cgroup made under providerd's own one of each "
          "controller, holding one cgroup per sandbox");
ABSL_FLAG(std::string, kubernetes_kubeconfig, "",
          "Adds the kubernetes backend: the kubeconfig file (its current-context, or "
          "--kubernetes-context) with the API server, its CA and the credentials");
ABSL_FLAG(std::string, kubernetes_context, "",
          "The kubeconfig context to use; empty: its current-context");
ABSL_FLAG(bool, kubernetes_in_cluster, false,
          "Adds the kubernetes backend using this Pod's service account "
          "(/var/run/secrets/kubernetes.io/serviceaccount, KUBERNETES_SERVICE_HOST/PORT)");
ABSL_FLAG(std::string, kubernetes_namespace, "",
          "Namespace of the sandbox Pods; empty: the context's or service account's");
ABSL_FLAG(int32_t, kubernetes_runtime_port, 50051,
          "The daemon's port inside a sandbox Pod (the endpoint is podIP:port)");

ABSL_FLAG(std::string, docker_socket, "",
          "serve backend \"docker\" (spec.backend) over the Docker Engine API "
          "on this Unix socket, e.g. /run/docker.sock or /var/run/docker.sock; "
          "empty: no docker backend. Its run dirs live under <state-dir>/dk. "
          "An engine not answering at start does not stop providerd: its "
          "creates are UNAVAILABLE ENGINE_UNAVAILABLE until it does");
ABSL_FLAG(std::string, podman_socket, "",
          "serve backend \"podman\" over podman's Docker-compatible API on "
          "this Unix socket, e.g. $XDG_RUNTIME_DIR/podman/podman.sock or "
          "/run/podman/podman.sock (`podman system service`); empty: no "
          "podman backend. Its run dirs live under <state-dir>/pm");

namespace agentix::providers {
namespace {

constexpr char kVersion[] = "0.3.0";
constexpr char kListenFlag[] = "--listen";
// Repeatable too: one extra bubblewrap argument each (before the entry
// point), for what the local backend does not model.
constexpr char kExtraBwrapArgFlag[] = "--local-extra-bwrap-arg";

absl::StatusOr<auth::ServerSecurityOptions> LoadSecurity() {
  auth::ServerSecurityOptions security;
  if (!absl::GetFlag(FLAGS_token_file).empty()) {
    AGX_ASSIGN_OR_RETURN(security.token,
                         auth::LoadToken(absl::GetFlag(FLAGS_token_file),
                                         nullptr));
  }
  for (auto [flag, value, pem] :
       {std::tuple{"--tls-cert", absl::GetFlag(FLAGS_tls_cert),
                   &security.tls_cert_pem},
        std::tuple{"--tls-key", absl::GetFlag(FLAGS_tls_key),
                   &security.tls_key_pem},
        std::tuple{"--tls-client-ca", absl::GetFlag(FLAGS_tls_client_ca),
                   &security.tls_client_ca_pem}}) {
    if (value.empty()) continue;
    AGX_ASSIGN_OR_RETURN(*pem, auth::ReadPemFile(value, flag));
  }
  security.denied_message =
      "missing or wrong bearer token: send 'authorization: Bearer <token>' "
      "(ServiceProvider(address, token=...))";
  AGX_LOG(Info, "security: {}, {}",
          security.tls_cert_pem.empty()
              ? "plaintext"
              : (security.tls_client_ca_pem.empty() ? "TLS" : "mutual TLS"),
          security.token.empty() ? "no token check" : "bearer token required");
  // Checked now, so that a bad certificate is reported before anything
  // else starts.
  AGX_RETURN_IF_ERROR(auth::MakeServerCredentials(security).status());
  return security;
}

absl::StatusOr<int64_t> SizeFlag(absl::string_view flag,
                                 const std::string& value) {
  absl::StatusOr<int64_t> bytes = ParseByteSize(value);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", value, ": ", bytes.status().message()));
  }
  return bytes;
}

absl::StatusOr<ProviderdConfig> ConfigFromFlags(std::vector<std::string> listen) {
  ProviderdConfig config;
  config.listen = std::move(listen);
  config.state_dir = absl::GetFlag(FLAGS_state_dir);
  config.controller.instance = absl::GetFlag(FLAGS_instance);
  config.controller.version = kVersion;
  for (auto [flag, value, out] :
       {std::tuple{"default-ttl-s", absl::GetFlag(FLAGS_default_ttl_s),
                   &config.controller.default_ttl},
        std::tuple{"max-lifetime-s", absl::GetFlag(FLAGS_max_lifetime_s),
                   &config.controller.max_lifetime},
        std::tuple{"ready-timeout-s", absl::GetFlag(FLAGS_ready_timeout_s),
                   &config.controller.default_ready_timeout},
        std::tuple{"retention-s", absl::GetFlag(FLAGS_retention_s),
                   &config.controller.retention}}) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " must be positive, not ", value));
    }
    *out = absl::Seconds(value);
  }
  if (config.controller.default_ttl > config.controller.max_lifetime) {
    return absl::InvalidArgumentError(
        "--default-ttl-s must not exceed --max-lifetime-s");
  }
  if (absl::GetFlag(FLAGS_max_sandboxes) < 0) {
    return absl::InvalidArgumentError("--max-sandboxes must not be negative");
  }
  config.controller.max_sandboxes =
      static_cast<int>(absl::GetFlag(FLAGS_max_sandboxes));
  if (absl::GetFlag(FLAGS_pool_refill_delay_ms) < 0 ||
      absl::GetFlag(FLAGS_pool_refill_delay_ms) > 60000) {
    return absl::InvalidArgumentError(
        "--pool-refill-delay-ms must be between 0 and 60000");
  }
  config.controller.pool_refill_delay =
      absl::Milliseconds(absl::GetFlag(FLAGS_pool_refill_delay_ms));
  config.destroy_on_exit = absl::GetFlag(FLAGS_destroy_on_exit);
  config.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);

  config.engines.docker_socket = absl::GetFlag(FLAGS_docker_socket);
  config.engines.podman_socket = absl::GetFlag(FLAGS_podman_socket);

  LocalFlags& local = config.local;
  local.bwrap = absl::GetFlag(FLAGS_bwrap);
  local.pids_max = absl::GetFlag(FLAGS_local_pids_max);
  local.cgroup_root = absl::GetFlag(FLAGS_local_cgroup_root);
  local.cgroup_parent = absl::GetFlag(FLAGS_local_cgroup_parent);
  local.seccomp = absl::GetFlag(FLAGS_local_seccomp);
  local.require_limits = absl::GetFlag(FLAGS_local_require_limits);
  AGX_ASSIGN_OR_RETURN(local.memory_bytes,
                       SizeFlag("local-memory", absl::GetFlag(FLAGS_local_memory)));
  AGX_ASSIGN_OR_RETURN(local.tmp_bytes, SizeFlag("local-tmp-size",
                                                 absl::GetFlag(FLAGS_local_tmp_size)));
  AGX_ASSIGN_OR_RETURN(local.run_bytes, SizeFlag("local-run-size",
                                                 absl::GetFlag(FLAGS_local_run_size)));
  AGX_ASSIGN_OR_RETURN(local.shm_bytes, SizeFlag("local-shm-size",
                                                 absl::GetFlag(FLAGS_local_shm_size)));
  AGX_ASSIGN_OR_RETURN(
      local.log_max_bytes,
      SizeFlag("local-log-max-bytes", absl::GetFlag(FLAGS_local_log_max_bytes)));
  KubernetesFlags& k8s = config.kubernetes;
  k8s.kubeconfig = absl::GetFlag(FLAGS_kubernetes_kubeconfig);
  k8s.context = absl::GetFlag(FLAGS_kubernetes_context);
  k8s.in_cluster = absl::GetFlag(FLAGS_kubernetes_in_cluster);
  k8s.ns = absl::GetFlag(FLAGS_kubernetes_namespace);
  k8s.runtime_port = absl::GetFlag(FLAGS_kubernetes_runtime_port);
  if (!k8s.kubeconfig.empty() && k8s.in_cluster) {
    return absl::InvalidArgumentError(
        "--kubernetes-kubeconfig and --kubernetes-in-cluster exclude each other");
  }
  if (k8s.runtime_port <= 0 || k8s.runtime_port > 65535) {
    return absl::InvalidArgumentError("--kubernetes-runtime-port must be in 1..65535");
  }
  if (local.pids_max < 0) {
    return absl::InvalidArgumentError("--local-pids-max must not be negative");
  }
  return config;
}

// Writes one byte to --ready-fd and closes it.
void SignalReady(int fd) {
  if (fd < 0) return;
  const char byte = '1';
  if (::write(fd, &byte, 1) != 1) {
    AGX_LOG(Warning, "--ready-fd {}: {}", fd, std::strerror(errno));
  }
  ::close(fd);
}

int Run(int argc, char** raw_argv) {
  std::vector<std::string> listen =
      base::ExtractRepeatedFlag(kListenFlag, argc, raw_argv);
  std::vector<std::string> extra_bwrap_args =
      base::ExtractRepeatedFlag(kExtraBwrapArgFlag, argc, raw_argv);
  std::vector<std::string> storage;
  std::vector<char*> normalized =
      base::NormalizeFlagNames(argc, raw_argv, storage);
  char** argv = normalized.data();
  absl::SetProgramUsageMessage(
      "agentix-providerd [--listen ADDRESS ...] [--state-dir DIR] "
      "[--token-file FILE] [--metrics-listen HOST:PORT] [flags]\n\n"
      "Serves agentix.provider.v1.ProviderService (with grpc.health.v1 and "
      "reflection): creates, watches and deletes sandboxes (bubblewrap on "
      "this machine; docker/podman containers with --docker-socket / "
      "--podman-socket) and keeps warm pools. Prints 'agentix-providerd serving "
      "on ADDRESS[, ...]' on stdout once listening.\n\n"
      "  --listen ADDRESS  unix:///abs/path.sock or HOST:PORT (port 0: any "
      "free one); repeatable; unix sockets are made mode 0600. Default: "
      "unix://$XDG_RUNTIME_DIR/agentix/providerd.sock, else "
      "unix:///tmp/agentix-<uid>/providerd.sock (directory made 0700).\n"
      "  --local-extra-bwrap-arg ARG  one more bubblewrap argument (before "
      "the entry point); repeatable.");
  // --help lists this file's flags (absl's default looks for a file named
  // like the binary, which ours is not).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "providers/providerd_main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  usage.version_string = [] { return absl::StrCat("agentix-providerd ", kVersion, "\n"); };
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  base::SetLogTag("agentix-providerd");
  base::SetMinLogSeverity(base::ParseLogSeverity(absl::GetFlag(FLAGS_log_level)));

  absl::StatusOr<ProviderdConfig> config = ConfigFromFlags(std::move(listen));
  if (config.ok()) config->local.extra_bwrap_args = std::move(extra_bwrap_args);
  if (!config.ok()) {
    AGX_LOG(Error, "{}", std::string(config.status().message()));
    return 2;
  }
  absl::StatusOr<auth::ServerSecurityOptions> security = LoadSecurity();
  if (!security.ok()) {
    AGX_LOG(Error, "{}", std::string(security.status().message()));
    return 2;
  }

  // Signals are taken synchronously by this thread; block them before any
  // thread starts so none of those receives them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  absl::StatusOr<std::unique_ptr<Providerd>> providerd =
      Providerd::Start(*std::move(config), *std::move(security));
  if (!providerd.ok()) {
    AGX_LOG(Error, "{}", std::string(providerd.status().message()));
    return providerd.status().code() == absl::StatusCode::kInvalidArgument ||
                   providerd.status().code() ==
                       absl::StatusCode::kFailedPrecondition
               ? 2
               : 1;
  }
  std::printf("agentix-providerd serving on %s\n",
              absl::StrJoin((*providerd)->addresses(), ", ").c_str());
  std::fflush(stdout);
  SignalReady(absl::GetFlag(FLAGS_ready_fd));

  int received = 0;
  sigwait(&signals, &received);
  AGX_LOG(Info, "received signal {}; shutting down", received);
  (*providerd)->Stop();
  providerd->reset();
  AGX_LOG(Info, "stopped");
  return 0;
}

}  // namespace
}  // namespace agentix::providers

int main(int argc, char** argv) {
  // Not dumpable: other processes of the same uid cannot ptrace this one or
  // read its memory (every sandbox's token is in it).
  ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  return agentix::providers::Run(argc, argv);
}
