#include "providers/providerd.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <tuple>
#include <utility>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "providers/backends/engine/engine_backend.h"
#include "providers/backends/kubernetes/kube_config.h"
#include "providers/backends/kubernetes/kubernetes_backend.h"
#include "providers/backends/local/local_backend.h"
#include "providers/core/grpc_daemon_agent.h"
#include "providers/service/metrics_text.h"

namespace agentix::providers {
namespace {

constexpr char kServiceName[] = "agentix.provider.v1.ProviderService";
// Calls still open at a stop get this long before they are cancelled.
constexpr auto kDrainTime = std::chrono::seconds(5);

std::string UnixSocketPath(const std::string& address) {
  constexpr char kPrefix[] = "unix://";
  if (!absl::StartsWith(address, kPrefix)) return "";
  return address.substr(sizeof(kPrefix) - 1);
}

// Makes `dir` (and missing parents) and insists it is ours and owner-only:
// a directory others can write to could hold a socket or journal of theirs.
absl::Status MakePrivateDir(const std::string& dir, absl::string_view what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " ", dir, ": cannot create it: ", ec.message()));
  }
  ::chmod(dir.c_str(), 0700);  // no-op on a directory that is not ours
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " ", dir, " is not a directory"));
  }
  if (st.st_uid != ::getuid() || (st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " ", dir, " must be owned by uid ", ::getuid(),
        " and not accessible by group or others"));
  }
  return absl::OkStatus();
}

// An exclusive flock on `path`, held for as long as the fd lives; its file
// holds our pid for the message another providerd gets.
absl::StatusOr<base::UniqueFd> Lock(const std::string& path,
                                    absl::string_view what) {
  base::UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    char pid[32] = {};
    (void)!::pread(fd.get(), pid, sizeof(pid) - 1, 0);
    return absl::FailedPreconditionError(absl::StrCat(
        "another agentix-providerd (pid ", absl::StripAsciiWhitespace(pid),
        ") is using ", what, " (", path, ")"));
  }
  const std::string text = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(fd.get(), 0) != 0 ||
      ::pwrite(fd.get(), text.data(), text.size(), 0) < 0) {
    AGX_LOG(Warning, "cannot write our pid to {}", path);
  }
  return fd;
}

absl::StatusOr<std::unique_ptr<Backend>> MakeKubernetesBackend(const KubernetesFlags& flags,
                                                               const std::string& instance) {
  kubernetes::KubernetesBackendOptions options;
  if (!flags.kubeconfig.empty()) {
    AGX_ASSIGN_OR_RETURN(options.config,
                         kubernetes::LoadKubeconfig(flags.kubeconfig, flags.context));
  } else {
    AGX_ASSIGN_OR_RETURN(options.config, kubernetes::LoadInCluster());
  }
  if (!flags.ns.empty()) options.config.ns = flags.ns;
  options.instance = instance;
  options.render.runtime_port = flags.runtime_port;
  return kubernetes::NewKubernetesBackend(std::move(options));
}

absl::StatusOr<std::vector<std::unique_ptr<Backend>>> MakeLocalBackends(
    const LocalFlags& flags, const std::string& sandbox_dir) {
  local::LocalBackendOptions options;
  options.bwrap = flags.bwrap;
  options.state_dir = sandbox_dir;
  options.cgroup_root = flags.cgroup_root;
  options.cgroup_parent = flags.cgroup_parent;
  options.extra_bwrap_args = flags.extra_bwrap_args;
  options.default_pids_max = flags.pids_max;
  options.default_memory_bytes = flags.memory_bytes;
  options.tmp_bytes = flags.tmp_bytes;
  options.run_bytes = flags.run_bytes;
  options.shm_bytes = flags.shm_bytes;
  options.log_max_bytes = flags.log_max_bytes;
  options.seccomp = flags.seccomp;
  options.require_limits = flags.require_limits;
  AGX_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend,
                       local::NewLocalBackend(std::move(options)));
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(std::move(backend));
  return backends;
}

// The docker and podman backends whose sockets are given. Their sandboxes
// are containers, which outlive providerd: a restart adopts those still
// answering (SandboxController::Start).
absl::StatusOr<std::vector<std::unique_ptr<Backend>>> MakeEngineBackends(
    const EngineFlags& flags, const std::string& state_dir, const std::string& instance) {
  std::vector<std::unique_ptr<Backend>> backends;
  for (auto [name, socket, run_root] :
       {std::tuple{"docker", flags.docker_socket, "/dk"},
        std::tuple{"podman", flags.podman_socket, "/pm"}}) {
    if (socket.empty()) continue;
    if (socket.front() != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, "-socket ", socket, ": must be an absolute path"));
    }
    engine::EngineOptions options;
    options.name = name;
    options.socket_path = socket;
    options.run_root = absl::StrCat(state_dir, run_root);
    options.instance = instance;
    AGX_RETURN_IF_ERROR(MakePrivateDir(options.run_root, absl::StrCat("the ", name,
                                                                      " run root")));
    backends.push_back(engine::NewEngineBackend(std::move(options)));
  }
  return backends;
}

absl::StatusOr<std::unique_ptr<DaemonAgent>> MakeGrpcAgent() {
  return std::unique_ptr<DaemonAgent>(std::make_unique<GrpcDaemonAgent>());
}

}  // namespace

std::string DefaultSocketPath() {
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  struct stat st;
  if (runtime != nullptr && runtime[0] == '/' && ::stat(runtime, &st) == 0 &&
      S_ISDIR(st.st_mode)) {
    return absl::StrCat(runtime, "/agentix/providerd.sock");
  }
  return absl::StrCat("/tmp/agentix-", ::getuid(), "/providerd.sock");
}

std::string DefaultStateDir() {
  return absl::StrCat("/var/tmp/agx-", ::getuid());
}

absl::StatusOr<int64_t> ParseByteSize(absl::string_view text) {
  std::string s = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (absl::EndsWith(s, "ib")) {
    s.resize(s.size() - 2);
  } else if (absl::EndsWith(s, "b")) {
    s.resize(s.size() - 1);
  }
  int shift = 0;
  if (!s.empty()) {
    switch (s.back()) {
      case 'k': shift = 10; break;
      case 'm': shift = 20; break;
      case 'g': shift = 30; break;
      case 't': shift = 40; break;
      default: break;
    }
    if (shift != 0) s.pop_back();
  }
  int64_t value = 0;
  if (s.empty() || !absl::SimpleAtoi(s, &value) || value < 0 ||
      value > (std::numeric_limits<int64_t>::max() >> shift)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "not a size: '", text, "' (want e.g. 1048576, 64k, 16m, 2g)"));
  }
  return value << shift;
}

absl::StatusOr<std::unique_ptr<Providerd>> Providerd::Start(
    ProviderdConfig config, auth::ServerSecurityOptions security) {
  std::unique_ptr<Providerd> p(new Providerd());
  config.service.token = security.token;
  security.handler_checked_prefix = kProviderServicePathPrefix;
  AGX_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                       auth::MakeServerCredentials(security));
  if (config.listen.empty()) {
    const std::string path = DefaultSocketPath();
    AGX_RETURN_IF_ERROR(MakePrivateDir(
        std::filesystem::path(path).parent_path().string(),
        "the default socket directory"));
    config.listen.push_back(absl::StrCat("unix://", path));
  }
  for (const std::string& address : config.listen) {
    const std::string path = UnixSocketPath(address);
    if (path.empty()) continue;
    if (path.front() != '/') {
      return absl::InvalidArgumentError(absl::StrCat(
          "--listen ", address, ": unix socket paths must be absolute"));
    }
    AGX_ASSIGN_OR_RETURN(base::UniqueFd lock,
                         Lock(absl::StrCat(path, ".lock"),
                              absl::StrCat("the socket ", path)));
    p->locks_.push_back(std::move(lock));
  }
  if (config.state_dir.empty()) config.state_dir = DefaultStateDir();
  if (config.state_dir.size() > kMaxStateDirBytes ||
      config.state_dir.front() != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "--state-dir ", config.state_dir, " must be an absolute path of at "
        "most ", kMaxStateDirBytes, " bytes: sandboxes' sockets live under "
        "it, and a socket path is limited to 107 bytes"));
  }
  AGX_RETURN_IF_ERROR(MakePrivateDir(config.state_dir, "--state-dir"));
  AGX_ASSIGN_OR_RETURN(
      base::UniqueFd state_lock,
      Lock(absl::StrCat(config.state_dir, "/providerd.lock"),
           absl::StrCat("the state directory ", config.state_dir)));
  p->locks_.push_back(std::move(state_lock));
  // Ours now: whatever socket is there is a dead providerd's.
  for (const std::string& address : config.listen) {
    const std::string path = UnixSocketPath(address);
    if (!path.empty()) ::unlink(path.c_str());
  }
  config.controller.state_dir = config.state_dir;

  const std::string sandbox_dir = absl::StrCat(config.state_dir, "/sb");
  std::vector<std::unique_ptr<Backend>> backends;
  if (config.make_backends) {
    AGX_ASSIGN_OR_RETURN(backends, config.make_backends(sandbox_dir));
  } else {
    AGX_ASSIGN_OR_RETURN(backends, MakeLocalBackends(config.local, sandbox_dir));
  }
  AGX_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Backend>> engines,
                       MakeEngineBackends(config.engines, config.state_dir,
                                          config.controller.instance));
  for (auto& engine : engines) backends.push_back(std::move(engine));
  if (!config.kubernetes.kubeconfig.empty() || config.kubernetes.in_cluster) {
    AGX_ASSIGN_OR_RETURN(
        auto k8s, MakeKubernetesBackend(config.kubernetes, config.controller.instance));
    backends.push_back(std::move(k8s));
  }
  std::unique_ptr<DaemonAgent> agent;
  if (config.make_agent) {
    agent = config.make_agent();
  } else {
    AGX_ASSIGN_OR_RETURN(agent, MakeGrpcAgent());
  }
  AGX_ASSIGN_OR_RETURN(p->controller_,
                       SandboxController::Create(config.controller,
                                                 std::move(backends),
                                                 std::move(agent)));
  AGX_RETURN_IF_ERROR(p->controller_->Start());
  p->service_ = std::make_unique<ProviderServiceImpl>(p->controller_.get(),
                                                      config.service);

  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  std::vector<int> ports(config.listen.size(), 0);
  for (size_t i = 0; i < config.listen.size(); ++i) {
    const std::string path = UnixSocketPath(config.listen[i]);
    if (!path.empty()) p->socket_paths_.push_back(path);
    builder.AddListeningPort(config.listen[i], credentials,
                             path.empty() ? &ports[i] : nullptr);
  }
  builder.RegisterService(p->service_.get());
  // Unix sockets are created owner-only (0600): whoever can connect can
  // create sandboxes and reach every sandbox's token.
  const mode_t old_umask = ::umask(0177);
  p->server_ = builder.BuildAndStart();
  ::umask(old_umask);
  if (!p->server_) {
    p->controller_->Shutdown(/*destroy_all=*/true);
    return absl::UnavailableError(absl::StrCat(
        "could not listen on ", absl::StrJoin(config.listen, ", ")));
  }
  for (size_t i = 0; i < config.listen.size(); ++i) {
    std::string address = config.listen[i];
    if (UnixSocketPath(address).empty()) {
      if (ports[i] == 0) {
        p->Stop();
        return absl::UnavailableError(absl::StrCat("could not bind ", address));
      }
      address = absl::StrCat(address.substr(0, address.rfind(':') + 1),
                             ports[i]);
    }
    p->addresses_.push_back(std::move(address));
  }
  p->server_->GetHealthCheckService()->SetServingStatus(kServiceName, true);
  p->ticker_ = std::thread(&Providerd::KeepCallbackThreadsAwake, p.get(),
                           p->server_->InProcessChannel(grpc::ChannelArguments()),
                           security.token);
  if (!config.metrics_listen.empty()) {
    SandboxController* controller = p->controller_.get();
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> metrics =
        MetricsHttpServer::Start({config.metrics_listen}, [controller] {
          return RenderPrometheusText(controller->Metrics());
        });
    if (!metrics.ok()) {
      p->Stop();
      return metrics.status();
    }
    p->metrics_ = std::move(*metrics);
  }
  p->config_ = std::move(config);
  for (const std::string& address : p->addresses_) {
    AGX_LOG(Info, "serving {} on {}", kServiceName, address);
  }
  if (p->metrics_) {
    const std::string& m = p->config_.metrics_listen;
    AGX_LOG(Info, "metrics on http://{}{}/metrics",
            m.substr(0, m.rfind(':') + 1), p->metrics_->port());
  }
  return p;
}

Providerd::~Providerd() { Stop(); }

// The service uses grpc++'s callback API. On Debian's gRPC 1.51 (epoll1,
// no background poller) its completions are run by grpc++'s two "nexting"
// threads, each waiting at most 1 s for one and then sleeping 100 ms. Idle,
// both time out together about 1 s after the last request and sleep
// together: a request arriving then waited up to 100 ms for a thread (a
// warm claim after a pause took ~100 ms instead of ~4 ms). A health check
// to ourselves through the in-process channel every kTick is a completion
// for one of them before its second is up, so one is always waiting.
// Idle cost: two in-process calls a second.
void Providerd::KeepCallbackThreadsAwake(std::shared_ptr<grpc::Channel> self,
                                         std::string token) {
  constexpr absl::Duration kTick = absl::Milliseconds(400);
  grpc::GenericStub stub(self);
  const std::string method = "/grpc.health.v1.Health/Check";
  while (!stop_ticks_.WaitForNotificationWithTimeout(kTick)) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    if (!token.empty()) context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    grpc::Slice empty;  // an empty HealthCheckRequest: the server's status
    grpc::ByteBuffer request(&empty, 1);
    grpc::ByteBuffer response;
    absl::Notification done;
    stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                   [&done](grpc::Status) { done.Notify(); });
    done.WaitForNotification();  // bounded by the deadline
  }
}

void Providerd::Stop() {
  if (stopped_) return;
  stopped_ = true;
  if (ticker_.joinable()) {
    stop_ticks_.Notify();
    ticker_.join();
  }
  if (server_) server_->GetHealthCheckService()->Shutdown();
  // First the controller: creates are refused from here on, creates in
  // flight end, and the sandboxes go (watchers see them go) while the
  // server still answers.
  if (controller_) controller_->Shutdown(config_.destroy_on_exit);
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + kDrainTime);
    server_->Wait();
  }
  metrics_.reset();
  service_.reset();
  server_.reset();
  controller_.reset();
  for (const std::string& path : socket_paths_) ::unlink(path.c_str());
  locks_.clear();
}

}  // namespace agentix::providers
