// agentix-sandboxd: the gRPC server inside a sandbox. Parses flags, builds
// the session manager and the services, serves until SIGTERM/SIGINT.
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/cpu_affinity.h"
#include "base/flags.h"
#include "base/status_macros.h"
#include "base/log.h"
#include "base/malloc_tuning.h"
#include "base/mutex_tuning.h"
#include "sandbox/adopted_worker.h"
#include "sandbox/admin_service.h"
#include "sandbox/auth.h"
#include "sandbox/calls_cpu.h"
#include "sandbox/daemon_worker_args.h"
#include "sandbox/placement_probe.h"
#include "sandbox/placement_prober.h"
#include "sandbox/connection_guard.h"
#include "sandbox/direct_connections.h"
#include "sandbox/direct_orphan_timer.h"
#include "sandbox/frame_wire_server.h"
#include "sandbox/grpc_executor.h"
#include "sandbox/health_service.h"
#include "sandbox/reflection_service.h"
#include "sandbox/runtime_service.h"
#include "sandbox/server_stream.h"
#include "sandbox/session_manager.h"
#include "sandbox/socket_path.h"

ABSL_FLAG(std::string, venv, "",
          "virtualenv whose site-packages the worker imports from");
ABSL_FLAG(std::string, python_path, "",
          "extra import roots for the worker, ':'-separated");
ABSL_FLAG(std::string, python_home, "",
          "stdlib prefix for the worker (holds lib/python3.11), passed on as "
          "its --python-home; a bundle's bootstrap.sh sets it");
ABSL_FLAG(std::string, worker, "",
          "agentix-worker binary (default: next to this binary, or "
          "../worker/agentix-worker as in bazel-bin)");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");
ABSL_FLAG(uint64_t, max_payload_bytes, uint64_t{1} << 30,
          "largest accepted encoded arguments of one call");
ABSL_FLAG(uint64_t, max_retained_results,
          agentix::sandbox::kMaxRetainedResultsByDefault,
          "finished, unacknowledged results kept for resume");
ABSL_FLAG(int, finished_ids_shard_bits,
          agentix::sandbox::FinishedIds::kShardBits,
          "the ids of finished calls remembered for at-most-once after a "
          "reconnect are kept in 2^N hash sets, so that a set's growth (under "
          "the session lock, on a call's path) moves few of them; 0: one set "
          "(as before stop 34); 0-12");
ABSL_FLAG(bool, acks_after_starts, false,
          "a host message of the previous calls' acks and new StartCalls "
          "sends the starts to the worker before it applies the acks (frees "
          "the results, remembers the ids), off the new calls' path; off by "
          "default: slower in the quiet A/B of stop 36 (docs/DECISIONS.md)");
ABSL_FLAG(uint64_t, max_retained_bytes, uint64_t{512} << 20,
          "total size of finished, unacknowledged results kept for resume "
          "(oldest evicted first; the newest is always kept)");
ABSL_FLAG(uint64_t, log_buffer_records, 10000,
          "sandbox log records kept for hosts that have not received them "
          "(oldest dropped first, with a warning record)");
ABSL_FLAG(uint64_t, trace_buffer_events, 10000,
          "sandbox trace events kept for hosts that have not received them "
          "(oldest dropped first, reported on the log stream)");
ABSL_FLAG(bool, prestart_worker, false,
          "start the worker with the daemon instead of on the first call "
          "(bundles do: its start then overlaps the host's readiness wait; "
          "with --admin-token-file, also a warm sandbox's wait for its "
          "claim)");
ABSL_FLAG(std::string, adopt_worker, "",
          "set by agentix-launch, which started the worker before it exec'd "
          "this daemon: pid=P,id=ID,channel=N,stderr=N[,payload=N] names that "
          "worker (a child of this process) and its fds; the daemon adopts it "
          "as its prestarted worker (needs --prestart_worker). Later workers "
          "(after a crash) are spawned as usual");
ABSL_FLAG(uint64_t, max_concurrent_calls, 0,
          "calls running at once (0: no limit); more wait in a queue");
ABSL_FLAG(uint64_t, max_queued_calls, 10000,
          "calls waiting for a slot; beyond, calls fail with TooManyCalls "
          "(RESOURCE_EXHAUSTED)");
ABSL_FLAG(uint64_t, max_namespace_streams, 256,
          "plugin-namespace streams open at once (RESOURCE_EXHAUSTED beyond)");
ABSL_FLAG(std::string, token_file, "",
          "file holding the bearer token every RPC must carry "
          "(mode 0600; default: $AGENTIX_TOKEN; neither: no token check; an "
          "empty or blank file or $AGENTIX_TOKEN is refused)");
ABSL_FLAG(std::string, admin_token_file, "",
          "activation mode, for warm pools: file (mode 0600, or a pipe such "
          "as /proc/self/fd/N, read to EOF) holding the admin token. The "
          "daemon starts unarmed: it serves agentix.runtime.v1.SandboxAdmin "
          "and grpc.health.v1 to that token, and answers every runtime RPC "
          "FAILED_PRECONDITION until SandboxAdmin.Activate gives it the "
          "runtime token (and the worker's env); then runtime RPCs need that "
          "token. Excludes --token-file and $AGENTIX_TOKEN; with "
          "--prestart-worker the worker boots before activation (running no "
          "user code) and Activate sets its env in the running worker, or "
          "replaces the worker for start-up-only variables (LD_*, PYTHON*, "
          "LC_*, ...)");
ABSL_FLAG(uint64_t, max_connections, 1024,
          "connections open at once, authenticated or not; more are closed "
          "at accept (the open-file soft limit is raised to fit, up to the "
          "hard limit; the cap is lowered to that limit less 64)");
ABSL_FLAG(uint64_t, max_unauthenticated_connections_per_peer, 64,
          "connections from one IP address that have not made an "
          "authenticated RPC yet (all Unix-socket peers count as one); more "
          "are closed at accept");
ABSL_FLAG(double, auth_timeout_s, 10,
          "seconds a connection may stay open without making an "
          "authenticated RPC (any RPC without a token check); then it is "
          "shut down (a frame-wire connection needs an accepted HELLO and "
          "gets STATUS 4 at three quarters of this)");
ABSL_FLAG(std::string, tls_cert, "", "PEM server certificate (chain) for TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: require client certificates it signed (mutual TLS)");
ABSL_FLAG(uint64_t, payload_ring_bytes, agentix::ipc::kDefaultRingBytes,
          "bytes per shared-memory payload ring between the daemon and its "
          "worker (two per worker; pages are allocated on first use); 0 "
          "sends every payload through the worker's socketpair");
ABSL_FLAG(int64_t, grpc_spin_us, 0,
          "microseconds the gRPC reaction thread polls without sleeping after "
          "each completion before it blocks (adaptive: halved after a long "
          "wait); saves its wake-ups on a busy stream at the cost of CPU. "
          "0 (default): no spinning");
ABSL_FLAG(int64_t, worker_read_spin_us, 0,
          "microseconds the worker-reader thread polls the worker's channel "
          "without sleeping after each read before it blocks (adaptive, as "
          "--grpc_spin_us). 0 (default): no spinning");
ABSL_FLAG(bool, grpc_inline_executor, false,
          "run gRPC's default executor inline (no executor thread): the "
          "thread holding a connection finishes its queued work itself "
          "instead of handing it to another thread (0.5-1.4 wake-ups fewer "
          "per call; sandbox/grpc_executor.h). Off by default until its "
          "effect on throughput is measured on a quiet machine");
ABSL_FLAG(int, worker_ready_timeout_s, 15,
          "seconds a starting worker may take to become ready");
ABSL_FLAG(double, upload_idle_timeout_s, 60,
          "seconds a call's announced arguments may stop arriving before it "
          "fails with UploadTimeout (DEADLINE_EXCEEDED) and they are freed");
ABSL_FLAG(double, stalled_host_timeout_s, 20,
          "while more than --max-retained-bytes of results wait unwritten "
          "(the worker's output is then paused), seconds without progress "
          "before the most backlogged Calls stream is ended "
          "(RESOURCE_EXHAUSTED; its calls stay retained for a resume)");
ABSL_FLAG(std::string, health_listen, "",
          "HOST:PORT (or unix:///abs/path) of a second, plaintext server "
          "that serves grpc.health.v1 alone, without a token: what a "
          "Kubernetes gRPC probe dials (the kubelet can send neither a token "
          "nor a client certificate). It reports \"\" and "
          "agentix.runtime.v1.RuntimeService SERVING while the daemon runs, "
          "armed or not; every other service is UNIMPLEMENTED there (grpc++'s "
          "server reflection lists only the health service)");
ABSL_FLAG(bool, direct_calls, agentix::sandbox::kDirectCallsByDefault,
          "direct calls (docs/DIRECT-CALLS.md; on by default since stop 43, "
          "--nodirect_calls relays every call): a frame-wire Calls connection "
          "(and a Namespace stream after its open) whose HELLO has "
          "agentix-direct: 1 is handed to the worker after HELLO (the socket, "
          "its payload ring, the bytes read past HELLO) when the worker "
          "advertises the capability and the connection is eligible; else it "
          "is relayed as without the flag. At most min(--max_connections, "
          "256) are handed over at once; they count against "
          "--max_connections until the worker reports them closed");
ABSL_FLAG(int32_t, direct_orphan_s, 30,
          "with --direct_calls: a client whose last handed-over connection "
          "closed and none came back within this many seconds has its "
          "calls taken back from the worker (collapsed), so the daemon's "
          "retention bounds and GetStatus see them (at least 1)");
ABSL_FLAG(bool, calls_socket, agentix::sandbox::kCallsSocketByDefault,
          "for each --listen unix:///PATH also listen on PATH.calls (mode "
          "0600, removed on exit): the frame wire, the Calls stream over a "
          "plain Unix socket, which the Python host uses when it finds it "
          "(docs/FRAME-WIRE.md); same token, limits and semantics as gRPC's "
          "Calls, fewer thread hand-offs per call. gRPC stays the wire for "
          "everything else. --nocalls_socket: gRPC only");
ABSL_FLAG(std::string, calls_cpu, agentix::sandbox::kCallsCpuByDefault,
          "while calls come one at a time, the threads that wait for the "
          "next frame on the call path (the frame wire's connection threads, "
          "the worker reader and writer, and the worker's thread while it "
          "waits for a call; never user code) run on one CPU, so a "
          "sequential call's hand-offs are context switches instead of "
          "waking an idle CPU; unpinned while calls overlap (several results "
          "in one read from the worker) until 64 reads with one result each, "
          "and for a back-off period (1 s, doubling up to 64 s) when the run "
          "queue wait per call passes 40 us (the CPU is busy with others). "
          "\"auto\": the CPU the latest Calls frame-wire host "
          "names in HELLO (agentix-calls-cpu) if the daemon may use it, else "
          "the one the worker reader runs on when it pins; a number: that "
          "CPU; \"off\" or \"\": nothing is pinned; \"probe\" (default since "
          "stop 32): a start-up "
          "measurement (~60-130 ms, on a thread of its own; calls run unpinned "
          "until it ends) chooses between auto with the hosts' pinned waits "
          "(two or more CPUs idle, and a round trip on one CPU saves more "
          "than ~4 sched_setaffinity against one across two) and "
          "auto alone (frame-wire hosts that ask are told not to pin their "
          "waits; off with one CPU), and logs its figures and choice at info "
          "level; measured again in the call path's pauses "
          "(--calls_cpu_reprobe_s) (sandbox/calls_cpu.h, sandbox/placement_probe.h; "
          "docs/FRAME-WIRE.md, \"Wake-ups\")");
ABSL_FLAG(double, calls_cpu_reprobe_s, 60,
          "with --calls_cpu=probe: seconds between the probe's measurements "
          "after the start-up one (at most one per period, the first as soon "
          "as 1 s after the start-up one; only in a pause of "
          "the call path: no call running for 0.1 s after one ended since the "
          "last probe began, no worker booting); a changed choice applies to the "
          "daemon at once and reaches the frame-wire hosts that asked for "
          "changes (agentix-calls-cpu-follow: 2) with their next frame. 0: "
          "the start-up probe only");
ABSL_FLAG(int64_t, calls_cpu_probe_wait_ms, 1000,
          "with --calls_cpu=probe: the start-up probe waits, at most this "
          "long, until no worker boots and no call runs or waits (a "
          "prestarted worker's boot, then the first calls), so that its two "
          "busy threads neither slow a cold start nor measure it instead of "
          "the machine; calls run unpinned meanwhile. 0: it measures at once "
          "(before stop 34)");
ABSL_FLAG(int64_t, frames_spin_us, 0,
          "microseconds a frame-wire connection's thread polls its socket "
          "without sleeping after handling the host's frames, before it "
          "blocks (adaptive, as --worker_read_spin_us). 0 (default): no "
          "spinning");
ABSL_FLAG(int64_t, worker_intake_spin_us,
          agentix::sandbox::kWorkerIntakeSpinUsByDefault,
          "microseconds the worker's pool thread that reads the daemon's "
          "frames polls without sleeping before it blocks (adaptive, as "
          "--worker_read_spin_us; the worker's --intake-spin-us). 0 "
          "(default): no spinning");
ABSL_FLAG(int64_t, worker_intake_look_slack_us,
          agentix::sandbox::kWorkerIntakeLookSlackUsByDefault,
          "microseconds late the worker's intake follower may look for a "
          "call that runs past 1 ms while short calls stream: it then looks "
          "with its CPU's tick instead of an interrupt of its own (the "
          "worker's --intake-look-slack-us). A long call holds up the next "
          "frames for up to 1 ms plus this until a follower has taken one "
          "(then exact for 10 s). 0: always exact");
ABSL_FLAG(uint64_t, max_log_subscribers, 64,
          "Logs streams (and, separately, Traces streams) subscribed at once "
          "(RESOURCE_EXHAUSTED beyond)");
ABSL_FLAG(double, paused_subscriber_timeout_s, 60,
          "seconds a Logs or Traces stream paused because its host fell 8 "
          "MiB behind may read nothing before it is ended "
          "(RESOURCE_EXHAUSTED), freeing its --max-log-subscribers place; "
          "what it had not received stays in the buffer for the host's next "
          "subscribe (after_seq), with a drop report for what the buffer "
          "evicted meanwhile");

namespace agentix::sandbox {
namespace {

constexpr char kVersion[] = "0.3.0";
constexpr char kListenFlag[] = "--listen";
constexpr char kInstallBundleFlag[] = "--install-bundle";

// `agentix-sandboxd --install-bundle SRC DST`: copies the tree SRC into the
// existing directory DST (modes and symlinks kept, nothing followed) and
// exits. The Kubernetes init-copy Pod runs it from the bundle image to fill
// the task container's /nix: the bundle brings its own copier, so neither
// image needs a shell or cp (docs/PROVIDERS.md, "Kubernetes backend: Pods").
int InstallBundle(const std::string& src, const std::string& dst) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(src, ec)) {
    std::fprintf(stderr, "--install-bundle: %s is not a directory\n", src.c_str());
    return 2;
  }
  if (!fs::is_directory(dst, ec)) {
    std::fprintf(stderr, "--install-bundle: %s is not a directory\n", dst.c_str());
    return 2;
  }
  fs::copy(src, dst,
           fs::copy_options::recursive | fs::copy_options::copy_symlinks |
               fs::copy_options::overwrite_existing,
           ec);
  if (ec) {
    std::fprintf(stderr, "--install-bundle %s %s: %s\n", src.c_str(), dst.c_str(),
                 ec.message().c_str());
    return 1;
  }
  return 0;
}

std::string DefaultWorkerPath() {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "agentix-worker";
  for (auto candidate : {self.parent_path() / "agentix-worker",
                         self.parent_path().parent_path() / "worker" /
                             "agentix-worker"}) {
    if (std::filesystem::exists(candidate, ec)) return candidate.string();
  }
  return (self.parent_path() / "agentix-worker").string();
}

std::vector<std::string> CurrentEnvironment() {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  return env;
}

// "unix:///abs/path" -> "/abs/path"; "" for TCP addresses.
std::string UnixSocketPath(const std::string& address) {
  constexpr char kPrefix[] = "unix://";
  if (!absl::StartsWith(address, kPrefix)) return "";
  return address.substr(sizeof(kPrefix) - 1);
}

// Reads the token and wipes $AGENTIX_TOKEN from this process: out of
// environ (so no child inherits it) and its bytes on the initial stack (so
// /proc/<pid>/environ no longer shows it either).
absl::StatusOr<std::string> TakeToken() {
  char* env_value = std::getenv(kTokenEnvVar);
  absl::StatusOr<std::string> token =
      LoadToken(absl::GetFlag(FLAGS_token_file), env_value);
  if (env_value != nullptr) {
    std::memset(env_value, 0, std::strlen(env_value));
    ::unsetenv(kTokenEnvVar);
  }
  return token;
}

// Reads --admin-token-file (empty: not in activation mode) and closes the
// descriptor a /proc/self/fd/N or /dev/fd/N path names, so that nothing
// later (the worker is spawned with only its own fds anyway) can re-read it.
absl::StatusOr<std::string> TakeAdminToken() {
  const std::string path = absl::GetFlag(FLAGS_admin_token_file);
  if (path.empty()) return std::string();
  absl::StatusOr<std::string> token = LoadTokenFile(path, "--admin-token-file");
  for (absl::string_view prefix : {"/proc/self/fd/", "/dev/fd/"}) {
    int fd = -1;
    if (absl::StartsWith(path, prefix) &&
        absl::SimpleAtoi(absl::string_view(path).substr(prefix.size()), &fd) &&
        fd > 2) {
      ::close(fd);
    }
  }
  return token;
}

// The token, the gate and the TLS files, read and logged; cheap (no gRPC),
// so a daemon refuses a bad file before it starts a worker.
absl::StatusOr<ServerSecurityOptions> LoadServerSecurity(
    std::string token, std::shared_ptr<TokenGate> gate) {
  ServerSecurityOptions security;
  security.token = std::move(token);
  security.gate = std::move(gate);
  for (auto [flag, value, pem] :
       {std::tuple{"--tls-cert", absl::GetFlag(FLAGS_tls_cert),
                   &security.tls_cert_pem},
        std::tuple{"--tls-key", absl::GetFlag(FLAGS_tls_key),
                   &security.tls_key_pem},
        std::tuple{"--tls-client-ca", absl::GetFlag(FLAGS_tls_client_ca),
                   &security.tls_client_ca_pem}}) {
    if (value.empty()) continue;
    AGX_ASSIGN_OR_RETURN(*pem, ReadPemFile(value, flag));
  }
  AGX_LOG(Info, "security: {}, {}",
          security.tls_cert_pem.empty()
              ? "plaintext"
              : (security.tls_client_ca_pem.empty() ? "TLS" : "mutual TLS"),
          security.gate != nullptr
              ? "unarmed until SandboxAdmin.Activate (admin token required)"
              : (security.token.empty() ? "no token check"
                                        : "bearer token required"));
  if (security.token.empty() && security.gate == nullptr) {
    AGX_LOG(Warning, "no --token-file and no ${}: whoever can connect can run "
                     "code here", kTokenEnvVar);
  }
  return security;
}

// Descriptors kept for everything but connections, so that a full set of
// connections never starves the worker or gRPC itself.
constexpr uint64_t kReservedFds = 64;

// Raises the open-file soft limit towards `wanted` (no further than the
// hard limit, never lowered: the worker inherits it, and programs that
// loop over every possible descriptor suffer from a huge one); returns the
// soft limit in force.
uint64_t RaiseOpenFileLimit(uint64_t wanted) {
  struct rlimit limit;
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1024;
  const rlim_t target = std::min<rlim_t>(wanted, limit.rlim_max);
  if (limit.rlim_cur < target) {
    struct rlimit raised = {target, limit.rlim_max};
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  return limit.rlim_cur;
}

// The caps from the flags, --max-connections lowered to what `fd_limit`
// leaves after kReservedFds.
ConnectionLimits ConnectionLimitsFromFlags(uint64_t fd_limit) {
  const uint64_t room = fd_limit > 2 * kReservedFds ? fd_limit - kReservedFds
                                                    : fd_limit / 2;
  ConnectionLimits limits;
  limits.max_connections = absl::GetFlag(FLAGS_max_connections);
  if (limits.max_connections > room) {
    AGX_LOG(Info, "--max-connections {} lowered to {} (open-file limit {})",
            limits.max_connections, room, fd_limit);
    limits.max_connections = room;
  }
  limits.max_unauthenticated_per_peer =
      absl::GetFlag(FLAGS_max_unauthenticated_connections_per_peer);
  limits.auth_timeout = absl::Seconds(absl::GetFlag(FLAGS_auth_timeout_s));
  return limits;
}

int Run(int argc, char** raw_argv) {
  if (argc >= 2 && std::strcmp(raw_argv[1], kInstallBundleFlag) == 0) {
    if (argc != 4) {
      std::fprintf(stderr, "usage: agentix-sandboxd --install-bundle SRC DST\n");
      return 2;
    }
    return InstallBundle(raw_argv[2], raw_argv[3]);
  }
  // Signals are taken synchronously by this thread (sigwait below); block
  // them before any thread starts (the connection guard's reaper, gRPC's),
  // since threads inherit the mask: a SIGTERM that arrives before the
  // sigwait would otherwise go to a thread that does not block it and end
  // the daemon without its shutdown (socket paths left behind).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::vector<std::string> storage;
  std::vector<char*> normalized =
      base::NormalizeFlagNames(argc, raw_argv, storage);
  char** argv = normalized.data();
  std::vector<std::string> listen = base::ExtractRepeatedFlag(
      kListenFlag, argc, argv);
  base::SetFlagsUsage(
      "agentix-sandboxd --listen unix:///abs/path.sock|HOST:PORT "
      "[--listen ...] [--venv DIR] [--python-path DIR[:DIR]] "
      "[--python-home DIR] [--worker PATH] [flags]\n"
      "agentix-sandboxd --install-bundle SRC DST\n\n"
      "Serves agentix.runtime.v1 (with grpc.health.v1 and reflection): runs "
      "Python callables in an agentix-worker child. Writes 'serving "
      "agentix.runtime.v1 on ADDR' to stderr once listening.\n\n"
      "  --listen ADDR  unix:///abs/path.sock or HOST:PORT; repeatable; unix "
      "sockets are made mode 0600.\n"
      "  --install-bundle SRC DST  copy the tree SRC into the directory DST "
      "(modes and symlinks kept) and exit.",
      absl::StrCat("agentix-sandboxd ", kVersion));
  absl::ParseCommandLine(argc, argv);
  base::SetLogTag("agentix-sandboxd");
  base::SetMinLogSeverity(base::ParseLogSeverity(absl::GetFlag(FLAGS_log_level)));
  // First, so that no failure below leaves the token in the environment.
  absl::StatusOr<std::string> token = TakeToken();
  if (!token.ok()) {
    AGX_LOG(Error, "{}", std::string(token.status().message()));
    return 2;
  }
  absl::StatusOr<std::string> admin_token = TakeAdminToken();
  if (!admin_token.ok()) {
    AGX_LOG(Error, "{}", std::string(admin_token.status().message()));
    return 2;
  }
  // Activation mode: the runtime token comes from Activate alone.
  std::shared_ptr<TokenGate> gate;
  if (!admin_token->empty()) {
    if (!token->empty()) {
      AGX_LOG(Error, "--admin-token-file excludes --token-file and ${}: the "
                     "runtime token comes from SandboxAdmin.Activate",
              kTokenEnvVar);
      return 2;
    }
    gate = TokenGate::Armable(*std::move(admin_token));
  }
  // Parsed early: a bad value fails before anything starts (the adoption
  // itself waits for the prestart's place below).
  std::optional<AdoptedWorker> adopt_worker;
  if (!absl::GetFlag(FLAGS_adopt_worker).empty()) {
    absl::StatusOr<AdoptedWorker> parsed =
        ParseAdoptFlag(absl::GetFlag(FLAGS_adopt_worker));
    if (!parsed.ok()) {
      AGX_LOG(Error, "{}", std::string(parsed.status().message()));
      return 2;
    }
    if (!absl::GetFlag(FLAGS_prestart_worker)) {
      AGX_LOG(Error, "--adopt_worker needs --prestart_worker: the adopted "
                     "worker is the prestarted one");
      return 2;
    }
    adopt_worker = *std::move(parsed);
  }
  if (listen.empty()) {
    AGX_LOG(Error, "at least one --listen address is required "
                   "(unix:///abs/path.sock or HOST:PORT)");
    return 2;
  }

  SessionOptions options;
  options.worker.worker_path = absl::GetFlag(FLAGS_worker).empty()
                                   ? DefaultWorkerPath()
                                   : absl::GetFlag(FLAGS_worker);
  options.worker.venv = absl::GetFlag(FLAGS_venv);
  options.worker.python_path = absl::GetFlag(FLAGS_python_path);
  options.worker.env = CurrentEnvironment();
  options.worker.payload_ring_bytes = absl::GetFlag(FLAGS_payload_ring_bytes);
  options.worker.ready_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_worker_ready_timeout_s));
  options.worker.read_spin =
      absl::Microseconds(absl::GetFlag(FLAGS_worker_read_spin_us));
  // "auto" (and "probe", the default) is chosen per daemon (CallsCpu::kRunningCpu), not the fixed
  // highest CPU ParseCpuSetting gives hosts: many daemons on one CPU would
  // queue behind each other.
  const std::string calls_cpu_flag = absl::GetFlag(FLAGS_calls_cpu);
  const absl::string_view calls_cpu_setting =
      absl::StripAsciiWhitespace(calls_cpu_flag);
  const bool probe_placement = calls_cpu_setting == "probe";
  absl::StatusOr<int> calls_cpu =
      calls_cpu_setting == "auto" || probe_placement
          ? absl::StatusOr<int>(CallsCpu::kRunningCpu)
          : base::ParseCpuSetting(calls_cpu_flag);
  if (!calls_cpu.ok()) {
    AGX_LOG(Error, "--calls_cpu: {}", std::string(calls_cpu.status().message()));
    return 2;
  }
  // --calls_cpu=probe: unpinned until the probe, on a thread of its own,
  // chooses (a few ms; the first calls run unpinned meanwhile); measured
  // again later in the call path's pauses (sandbox/placement_probe.h,
  // ReprobeSchedule).
  std::unique_ptr<PlacementProber> prober;
  if (*calls_cpu != base::kNoCpu) {
    options.worker.calls_cpu = std::make_shared<CallsCpu>(*calls_cpu);
    if (probe_placement) {
      const double every_s = absl::GetFlag(FLAGS_calls_cpu_reprobe_s);
      if (!(every_s >= 0)) {
        AGX_LOG(Error, "--calls_cpu_reprobe_s must be 0 or more (got {})", every_s);
        return 2;
      }
      const int64_t wait_ms = absl::GetFlag(FLAGS_calls_cpu_probe_wait_ms);
      if (wait_ms < 0 || wait_ms > 600000) {
        AGX_LOG(Error, "--calls_cpu_probe_wait_ms must be between 0 and 600000 (got {})",
                wait_ms);
        return 2;
      }
      ReprobeSchedule::Options reprobe;
      reprobe.every = absl::Seconds(every_s);
      reprobe.startup_wait = absl::Milliseconds(wait_ms);
      prober = std::make_unique<PlacementProber>(options.worker.calls_cpu, reprobe);
      prober->Start();
    }
  }
  options.max_payload_bytes = absl::GetFlag(FLAGS_max_payload_bytes);
  options.max_retained_results = absl::GetFlag(FLAGS_max_retained_results);
  options.finished_ids_shard_bits = absl::GetFlag(FLAGS_finished_ids_shard_bits);
  options.acks_after_starts = absl::GetFlag(FLAGS_acks_after_starts);
  if (options.finished_ids_shard_bits < 0 ||
      options.finished_ids_shard_bits > kMaxFinishedIdsShardBits) {
    AGX_LOG(Error, "--finished_ids_shard_bits={} is out of range (0-{})",
            options.finished_ids_shard_bits, kMaxFinishedIdsShardBits);
    return 2;
  }
  options.max_retained_bytes = absl::GetFlag(FLAGS_max_retained_bytes);
  options.log_buffer_records = absl::GetFlag(FLAGS_log_buffer_records);
  options.trace_buffer_events = absl::GetFlag(FLAGS_trace_buffer_events);
  options.max_namespace_streams = absl::GetFlag(FLAGS_max_namespace_streams);
  options.max_concurrent_calls = absl::GetFlag(FLAGS_max_concurrent_calls);
  options.max_queued_calls = absl::GetFlag(FLAGS_max_queued_calls);
  options.upload_idle_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_upload_idle_timeout_s));
  options.stalled_host_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_stalled_host_timeout_s));
  options.max_log_subscribers = absl::GetFlag(FLAGS_max_log_subscribers);
  if (!(absl::GetFlag(FLAGS_paused_subscriber_timeout_s) > 0)) {
    AGX_LOG(Error, "--paused_subscriber_timeout_s must be positive (got {})",
            absl::GetFlag(FLAGS_paused_subscriber_timeout_s));
    return 2;
  }
  options.paused_subscriber_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_paused_subscriber_timeout_s));
  for (const auto& [name, value] :
       {std::pair<const char*, int64_t>{"grpc_spin_us", absl::GetFlag(FLAGS_grpc_spin_us)},
        {"worker_read_spin_us", absl::GetFlag(FLAGS_worker_read_spin_us)},
        {"frames_spin_us", absl::GetFlag(FLAGS_frames_spin_us)},
        {"worker_intake_spin_us", absl::GetFlag(FLAGS_worker_intake_spin_us)},
        {"worker_intake_look_slack_us", absl::GetFlag(FLAGS_worker_intake_look_slack_us)}}) {
    if (value < 0 || value > 1000000) {
      AGX_LOG(Error, "--{} must be between 0 and 1000000 (got {})", name, value);
      return 2;
    }
  }
  if (access(options.worker.worker_path.c_str(), X_OK) != 0) {
    AGX_LOG(Error, "worker binary {} is not executable; pass --worker PATH",
            options.worker.worker_path);
    return 2;
  }

  // Before any gRPC object exists (grpc_executor.h).
  if (absl::GetFlag(FLAGS_grpc_inline_executor)) RunGrpcExecutorInline();
  // The frame wire checks HELLO's token with the same gate as gRPC's.
  std::shared_ptr<TokenGate> calls_gate =
      gate != nullptr ? gate : TokenGate::Fixed(*token);
  absl::StatusOr<ServerSecurityOptions> security =
      LoadServerSecurity(std::move(token).value(), gate);
  if (!security.ok()) {
    AGX_LOG(Error, "{}", std::string(security.status().message()));
    return 2;
  }
  // Before the worker starts: it inherits the raised limit.
  const uint64_t fd_limit = RaiseOpenFileLimit(
      absl::GetFlag(FLAGS_max_connections) + 2 * kReservedFds);
  const ConnectionLimits connection_limits = ConnectionLimitsFromFlags(fd_limit);
  // The worker must not inherit the token.
  const std::string token_entry = absl::StrCat(kTokenEnvVar, "=");
  auto& env = options.worker.env;
  env.erase(std::remove_if(env.begin(), env.end(),
                           [&](const std::string& entry) {
                             return absl::StartsWith(entry, token_entry);
                           }),
            env.end());

  signal(SIGPIPE, SIG_IGN);

  // Before the manager, whose worker reports direct connections to it.
  StreamActivity activity;
  std::shared_ptr<DirectConnections> direct_connections;
  const DaemonWorkerFlags worker_flags{
      absl::GetFlag(FLAGS_python_home), absl::GetFlag(FLAGS_worker_intake_spin_us),
      absl::GetFlag(FLAGS_direct_calls), absl::GetFlag(FLAGS_calls_socket),
      *calls_cpu == base::kNoCpu, absl::GetFlag(FLAGS_max_retained_results),
      absl::GetFlag(FLAGS_worker_intake_look_slack_us)};
  // The same function gives agentix-launch's worker its options.
  SetWorkerOptionsFor(worker_flags, options.worker);
  if (ServesDirectCalls(worker_flags)) {
    direct_connections = std::make_shared<DirectConnections>(
        std::min<size_t>(connection_limits.max_connections, 256), &activity);
    options.worker.direct_listener = direct_connections;
  }
  SessionManager manager(options);
  // After the manager, so it stops first.
  std::unique_ptr<DirectOrphanTimer> orphan_timer;
  if (direct_connections != nullptr) {
    orphan_timer = std::make_unique<DirectOrphanTimer>(
        *direct_connections,
        absl::Seconds(std::max(1, absl::GetFlag(FLAGS_direct_orphan_s))),
        [&manager, direct = direct_connections.get()](const std::string& client) {
          // Not if a connection of the client came back meanwhile.
          manager.AskCollapse(client, [&] { return !direct->HasLive(client); });
        });
  }
  // Whatever the way out, the prober stops before the manager it watches.
  absl::Cleanup stop_prober = [&prober] {
    if (prober != nullptr) prober->Stop();
  };
  // The worker's boot (tens of ms of Python) is a cold start's critical
  // path, so it starts before gRPC's own start-up (grpc_init with the
  // credentials, the connection guard, the servers), which then runs beside
  // it (docs/DECISIONS.md, stop-61).
  if (adopt_worker.has_value()) {
    absl::Status adopted = manager.AdoptWorker(*adopt_worker);
    if (absl::IsInvalidArgument(adopted)) {
      // Fds or a pid that are not what the flag says: a launcher bug.
      AGX_LOG(Error, "{}", std::string(adopted.message()));
      return 2;
    }
    if (!adopted.ok()) {
      AGX_LOG(Warning, "could not adopt the launcher's worker ({}); starting "
                       "one", std::string(adopted.message()));
    }
  }
  if (absl::GetFlag(FLAGS_prestart_worker)) {
    // A no-op after a successful adoption (the worker is running).
    absl::Status started = manager.StartWorker();
    if (!started.ok()) {
      // Not fatal: the first call tries again and reports the reason.
      AGX_LOG(Warning, "could not start the worker early: {}",
              std::string(started.message()));
    }
  }
  // grpc_init runs here, beside the worker's boot.
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials(*security);
  if (!credentials.ok()) {
    AGX_LOG(Error, "{}", std::string(credentials.status().message()));
    return 2;
  }
  absl::Status guarded = StartConnectionGuard(connection_limits);
  if (!guarded.ok()) {
    AGX_LOG(Error, "{}", std::string(guarded.message()));
    return 2;
  }
  RuntimeServiceImpl service(&manager, kVersion, &activity);
  // In activation mode a prestarted worker boots now but runs no user code
  // before Activate, which hands it the env (or replaces it with a worker
  // spawned with it): a claimed warm sandbox's first call does not wait for
  // a Python start-up.
  std::unique_ptr<SandboxAdminService> admin;
  if (gate != nullptr) {
    admin = std::make_unique<SandboxAdminService>(
        gate, &manager, &activity, absl::GetFlag(FLAGS_prestart_worker),
        options.worker.ready_timeout + absl::Seconds(5));
  }
  // After the prestart: a start-up probe that waits for the call path to
  // rest must see the prestarted worker booting.
  if (prober != nullptr && direct_connections != nullptr) {
    // Direct hosts that follow changes are told by the worker (stage 5).
    prober->OnHostWaits([&manager](CallsCpu::HostWaits waits) {
      manager.TellDirectCallsCpu(waits == CallsCpu::HostWaits::kOff ? "off" : "wait");
    });
  }
  if (prober != nullptr) {
    prober->Watch([&manager] {
      const SessionManager::CallPathQuiet quiet = manager.Quiet();
      return CallPathActivity{quiet.calls_running || quiet.worker_booting,
                              quiet.last_call_end};
    });
  }

  // The health-only server: grpc.health.v1 alone, plaintext, no token (the
  // kubelet's gRPC probe can send neither). grpc++ adds server reflection
  // to every builder; there it lists only the health service. Its
  // connections never authenticate, so the connection guard's per-peer cap
  // and --auth-timeout-s bound them.
  std::unique_ptr<grpc::ServerBuilder> health_builder;
  const std::string health_listen = absl::GetFlag(FLAGS_health_listen);
  int health_port = 0;
  HealthService open_health({"agentix.runtime.v1.RuntimeService"});
  std::unique_ptr<grpc::ServerCompletionQueue> health_cq;
  if (!health_listen.empty()) {
    std::string path = UnixSocketPath(health_listen);
    if (!path.empty() && path.front() != '/') {
      AGX_LOG(Error, "--health-listen {}: unix socket paths must be absolute",
              health_listen);
      return 2;
    }
    if (!path.empty()) ::unlink(path.c_str());
    health_builder = std::make_unique<grpc::ServerBuilder>();
    health_builder->AddListeningPort(health_listen,
                                     grpc::InsecureServerCredentials(),
                                     path.empty() ? &health_port : nullptr);
    open_health.AddTo(*health_builder);
    health_cq = health_builder->AddCompletionQueue();
    health_builder->SetMaxReceiveMessageSize(4096);
  }

  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  std::vector<std::string> socket_paths;
  std::vector<int> ports(listen.size(), 0);
  for (size_t i = 0; i < listen.size(); ++i) {
    std::string path = UnixSocketPath(listen[i]);
    if (!path.empty()) {
      if (path.front() != '/') {
        AGX_LOG(Error, "--listen {}: unix socket paths must be absolute",
                listen[i]);
        return 2;
      }
      ::unlink(path.c_str());  // a stale socket from a previous run
      socket_paths.push_back(path);
    }
    builder.AddListeningPort(listen[i], *credentials,
                             path.empty() ? &ports[i] : nullptr);
  }
  service.AddTo(builder);
  if (admin) admin->AddTo(builder);
  // grpc.health.v1 of our own on the same queue: grpc++'s default one would
  // bring the callback API's threads back (health_service.h).
  HealthService health({"agentix.runtime.v1.RuntimeService"});
  health.AddTo(builder);
  // grpc.reflection.v1 beside grpc++'s v1alpha (reflection_service.h).
  std::vector<std::string> reflected = {"agentix.runtime.v1.RuntimeService",
                                        "grpc.health.v1.Health"};
  if (admin) reflected.push_back("agentix.runtime.v1.SandboxAdmin");
  ReflectionV1Service reflection_v1(std::move(reflected));
  reflection_v1.AddTo(builder);
  std::unique_ptr<grpc::ServerCompletionQueue> cq =
      builder.AddCompletionQueue();
  builder.SetMaxReceiveMessageSize(64 << 20);
  // Unix sockets are created owner-only (0600): whoever can connect can run
  // code in the sandbox.
  const mode_t old_umask = ::umask(0177);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ::umask(old_umask);
  if (!server) {
    AGX_LOG(Error, "could not listen on the requested addresses");
    return 1;
  }
  for (size_t i = 0; i < listen.size(); ++i) {
    if (UnixSocketPath(listen[i]).empty() && ports[i] == 0) {
      AGX_LOG(Error, "could not bind {}", listen[i]);
      return 1;
    }
  }
  for (const auto& path : socket_paths) ClaimSocketPath(path);
  std::unique_ptr<grpc::Server> health_server;
  std::unique_ptr<CompletionQueueThread> health_reactions;
  if (health_builder) {
    health_server = health_builder->BuildAndStart();
    if (!health_server ||
        (UnixSocketPath(health_listen).empty() && health_port == 0)) {
      AGX_LOG(Error, "could not bind --health-listen {}", health_listen);
      return 1;
    }
    if (!UnixSocketPath(health_listen).empty()) {
      ClaimSocketPath(UnixSocketPath(health_listen));
    }
    health_reactions =
        std::make_unique<CompletionQueueThread>(health_cq.get(), "agx-health");
    open_health.Start(health_reactions.get());
    AGX_LOG(Info, "serving grpc.health.v1 (plaintext, no token) on {}{}",
            health_listen,
            health_port > 0 ? absl::StrCat(" (port ", health_port, ")") : "");
  }
  // Every reaction of every call runs on this one thread (server_stream.h).
  CompletionQueueThread reactions(cq.get(), "agx-grpc",
                                  absl::Microseconds(absl::GetFlag(FLAGS_grpc_spin_us)));
  service.Start(&reactions);
  if (admin) admin->Start(&reactions);
  health.Start(&reactions);
  reflection_v1.Start(&reactions);
  // The frame wire beside each unix socket, before the "serving" line:
  // a host that sees the daemon serving finds PATH.calls in place.
  std::vector<std::unique_ptr<FrameWireServer>> frame_wires;
  if (absl::GetFlag(FLAGS_calls_socket)) {
    for (const auto& path : socket_paths) {
      FrameWireOptions wire;
      wire.path = path + ".calls";
      wire.gate = calls_gate;
      // Each frame-wire connection holds a thread: fewer than gRPC's cap.
      wire.max_connections =
          std::min<size_t>(connection_limits.max_connections, 256);
      // Before the connection guard's own auth timeout shuts the socket,
      // so a silent client gets a definite STATUS 4.
      wire.hello_timeout = connection_limits.auth_timeout * 3 / 4;
      wire.activity = &activity;
      wire.calls_cpu = options.worker.calls_cpu;
      wire.spin = absl::Microseconds(absl::GetFlag(FLAGS_frames_spin_us));
      wire.direct = direct_connections;
      auto server_for_path =
          std::make_unique<FrameWireServer>(&manager, std::move(wire));
      absl::Status started = server_for_path->Start();
      if (!started.ok()) {
        // Not fatal: hosts use gRPC when PATH.calls is absent.
        AGX_LOG(Warning, "no frame wire beside {}: {}", path,
                std::string(started.message()));
        continue;
      }
      ClaimSocketPath(path + ".calls");
      frame_wires.push_back(std::move(server_for_path));
    }
  }
  for (size_t i = 0; i < listen.size(); ++i) {
    AGX_LOG(Info, "serving agentix.runtime.v1 on {}{}", listen[i],
            ports[i] > 0 ? absl::StrCat(" (port ", ports[i], ")") : "");
  }

  int received = 0;
  sigwait(&signals, &received);
  AGX_LOG(Info, "received signal {}; shutting down", received);
  // A placement probe that is measuring ends now, not after its 60-130 ms.
  if (prober) prober->Stop();
  health.Shutdown();
  open_health.Shutdown();
  // Calls in flight end first, with a definite error their hosts receive
  // while the streams are still open; then the server drains (bounded).
  manager.Shutdown(absl::Seconds(3));
  // Frame-wire streams: what is queued, then STATUS 14 UNAVAILABLE (as a
  // host reconnects after a gRPC stream the shutdown cancels).
  for (auto& wire : frame_wires) wire->Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  server->Wait();
  if (health_server) {
    health_server->Shutdown(std::chrono::system_clock::now() +
                            std::chrono::seconds(1));
    health_server->Wait();
    health_reactions->Stop();
  }
  reactions.Stop();
  RemoveOwnSocketPaths();
  AGX_LOG(Info, "stopped");
  return 0;
}

}  // namespace
}  // namespace agentix::sandbox

int main(int argc, char** argv) {
  // Not dumpable: processes of the same uid (sandbox code among them)
  // cannot ptrace this one or read its memory, environ or fds under
  // /proc/<pid>. The worker is exec'd, which makes it dumpable again.
  ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  agentix::base::TuneMallocForLargeBuffers();
  agentix::base::DisableMutexDeadlockDetection();
  return agentix::sandbox::Run(argc, argv);
}
