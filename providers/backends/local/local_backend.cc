#include "providers/backends/local/local_backend.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "base/child_process.h"
#include "base/log.h"
#include "base/unique_fd.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "providers/backends/local/bwrap_argv.h"
#include "providers/backends/local/cgroups.h"
#include "providers/backends/local/sandbox_log.h"
#include "providers/backends/local/seccomp_filter.h"
#include "providers/core/errors.h"

namespace agentix::providers::local {
namespace {

using base::UniqueFd;

constexpr char kStateFile[] = "state.json";
constexpr size_t kMaxSocketPath = 107;  // sun_path, NUL excluded
constexpr size_t kMaxToken = 4096;      // fits a pipe buffer at once
// The fds bwrap gets (fixed, so argv is known before the fork).
constexpr int kSeccompChildFd = 3;
constexpr int kTokenChildFd = 4;
constexpr int kInfoChildFd = 5;
const char* const kControllers[] = {"memory", "pids", "cpu"};

std::string Errno(absl::string_view what) {
  return absl::StrCat(what, ": ", strerror(errno));
}

bool ValidId(absl::string_view id) {
  if (id.empty() || id.size() > 63) return false;
  for (char c : id) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-')) return false;
  }
  return true;
}

std::string MachinePlatform() {
  struct utsname u;
  ::uname(&u);
  absl::string_view m = u.machine;
  if (m == "x86_64") return "linux/amd64";
  if (m == "aarch64") return "linux/arm64";
  return absl::StrCat("linux/", m);
}

bool PlatformMatches(absl::string_view requested) {
  std::string wanted = absl::AsciiStrToLower(absl::StripAsciiWhitespace(requested));
  if (wanted.empty()) return true;
  const std::string machine = MachinePlatform();
  static const std::map<std::string, std::set<std::string>> kAliases = {
      {"linux/amd64", {"linux/amd64", "linux/x86-64", "linux/x86_64", "amd64", "x86-64", "x86_64"}},
      {"linux/arm64", {"linux/arm64", "linux/arm64/v8", "linux/aarch64", "arm64", "aarch64"}},
  };
  auto it = kAliases.find(machine);
  return it == kAliases.end() ? wanted == machine : it->second.count(wanted) > 0;
}

bool IsDir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool IsFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string RealPath(const std::string& path) {
  char buf[PATH_MAX];
  return ::realpath(path.c_str(), buf) ? std::string(buf) : path;
}

// The image's root directory: "/" for the host.
absl::StatusOr<std::string> RootDir(absl::string_view image) {
  if (image.empty() || image == "host" || image == "/") return std::string("/");
  const std::string path(image);
  if (!IsDir(path)) {
    return ProviderError(
        absl::StatusCode::kInvalidArgument, kReasonInvalidSpec,
        absl::StrCat("image '", image,
                     "' is not usable by the local backend: use 'host' or a root "
                     "filesystem directory (OCI layouts are unpacked by the client)"));
  }
  return RealPath(path);
}

// The bundle's nix/ directory.
absl::StatusOr<std::string> NixDir(const pb::BundleRef& bundle) {
  if (bundle.ref_case() == pb::BundleRef::kOciReference) {
    return ProviderError(absl::StatusCode::kInvalidArgument, kReasonNotABundle,
                         "the local backend takes a bundle directory (bundle.path), "
                         "not an OCI reference");
  }
  const std::string& path = bundle.path();
  if (path.empty()) {
    return ProviderError(absl::StatusCode::kInvalidArgument, kReasonNotABundle,
                         "spec.bundle.path is required");
  }
  if (IsDir(path) && IsFile(path + "/nix/runtime/bootstrap.sh")) {
    return RealPath(path + "/nix");
  }
  if (IsDir(path) && IsFile(path + "/runtime/bootstrap.sh")) return RealPath(path);
  return ProviderError(absl::StatusCode::kInvalidArgument, kReasonNotABundle,
                       absl::StrCat(path, " is not a bundle directory: it has no "
                                          "nix/runtime/bootstrap.sh"));
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Field 22 of /proc/<pid>/stat: tells a live process from a later one that
// reused its pid ("" when there is no such process).
std::string StartTime(pid_t pid) {
  const std::string stat = ReadText(absl::StrCat("/proc/", pid, "/stat"));
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return "";
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(stat).substr(paren + 1), ' ', absl::SkipEmpty());
  return fields.size() > 19 ? std::string(fields[19]) : "";
}

// Direct children of `pid` (all its threads).
std::vector<pid_t> Children(pid_t pid) {
  std::vector<pid_t> out;
  DIR* dir = ::opendir(absl::StrCat("/proc/", pid, "/task").c_str());
  if (dir == nullptr) return out;
  while (dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    const std::string text =
        ReadText(absl::StrCat("/proc/", pid, "/task/", entry->d_name, "/children"));
    for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
      int child;
      if (absl::SimpleAtoi(word, &child)) out.push_back(child);
    }
  }
  ::closedir(dir);
  return out;
}

void Signal(pid_t pid, int signum) {
  if (pid > 0) ::kill(pid, signum);
}

// rm -rf `name` under `parent_fd` without following symlinks.
void RemoveAt(int parent_fd, const char* name) {
  if (::unlinkat(parent_fd, name, 0) == 0 || errno == ENOENT) return;
  int fd = ::openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) {
    DIR* dir = ::fdopendir(fd);
    if (dir != nullptr) {
      std::vector<std::string> names;
      while (dirent* entry = ::readdir(dir)) {
        if (strcmp(entry->d_name, ".") && strcmp(entry->d_name, "..")) names.push_back(entry->d_name);
      }
      for (const std::string& child : names) RemoveAt(::dirfd(dir), child.c_str());
      ::closedir(dir);
    } else {
      ::close(fd);
    }
  }
  ::unlinkat(parent_fd, name, AT_REMOVEDIR);
}

void RemoveTree(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string parent = slash == 0 ? "/" : path.substr(0, slash);
  int fd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  RemoveAt(fd, path.c_str() + slash + 1);
  ::close(fd);
}

// What state.json records (for ListOwned and Destroy after a restart).
struct Record {
  std::string id, uid, instance;
  pid_t bwrap_pid = 0;
  std::string bwrap_start;
  pid_t init_pid = 0;
  std::map<std::string, std::string> cgroups;  // controller -> dir
};

absl::Status WriteRecord(const std::string& dir, const Record& r) {
  google::protobuf::Struct s;
  auto& f = *s.mutable_fields();
  f["id"].set_string_value(r.id);
  f["uid"].set_string_value(r.uid);
  f["instance"].set_string_value(r.instance);
  f["bwrap_pid"].set_number_value(r.bwrap_pid);
  f["bwrap_start"].set_string_value(r.bwrap_start);
  f["init_pid"].set_number_value(r.init_pid);
  auto& cg = *f["cgroups"].mutable_struct_value()->mutable_fields();
  for (const auto& [controller, path] : r.cgroups) cg[controller].set_string_value(path);
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(s, &json).ok()) {
    return absl::InternalError("cannot encode state.json");
  }
  const std::string tmp = absl::StrCat(dir, "/", kStateFile, ".tmp");
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return absl::InternalError(Errno("open " + tmp));
  const bool ok = ::write(fd, json.data(), json.size()) == static_cast<ssize_t>(json.size());
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), absl::StrCat(dir, "/", kStateFile).c_str()) != 0) {
    return absl::InternalError(Errno("write state.json in " + dir));
  }
  return absl::OkStatus();
}

std::optional<Record> ReadRecord(const std::string& dir) {
  int fd = ::open(absl::StrCat(dir, "/", kStateFile).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string json(64 << 10, '\0');
  ssize_t n = ::read(fd, json.data(), json.size());
  ::close(fd);
  if (n <= 0) return std::nullopt;
  json.resize(n);
  google::protobuf::Struct s;
  if (!google::protobuf::util::JsonStringToMessage(json, &s).ok()) return std::nullopt;
  auto& f = s.fields();
  auto str = [&](const char* k) { auto it = f.find(k); return it == f.end() ? std::string() : it->second.string_value(); };
  auto num = [&](const char* k) { auto it = f.find(k); return it == f.end() ? 0 : static_cast<pid_t>(it->second.number_value()); };
  Record r;
  r.id = str("id");
  r.uid = str("uid");
  r.instance = str("instance");
  r.bwrap_pid = num("bwrap_pid");
  r.bwrap_start = str("bwrap_start");
  r.init_pid = num("init_pid");
  auto cg = f.find("cgroups");
  if (cg != f.end()) {
    for (const auto& [controller, path] : cg->second.struct_value().fields()) {
      r.cgroups[controller] = path.string_value();
    }
  }
  if (!ValidId(r.id)) return std::nullopt;
  return r;
}

std::string RefValue(const std::string& id, const std::string& uid) {
  return uid.empty() ? id : absl::StrCat(id, ":", uid);
}
std::string RefId(const BackendRef& ref) {
  return std::string(absl::string_view(ref.value).substr(0, ref.value.find(':')));
}

// A thread that runs posted closures in order, for the process's lifetime.
class LauncherThread {
 public:
  LauncherThread() : thread_([this] { Run(); }) {}
  ~LauncherThread() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  // Runs `task` on the thread and waits for it.
  void RunAndWait(std::function<void()> task) {
    bool done = false;
    {
      absl::MutexLock lock(&mu_);
      tasks_.push_back([&] {
        task();
        absl::MutexLock inner(&mu_);
        done = true;
      });
    }
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done));
  }

 private:
  void Run() {
    while (true) {
      std::function<void()> task;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_ || !tasks_.empty(); };
        mu_.Await(absl::Condition(&ready));
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

struct Sandbox {
  Record record;
  std::string dir;
  std::shared_ptr<SandboxLog> log;
  UniqueFd pidfd;
  UniqueFd log_fd;  // the output pipe's read end
  bool exited = false;
  bool log_eof = false;
  bool reported = false;
  bool linked = false;  // the `run` symlink exists
  // Held while the drain reads log_fd, and to close it.
  absl::Mutex io_mu;
  int exit_code = 0;
  bool oom_killed = false;
  absl::Time exit_time;
};

class LocalBackend final : public Backend {
 public:
  explicit LocalBackend(LocalBackendOptions options) : options_(std::move(options)) {}
  ~LocalBackend() override { Shutdown(); }

  absl::Status Init();

  absl::string_view name() const override { return "local"; }
  absl::StatusOr<pb::BackendCapabilities> Probe() override;
  absl::Status Validate(const LaunchSpec& spec) const override;
  absl::StatusOr<BackendRef> Launch(const LaunchSpec& spec, absl::Time deadline) override;
  absl::StatusOr<pb::Endpoint> ResolveEndpoint(const BackendRef& ref) override;
  absl::StatusOr<Observed> Inspect(const BackendRef& ref) override;
  absl::Status Destroy(const BackendRef& ref, absl::Duration grace) override;
  absl::StatusOr<std::vector<BackendRef>> ListOwned(absl::string_view instance) override;
  absl::Status Watch(EventSink* sink) override;
  absl::Status StreamLogs(const BackendRef& ref, int64_t offset, bool follow,
                          LogSink* sink) override;
  std::string LogTail(const BackendRef& ref, size_t max_bytes) override;
  void Shutdown() override;

 private:
  // Why a controller cannot be used ("" when it can).
  std::string Unusable(const std::string& controller) const {
    auto it = unusable_.find(controller);
    return it == unusable_.end() ? "" : it->second;
  }
  absl::Status MakeCgroups(const LaunchSpec& spec, Record& record);
  absl::Status Start(const LaunchSpec& spec, const std::string& root,
                     const std::string& nix_dir, std::shared_ptr<Sandbox> sandbox,
                     absl::Time deadline);
  std::shared_ptr<Sandbox> Find(const std::string& id) {
    absl::MutexLock lock(&mu_);
    auto it = sandboxes_.find(id);
    return it == sandboxes_.end() ? nullptr : it->second;
  }
  void WatchLoop();
  void OnPidfd(const std::shared_ptr<Sandbox>& sandbox);
  void OnLog(const std::shared_ptr<Sandbox>& sandbox);
  // Reports an exit once both the process and its output ended (or the
  // output outlived drain_grace). Called with mu_ held; returns what to send.
  std::optional<std::pair<BackendRef, Observed>> ReportLocked(Sandbox& sandbox)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Send(std::optional<std::pair<BackendRef, Observed>> event);
  void Unregister(Sandbox& sandbox) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void KillAndRemove(const Record& record, const std::string& dir);

  const LocalBackendOptions options_;
  std::string bwrap_;  // resolved path
  std::map<std::string, std::string> own_;       // controller -> own cgroup
  std::map<std::string, std::string> unusable_;  // controller -> why
  rlim_t nofile_hard_ = RLIM_INFINITY;

  std::unique_ptr<LauncherThread> launcher_;
  UniqueFd epoll_;
  UniqueFd wake_;  // eventfd: stop
  std::thread watcher_;

  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Sandbox>> sandboxes_ ABSL_GUARDED_BY(mu_);
  // epoll keys -> (sandbox, is pidfd)
  std::map<uint64_t, std::pair<std::shared_ptr<Sandbox>, bool>> keys_ ABSL_GUARDED_BY(mu_);
  uint64_t next_key_ ABSL_GUARDED_BY(mu_) = 1;
  EventSink* sink_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

absl::Status LocalBackend::Init() {
  if (options_.state_dir.empty() || options_.state_dir[0] != '/') {
    return absl::InvalidArgumentError("local backend: state_dir must be an absolute path");
  }
  if (options_.state_dir.size() + 1 + 63 + strlen("/run/agentix.sock") > kMaxSocketPath) {
    return absl::InvalidArgumentError(absl::StrCat(
        "local backend: state_dir ", options_.state_dir,
        " is too long: <state_dir>/<63-char id>/run/agentix.sock must fit 107 bytes"));
  }
  if (options_.cgroup_parent.empty() ||
      absl::StrContains(absl::StrCat("/", options_.cgroup_parent, "/"), "/../")) {
    return absl::InvalidArgumentError("local backend: cgroup_parent must be a relative cgroup name");
  }
  if (options_.log_max_bytes < (16 << 10) || options_.tmp_bytes <= 0 ||
      options_.run_bytes <= 0 || options_.shm_bytes <= 0 ||
      options_.default_pids_max < 0 || options_.default_memory_bytes < 0) {
    return absl::InvalidArgumentError(
        "local backend: log_max_bytes must be >= 16 KiB, tmpfs sizes > 0, defaults >= 0");
  }
  if (options_.seccomp && SeccompMachine().empty()) {
    return absl::InvalidArgumentError(
        "local backend: no seccomp filter for this architecture; turn seccomp off to run without");
  }
  bwrap_ = options_.bwrap;
  if (bwrap_.find('/') == std::string::npos) {
    const char* path = ::getenv("PATH");
    for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':')) {
      const std::string candidate = absl::StrCat(dir, "/", bwrap_);
      if (::access(candidate.c_str(), X_OK) == 0) {
        bwrap_ = candidate;
        break;
      }
    }
  }
  if (::access(bwrap_.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bubblewrap not found (", options_.bwrap, "): install it with `apt-get install bubblewrap`"));
  }
  if (::mkdir(options_.state_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(Errno("mkdir " + options_.state_dir));
  }
  struct stat st;
  if (::lstat(options_.state_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
      st.st_uid != ::getuid() || (st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        options_.state_dir, " must be a directory owned by uid ", ::getuid(), " with mode 0700"));
  }
  const std::string self = ReadText("/proc/self/cgroup");
  for (const char* controller : kControllers) {
    auto own = OwnCgroup(self, controller);
    if (own) own_[controller] = *own;
    std::string why = CgroupUnusable(options_.cgroup_root, controller, own);
    if (!why.empty()) unusable_[controller] = why;
  }
  struct rlimit limit;
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0) nofile_hard_ = limit.rlim_max;

  launcher_ = std::make_unique<LauncherThread>();
  epoll_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  wake_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!epoll_.valid() || !wake_.valid()) return absl::InternalError(Errno("epoll/eventfd"));
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.u64 = 0;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &event);
  watcher_ = std::thread([this] { WatchLoop(); });
  return absl::OkStatus();
}

absl::StatusOr<pb::BackendCapabilities> LocalBackend::Probe() {
  pb::BackendCapabilities caps;
  caps.set_name("local");
  caps.set_memory_limit(Unusable("memory").empty());
  caps.set_pids_limit(Unusable("pids").empty());
  caps.set_cpu_limit(Unusable("cpu").empty());
  caps.set_gpu(false);
  caps.set_network_none(true);
  caps.set_network_host(true);
  caps.set_network_bridge(false);
  caps.set_egress_policy(false);
  caps.set_scratch_limit(true);
  caps.set_nofile_limit(true);
  // `bwrap --version`: "bubblewrap 0.8.0".
  int out[2];
  if (::pipe2(out, O_CLOEXEC) == 0) {
    UniqueFd read_end(out[0]), write_end(out[1]);
    base::SpawnOptions spawn;
    spawn.path = bwrap_;
    spawn.argv = {bwrap_, "--version"};
    spawn.env = {"PATH=/usr/bin:/bin"};
    spawn.fd_map = {{write_end.get(), 1}};
    auto child = base::ChildProcess::Spawn(spawn);
    write_end.Reset();
    if (child.ok()) {
      std::string text;
      char buf[256];
      ssize_t n;
      while ((n = ::read(read_end.get(), buf, sizeof(buf))) > 0 && text.size() < 4096) text.append(buf, n);
      (void)child->AwaitExit(absl::Seconds(5));
      caps.set_version(absl::StrCat(absl::StripAsciiWhitespace(text),
                                    "; seccomp ", options_.seccomp ? SeccompMachine() : "off"));
    }
  }
  std::vector<std::string> missing;
  for (const auto& [controller, why] : unusable_) missing.push_back(why);
  missing.push_back("no GPU support; BRIDGE networking and egress lists are not implemented");
  caps.set_detail(absl::StrJoin(missing, "; "));
  return caps;
}

absl::Status LocalBackend::Validate(const LaunchSpec& launch) const {
  const pb::SandboxSpec& spec = launch.spec;
  auto invalid = [](std::string message) {
    return ProviderError(absl::StatusCode::kInvalidArgument, kReasonInvalidSpec, message);
  };
  auto unenforceable = [](std::string message) {
    return ProviderError(absl::StatusCode::kFailedPrecondition, kReasonLimitNotEnforceable, message);
  };
  if (!ValidId(launch.sandbox_id)) {
    return invalid(absl::StrCat("sandbox id '", launch.sandbox_id, "' must match [a-z0-9-]{1,63}"));
  }
  if (launch.admin_token.size() > kMaxToken) {
    return invalid("admin token longer than 4096 bytes");
  }
  if (auto root = RootDir(spec.image()); !root.ok()) return root.status();
  if (auto nix = NixDir(spec.bundle()); !nix.ok()) return nix.status();
  if (!PlatformMatches(spec.platform())) {
    return ProviderError(absl::StatusCode::kFailedPrecondition, kReasonInvalidSpec,
                         absl::StrCat("the local backend runs sandboxes on this machine (",
                                      MachinePlatform(), "); platform '", spec.platform(),
                                      "' cannot be honoured"));
  }
  const pb::Resources& r = spec.resources();
  if (r.cpu_millis() < 0 || r.memory_bytes() < 0 || r.pids() < 0 || r.gpus() < 0 ||
      r.scratch_bytes() < 0 || r.nofile() < 0) {
    return invalid("resources must not be negative");
  }
  if (r.gpus() > 0) return unenforceable("the local backend has no GPU support (resources.gpus must be 0)");
  const pb::Network& net = spec.network();
  if (net.mode() == pb::Network::BRIDGE) {
    return unenforceable("the local backend has no BRIDGE networking (use NONE or HOST)");
  }
  if (net.allow_egress_cidrs_size() > 0 || net.deny_egress_cidrs_size() > 0) {
    return unenforceable("the local backend cannot enforce egress lists");
  }
  if (r.nofile() > 0 && nofile_hard_ != RLIM_INFINITY &&
      static_cast<rlim_t>(r.nofile()) > nofile_hard_) {
    return unenforceable(absl::StrCat("resources.nofile ", r.nofile(),
                                      " is above providerd's hard limit ", nofile_hard_,
                                      " (it can only be lowered)"));
  }
  if (options_.require_limits) {
    const std::pair<const char*, bool> wanted[] = {
        {"memory", r.memory_bytes() > 0 || options_.default_memory_bytes > 0},
        {"pids", r.pids() > 0},
        {"cpu", r.cpu_millis() > 0}};
    for (const auto& [controller, asked] : wanted) {
      if (asked && !Unusable(controller).empty()) {
        return unenforceable(absl::StrCat(
            controller, " limit not enforceable here: ", Unusable(controller),
            " (run where cgroup v1 is writable, or start providerd without require_limits)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status LocalBackend::MakeCgroups(const LaunchSpec& launch, Record& record) {
  const pb::Resources& r = launch.spec.resources();
  struct Want {
    const char* controller;
    std::vector<std::pair<const char*, std::string>> files;
    bool requested;
  };
  std::vector<Want> wants;
  const int64_t memory = r.memory_bytes() > 0 ? r.memory_bytes() : options_.default_memory_bytes;
  if (memory > 0) {
    // The operator's default counts as asked for too, as in local.py.
    wants.push_back({"memory", {{"memory.limit_in_bytes", std::to_string(memory)}}, true});
  }
  const int64_t pids = r.pids() > 0 ? r.pids() : options_.default_pids_max;
  if (pids > 0) wants.push_back({"pids", {{"pids.max", std::to_string(pids)}}, r.pids() > 0});
  if (r.cpu_millis() > 0) {
    wants.push_back({"cpu",
                     {{"cpu.cfs_period_us", "100000"},
                      {"cpu.cfs_quota_us", std::to_string(std::max<int64_t>(1000, r.cpu_millis() * 100))}},
                     true});
  }
  for (const Want& want : wants) {
    std::string problem = Unusable(want.controller);
    std::string dir;
    if (problem.empty()) {
      dir = SandboxCgroupPath(options_.cgroup_root, want.controller, own_.at(want.controller),
                              options_.cgroup_parent, launch.sandbox_id);
      const std::string parent = dir.substr(0, dir.rfind('/'));
      // The shared parent may be removed by a Destroy between the two
      // mkdirs (it removes it once empty): make it again then.
      int made = -1;
      for (int attempt = 0; attempt < 5 && made != 0; ++attempt) {
        ::mkdir(parent.c_str(), 0755);
        made = ::mkdir(dir.c_str(), 0755);
        if (made != 0 && errno == EEXIST) made = 0;
        if (made != 0 && errno != ENOENT) break;
      }
      if (made != 0) {
        problem = Errno("cannot create " + dir);
      } else {
        record.cgroups[want.controller] = dir;
      }
    }
    for (const auto& [file, value] : want.files) {
      if (!problem.empty()) break;
      absl::Status written = WriteCgroupFile(dir, file, value);
      if (!written.ok()) problem = std::string(written.message());
    }
    if (problem.empty() && std::string(want.controller) == "memory") {
      // memory+swap = memory, so swap cannot stretch the limit (absent
      // without swap accounting: nothing to do then).
      (void)WriteCgroupFile(dir, "memory.memsw.limit_in_bytes", want.files[0].second);
    }
    if (problem.empty()) continue;
    const std::string message = absl::StrCat("sandbox ", launch.sandbox_id, ": ",
                                             want.controller, " limit not enforced: ", problem);
    if (want.requested && options_.require_limits) {
      return ProviderError(absl::StatusCode::kFailedPrecondition, kReasonLimitNotEnforceable, message);
    }
    AGX_LOG(Warning, "{}", message);
  }
  return absl::OkStatus();
}

absl::StatusOr<BackendRef> LocalBackend::Launch(const LaunchSpec& launch, absl::Time deadline) {
  if (absl::Status valid = Validate(launch); !valid.ok()) return valid;
  const std::string root = *RootDir(launch.spec.image());
  const std::string nix_dir = *NixDir(launch.spec.bundle());
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return ProviderError(absl::StatusCode::kUnavailable, kReasonShuttingDown, "local backend is shut down");
    if (sandboxes_.count(launch.sandbox_id)) {
      return ProviderError(absl::StatusCode::kAlreadyExists, kReasonSandboxIdTaken,
                           absl::StrCat("local sandbox ", launch.sandbox_id, " exists"));
    }
  }
  auto sandbox = std::make_shared<Sandbox>();
  sandbox->dir = absl::StrCat(options_.state_dir, "/", launch.sandbox_id);
  Record& record = sandbox->record;
  record.id = launch.sandbox_id;
  record.uid = launch.uid;
  record.instance = launch.instance;
  if (::mkdir(sandbox->dir.c_str(), 0700) != 0) {
    if (errno == EEXIST) {
      return ProviderError(absl::StatusCode::kAlreadyExists, kReasonSandboxIdTaken,
                           absl::StrCat(sandbox->dir, " exists (a leftover: destroy it first)"));
    }
    return absl::FailedPreconditionError(Errno("mkdir " + sandbox->dir));
  }
  // Recorded before and after the cgroups are made, so a providerd killed
  // in between leaves a leftover ListOwned finds.
  absl::Status made = WriteRecord(sandbox->dir, record);
  if (made.ok()) made = MakeCgroups(launch, record);
  if (made.ok()) made = WriteRecord(sandbox->dir, record);  // before anything runs
  if (made.ok()) made = Start(launch, root, nix_dir, sandbox, deadline);
  if (!made.ok()) {
    // Undo everything: the registered sandbox (killed and reaped), or the
    // directory and cgroups made so far.
    (void)Destroy(BackendRef{RefValue(record.id, record.uid)}, absl::ZeroDuration());
    return made;
  }
  return BackendRef{RefValue(record.id, record.uid)};
}

absl::Status LocalBackend::Start(const LaunchSpec& launch, const std::string& root,
                                 const std::string& nix_dir, std::shared_ptr<Sandbox> sandbox,
                                 absl::Time deadline) {
  Record& record = sandbox->record;
  // The pipes are CLOEXEC: only the launcher's child gets them (dup2-ed
  // to fixed numbers), nothing providerd spawns elsewhere.
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return absl::ResourceExhaustedError(Errno("pipe"));
  UniqueFd token_read(p[0]), token_write(p[1]);
  if (::write(token_write.get(), launch.admin_token.data(), launch.admin_token.size()) !=
      static_cast<ssize_t>(launch.admin_token.size())) {
    return absl::InternalError(Errno("write token pipe"));
  }
  token_write.Reset();  // the daemon reads it to the end
  if (::pipe2(p, O_CLOEXEC) != 0) return absl::ResourceExhaustedError(Errno("pipe"));
  UniqueFd info_read(p[0]), info_write(p[1]);
  if (::pipe2(p, O_CLOEXEC) != 0) return absl::ResourceExhaustedError(Errno("pipe"));
  UniqueFd log_read(p[0]), log_write(p[1]);
  if (::pipe2(p, O_CLOEXEC) != 0) return absl::ResourceExhaustedError(Errno("pipe"));
  UniqueFd error_read(p[0]), error_write(p[1]);
  UniqueFd seccomp;
  if (options_.seccomp) {
    auto fd = FilterFd();
    if (!fd.ok()) return fd.status();
    seccomp = std::move(*fd);
  }
  UniqueFd null_fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  // The child joins by writing "0" (itself). On a v1 hierarchy it writes the
  // `tasks` file: the forked child has one thread, so that moves the whole
  // process, and the kernel moves the current thread without the global
  // threadgroup lock, whose RCU grace period made every cgroup.procs join
  // cost ~11 ms of a cold create. v2 has no `tasks`: cgroup.procs there.
  std::vector<UniqueFd> procs;
  for (const auto& [controller, dir] : record.cgroups) {
    procs.emplace_back(::open(absl::StrCat(dir, "/tasks").c_str(), O_WRONLY | O_CLOEXEC));
    if (procs.back().valid()) continue;
    procs.back().Reset(::open(absl::StrCat(dir, "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
    if (!procs.back().valid()) return absl::FailedPreconditionError(Errno("open " + dir + "/cgroup.procs"));
  }

  BwrapArgs args;
  args.bwrap = bwrap_;
  args.sandbox_id = launch.sandbox_id;
  args.root = root;
  args.nix_dir = nix_dir;
  args.share_net = launch.spec.network().mode() == pb::Network::HOST;
  args.seccomp_fd = seccomp.valid() ? kSeccompChildFd : -1;
  args.info_fd = kInfoChildFd;
  args.token_fd = kTokenChildFd;
  args.token_flag = options_.token_flag;
  args.tmp_bytes = launch.spec.resources().scratch_bytes() > 0
                       ? launch.spec.resources().scratch_bytes() : options_.tmp_bytes;
  args.run_bytes = options_.run_bytes;
  args.shm_bytes = options_.shm_bytes;
  args.extra_args = options_.extra_bwrap_args;
  auto argv_or = BuildBwrapArgv(args);
  if (!argv_or.ok()) return argv_or.status();
  const std::vector<std::string>& argv = *argv_or;
  // The environment: cleared, then only the control variables (user env
  // arrives with Activate, so it never forces a cold start).
  const std::vector<std::string> env = {
      "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
      "HOME=/tmp", "TMPDIR=/tmp", "LANG=C.UTF-8",
      absl::StrCat("AGENTIX_SANDBOX_ID=", launch.sandbox_id),
      absl::StrCat("AGENTIX_LISTEN=", kSandboxListen),
  };
  // Everything the child touches is prepared here: after fork in a
  // multi-threaded process it may only make async-signal-safe calls.
  std::vector<char*> c_argv, c_env;
  for (const std::string& a : argv) c_argv.push_back(const_cast<char*>(a.c_str()));
  c_argv.push_back(nullptr);
  for (const std::string& e : env) c_env.push_back(const_cast<char*>(e.c_str()));
  c_env.push_back(nullptr);
  std::vector<int> procs_fds;
  for (const UniqueFd& fd : procs) procs_fds.push_back(fd.get());
  const rlim_t nofile = launch.spec.resources().nofile();
  // (source, target) for the child, in order: stdin, stdout, stderr, 3, 4, 5.
  const int sources[6] = {null_fd.get(), log_write.get(), log_write.get(),
                          seccomp.valid() ? seccomp.get() : -1, token_read.get(), info_write.get()};
  const int error_fd = error_write.get();
  const char* path = bwrap_.c_str();

  pid_t pid = -1;
  int fork_errno = 0;
  launcher_->RunAndWait([&] {
    pid = ::fork();
    if (pid != 0) {
      fork_errno = errno;
      return;
    }
    // The child: join the cgroups first, so nothing of the sandbox runs
    // outside its limits, even briefly.
    auto fail = [error_fd](int stage) {
      int report[2] = {stage, errno};
      (void)!::write(error_fd, report, sizeof(report));
      ::_exit(125);
    };
    for (int fd : procs_fds) {
      if (::write(fd, "0", 1) != 1) fail(1);
    }
    if (nofile > 0) {
      struct rlimit limit;
      if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) fail(2);
      if (nofile < limit.rlim_cur) limit.rlim_cur = nofile;
      if (nofile < limit.rlim_max) limit.rlim_max = nofile;
      if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) fail(2);
    }
    // Two steps, so no source is overwritten before it is copied: up above
    // every target, then down to the targets.
    int high[6];
    for (int i = 0; i < 6; ++i) {
      high[i] = sources[i] < 0 ? -1 : ::fcntl(sources[i], F_DUPFD_CLOEXEC, 16);
      if (sources[i] >= 0 && high[i] < 0) fail(3);
    }
    for (int i = 0; i < 6; ++i) {
      if (high[i] >= 0 && ::dup2(high[i], i) < 0) fail(3);
    }
    if (::fcntl(error_fd, F_SETFD, FD_CLOEXEC) != 0) fail(3);
    // Every other fd: gone at exec (the error pipe reports a failed exec).
    if (::syscall(SYS_close_range, 6u, ~0u, 4u /* CLOSE_RANGE_CLOEXEC */) != 0) fail(4);
    sigset_t all;
    sigemptyset(&all);
    ::sigprocmask(SIG_SETMASK, &all, nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    ::execve(path, c_argv.data(), c_env.data());
    fail(5);
  });
  if (pid < 0) return absl::ResourceExhaustedError(absl::StrCat("fork: ", strerror(fork_errno)));
  error_write.Reset();
  log_write.Reset();
  info_write.Reset();
  token_read.Reset();
  sandbox->pidfd.Reset(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!sandbox->pidfd.valid()) {
    // Without a pidfd the exit would never be seen (Linux >= 5.3 has it).
    const std::string error = Errno("pidfd_open");
    ::kill(pid, SIGKILL);
    int ignored;
    ::waitpid(pid, &ignored, 0);
    return absl::FailedPreconditionError(absl::StrCat("sandbox ", record.id, ": ", error));
  }
  record.bwrap_pid = pid;
  record.bwrap_start = StartTime(pid);
  sandbox->log = std::make_shared<SandboxLog>(sandbox->dir, options_.log_max_bytes);
  sandbox->log_fd = std::move(log_read);
  ::fcntl(sandbox->log_fd.get(), F_SETFL, O_NONBLOCK);
  {
    absl::MutexLock lock(&mu_);
    sandboxes_[record.id] = sandbox;
    for (bool is_pidfd : {true, false}) {
      const int fd = is_pidfd ? sandbox->pidfd.get() : sandbox->log_fd.get();
      if (fd < 0) continue;
      const uint64_t key = next_key_++;
      keys_[key] = {sandbox, is_pidfd};
      epoll_event event{};
      event.events = EPOLLIN;
      event.data.u64 = key;
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &event);
    }
  }
  int report[2] = {0, 0};
  ssize_t n;
  do n = ::read(error_read.get(), report, sizeof(report));
  while (n < 0 && errno == EINTR);
  if (n > 0) {
    static const char* const kStages[] = {"", "join its cgroups", "set RLIMIT_NOFILE",
                                          "pass its fds", "close fds", "exec bwrap"};
    return ProviderError(absl::StatusCode::kFailedPrecondition, kReasonStartFailed,
                         absl::StrCat("sandbox ", record.id, ": the launcher could not ",
                                      kStages[std::min(report[0], 5)], ": ", strerror(report[1])));
  }
  // bwrap writes {"child-pid": N} once it has cloned the namespace's init.
  std::string info;
  char buf[512];
  while (true) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    pollfd pfd{info_read.get(), POLLIN, 0};
    const int polled = ms <= 0 ? 0 : ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(ms, 60000)));
    if (polled < 0 && errno == EINTR) continue;
    if (polled == 0) {
      return ProviderError(absl::StatusCode::kDeadlineExceeded, kReasonStartFailed,
                           absl::StrCat("sandbox ", record.id, ": bwrap did not start in time"));
    }
    n = ::read(info_read.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || info.size() > 8192) break;
    info.append(buf, n);
  }
  const size_t key = info.find("\"child-pid\"");
  int init = 0;
  if (key != std::string::npos) {
    const size_t colon = info.find(':', key);
    const size_t end = info.find_first_of(",\n}", colon);
    if (colon != std::string::npos) {
      (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(
                                 absl::string_view(info).substr(colon + 1, end - colon - 1)), &init);
    }
  }
  if (init <= 0) {
    // bwrap failed before it cloned: its output says why.
    {
      absl::MutexLock lock(&mu_);
      auto done = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return sandbox->exited && sandbox->log_eof;
      };
      mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(2));
    }
    return ProviderError(absl::StatusCode::kFailedPrecondition, kReasonStartFailed,
                         absl::StrCat("sandbox ", record.id, ": bwrap failed; its output ends with:\n",
                                      sandbox->log->Tail(8192)));
  }
  {
    absl::MutexLock lock(&mu_);
    record.init_pid = init;
  }
  return WriteRecord(sandbox->dir, record);
}

void LocalBackend::WatchLoop() {
  epoll_event events[64];
  while (true) {
    const int n = ::epoll_wait(epoll_.get(), events, 64, 200);
    std::vector<std::pair<std::shared_ptr<Sandbox>, bool>> ready;
    std::vector<std::optional<std::pair<BackendRef, Observed>>> late;
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) return;
      for (int i = 0; i < n; ++i) {
        auto it = keys_.find(events[i].data.u64);
        if (it != keys_.end()) ready.push_back(it->second);
      }
      // An exit whose output did not end within drain_grace is reported anyway.
      for (auto& [id, sandbox] : sandboxes_) {
        if (sandbox->exited && !sandbox->reported &&
            absl::Now() - sandbox->exit_time > options_.drain_grace) {
          late.push_back(ReportLocked(*sandbox));
        }
      }
    }
    for (auto& [sandbox, is_pidfd] : ready) {
      if (is_pidfd) {
        OnPidfd(sandbox);
      } else {
        OnLog(sandbox);
      }
    }
    for (auto& event : late) Send(std::move(event));
  }
}

void LocalBackend::OnPidfd(const std::shared_ptr<Sandbox>& sandbox) {
  {
    absl::MutexLock lock(&mu_);
    if (sandbox->exited || !sandbox->pidfd.valid()) return;
  }
  int status = 0;
  pid_t pid = sandbox->record.bwrap_pid;
  pid_t reaped;
  do reaped = ::waitpid(pid, &status, WNOHANG);
  while (reaped < 0 && errno == EINTR);
  if (reaped == 0) return;
  int code = reaped < 0 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status)
                                                 : 128 + WTERMSIG(status);
  bool oom = false;
  auto memory = sandbox->record.cgroups.find("memory");
  if (memory != sandbox->record.cgroups.end()) {
    oom = OomKills(ReadCgroupFile(memory->second, "memory.oom_control").value_or("")) > 0;
  }
  std::optional<std::pair<BackendRef, Observed>> event;
  {
    absl::MutexLock lock(&mu_);
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, sandbox->pidfd.get(), nullptr);
    for (auto it = keys_.begin(); it != keys_.end();) {
      it = it->second.first == sandbox && it->second.second ? keys_.erase(it) : std::next(it);
    }
    sandbox->pidfd.Reset();
    sandbox->exited = true;
    sandbox->exit_code = code;
    sandbox->oom_killed = oom;
    sandbox->exit_time = absl::Now();
    if (sandbox->log_eof) event = ReportLocked(*sandbox);
  }
  Send(std::move(event));
}

void LocalBackend::OnLog(const std::shared_ptr<Sandbox>& sandbox) {
  char buf[1 << 16];
  bool eof = false;
  absl::ReleasableMutexLock io(&sandbox->io_mu);
  if (!sandbox->log_fd.valid()) return;
  // Bounded per wake-up so one chatty sandbox cannot starve the others.
  for (int round = 0; round < 16; ++round) {
    ssize_t n = ::read(sandbox->log_fd.get(), buf, sizeof(buf));
    if (n > 0) {
      sandbox->log->Append(absl::string_view(buf, n));
      continue;
    }
    if (n < 0 && (errno == EINTR)) continue;
    if (n < 0 && errno == EAGAIN) break;
    eof = true;
    break;
  }
  io.Release();
  if (!eof) return;
  sandbox->log->Close();
  std::optional<std::pair<BackendRef, Observed>> event;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = keys_.begin(); it != keys_.end();) {
      it = it->second.first == sandbox && !it->second.second ? keys_.erase(it) : std::next(it);
    }
    {
      absl::MutexLock io_lock(&sandbox->io_mu);
      if (sandbox->log_fd.valid()) ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, sandbox->log_fd.get(), nullptr);
      sandbox->log_fd.Reset();
    }
    sandbox->log_eof = true;
    if (sandbox->exited) event = ReportLocked(*sandbox);
  }
  Send(std::move(event));
}

std::optional<std::pair<BackendRef, Observed>> LocalBackend::ReportLocked(Sandbox& sandbox) {
  if (sandbox.reported) return std::nullopt;
  sandbox.reported = true;
  Observed observed;
  observed.state = Observed::State::kExited;
  observed.exit_code = sandbox.oom_killed ? 137 : sandbox.exit_code;
  observed.oom_killed = sandbox.oom_killed;
  observed.reason = sandbox.oom_killed
                        ? "OOM-killed (memory.oom_control oom_kill > 0)"
                        : absl::StrCat("bwrap exited with code ", sandbox.exit_code);
  return std::make_pair(BackendRef{RefValue(sandbox.record.id, sandbox.record.uid)}, observed);
}

void LocalBackend::Send(std::optional<std::pair<BackendRef, Observed>> event) {
  if (!event) return;
  EventSink* sink;
  {
    absl::MutexLock lock(&mu_);
    sink = sink_;
  }
  if (sink != nullptr) sink->OnObserved(event->first, event->second);
}

absl::StatusOr<pb::Endpoint> LocalBackend::ResolveEndpoint(const BackendRef& ref) {
  std::shared_ptr<Sandbox> sandbox = Find(RefId(ref));
  if (sandbox == nullptr) {
    return ProviderError(absl::StatusCode::kNotFound, kReasonSandboxNotFound,
                         absl::StrCat("no local sandbox ", ref.value));
  }
  pid_t init;
  bool linked;
  {
    absl::MutexLock lock(&mu_);
    if (sandbox->exited) {
      return ProviderError(absl::StatusCode::kFailedPrecondition, kReasonTerminated,
                           absl::StrCat("sandbox ", sandbox->record.id, " exited with code ",
                                        sandbox->exit_code));
    }
    init = sandbox->record.init_pid;
    linked = sandbox->linked;
  }
  const std::string run = sandbox->dir + "/run";
  if (!linked) {
    // Only once the init has forked the entry point: bwrap forks it after
    // the mounts and pivot_root, so the path cannot reach providerd's own
    // /run/agentix in the meantime.
    if (init <= 0 || Children(init).empty()) {
      return absl::UnavailableError(absl::StrCat("sandbox ", sandbox->record.id, " is starting"));
    }
    if (::symlink(absl::StrCat("/proc/", init, "/root", kSandboxRunDir).c_str(), run.c_str()) != 0 &&
        errno != EEXIST) {
      return absl::InternalError(Errno("symlink " + run));
    }
    absl::MutexLock lock(&mu_);
    sandbox->linked = true;
  }
  // A real socket: the sandbox owns the directory, and a symlink there
  // would send providerd to some other socket on the host.
  const std::string socket = run + "/agentix.sock";
  struct stat st;
  if (::lstat(socket.c_str(), &st) != 0) {
    return absl::UnavailableError(absl::StrCat("sandbox ", sandbox->record.id,
                                               ": its daemon's socket is not there yet"));
  }
  if (!S_ISSOCK(st.st_mode)) {
    // Still UNAVAILABLE: the daemon may yet replace it; until then the
    // start waits and times out with this as its last word.
    return absl::UnavailableError(absl::StrCat(
        "sandbox ", sandbox->record.id, ": ", kSandboxRunDir, "/agentix.sock is not a socket but ",
        S_ISLNK(st.st_mode) ? "a symlink" : "another kind of file", " (not trusted)"));
  }
  pb::Endpoint endpoint;
  endpoint.set_target("unix://" + socket);
  endpoint.set_authority("localhost");
  return endpoint;
}

absl::StatusOr<Observed> LocalBackend::Inspect(const BackendRef& ref) {
  Observed observed;
  observed.node = "local";
  if (std::shared_ptr<Sandbox> sandbox = Find(RefId(ref))) {
    absl::MutexLock lock(&mu_);
    if (sandbox->exited) {
      observed.state = Observed::State::kExited;
      observed.exit_code = sandbox->oom_killed ? 137 : sandbox->exit_code;
      observed.oom_killed = sandbox->oom_killed;
    } else {
      observed.state = sandbox->linked ? Observed::State::kRunning : Observed::State::kCreating;
    }
    return observed;
  }
  const std::string dir = absl::StrCat(options_.state_dir, "/", RefId(ref));
  std::optional<Record> record = ValidId(RefId(ref)) ? ReadRecord(dir) : std::nullopt;
  if (!record) {
    observed.state = Observed::State::kMissing;
    return observed;
  }
  // A leftover of an earlier providerd: its processes died with it.
  const bool alive = record->bwrap_pid > 0 && !record->bwrap_start.empty() &&
                     StartTime(record->bwrap_pid) == record->bwrap_start;
  observed.state = alive ? Observed::State::kRunning : Observed::State::kExited;
  observed.reason = alive ? "not launched by this providerd" : "left over by an earlier providerd";
  return observed;
}

void LocalBackend::KillAndRemove(const Record& record, const std::string& dir) {
  // The bwrap of a record is only killed while its pid still names it.
  if (record.bwrap_pid > 0 && !record.bwrap_start.empty() &&
      StartTime(record.bwrap_pid) == record.bwrap_start) {
    for (pid_t init : Children(record.bwrap_pid)) Signal(init, SIGKILL);
    Signal(record.bwrap_pid, SIGKILL);
  }
  // Nothing can leave a pid namespace, but be sure: everything in the
  // sandbox's cgroups (a cgroup lists only its own tasks).
  for (int round = 0; round < 3; ++round) {
    bool any = false;
    for (const auto& [controller, path] : record.cgroups) {
      for (pid_t pid : CgroupPids(path)) {
        Signal(pid, SIGKILL);
        any = true;
      }
    }
    if (!any) break;
    ::usleep(5000);
  }
  for (const auto& [controller, path] : record.cgroups) {
    absl::Status removed = RemoveCgroup(path);
    if (!removed.ok()) AGX_LOG(Warning, "sandbox {}: {}", record.id, std::string(removed.message()));
  }
  RemoveTree(dir);
}

absl::Status LocalBackend::Destroy(const BackendRef& ref, absl::Duration grace) {
  const std::string id = RefId(ref);
  if (!ValidId(id)) return absl::OkStatus();  // nothing of ours has that name
  const std::string dir = absl::StrCat(options_.state_dir, "/", id);
  std::shared_ptr<Sandbox> sandbox = Find(id);
  if (sandbox == nullptr) {
    // A leftover (or one being made right now by another call): whatever
    // its record says, plus the cgroups this id would have, in case
    // providerd died before it recorded them.
    struct stat st;
    if (::lstat(dir.c_str(), &st) != 0) return absl::OkStatus();
    Record record = ReadRecord(dir).value_or(Record{});
    record.id = id;
    for (const char* controller : kControllers) {
      auto own = own_.find(controller);
      if (own != own_.end() && !record.cgroups.count(controller)) {
        record.cgroups[controller] = SandboxCgroupPath(options_.cgroup_root, controller,
                                                       own->second, options_.cgroup_parent, id);
      }
    }
    KillAndRemove(record, dir);
    return absl::OkStatus();
  }
  pid_t bwrap, init;
  {
    absl::MutexLock lock(&mu_);
    bwrap = sandbox->exited ? 0 : sandbox->record.bwrap_pid;
    init = sandbox->record.init_pid;
  }
  auto exited = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return sandbox->exited; };
  if (bwrap > 0) {
    // SIGTERM to the namespace's main processes (the daemon stops its
    // worker on it); after `grace`, SIGKILL the init, which kills the whole
    // pid namespace, then bwrap.
    if (init > 0 && grace > absl::ZeroDuration()) {
      for (pid_t pid : Children(init)) Signal(pid, SIGTERM);
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&exited), grace);
    }
    bool gone;
    {
      absl::MutexLock lock(&mu_);
      gone = sandbox->exited;
    }
    if (!gone) {
      if (init > 0) Signal(init, SIGKILL);
      Signal(bwrap, SIGKILL);
      absl::MutexLock lock(&mu_);
      if (!mu_.AwaitWithTimeout(absl::Condition(&exited), absl::Seconds(10))) {
        AGX_LOG(Error, "sandbox {}: bwrap (pid {}) survived SIGKILL", id, bwrap);
      }
    }
  }
  {
    // Its output ends once every process holding the pipe is gone.
    absl::MutexLock lock(&mu_);
    auto drained = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return sandbox->log_eof; };
    mu_.AwaitWithTimeout(absl::Condition(&drained), options_.drain_grace);
  }
  std::optional<std::pair<BackendRef, Observed>> event;
  {
    absl::MutexLock lock(&mu_);
    Unregister(*sandbox);
    if (sandbox->exited) event = ReportLocked(*sandbox);
    sandboxes_.erase(id);
  }
  Send(std::move(event));
  KillAndRemove(sandbox->record, dir);
  return absl::OkStatus();
}

void LocalBackend::Unregister(Sandbox& sandbox) {
  for (auto it = keys_.begin(); it != keys_.end();) {
    it = it->second.first.get() == &sandbox ? keys_.erase(it) : std::next(it);
  }
  absl::MutexLock io(&sandbox.io_mu);
  for (UniqueFd* fd : {&sandbox.pidfd, &sandbox.log_fd}) {
    if (fd->valid()) ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd->get(), nullptr);
    fd->Reset();
  }
  if (sandbox.log) sandbox.log->Close();
}

absl::StatusOr<std::vector<BackendRef>> LocalBackend::ListOwned(absl::string_view instance) {
  std::vector<BackendRef> refs;
  DIR* dir = ::opendir(options_.state_dir.c_str());
  if (dir == nullptr) return refs;
  std::vector<std::string> names;
  while (dirent* entry = ::readdir(dir)) {
    if (ValidId(entry->d_name)) names.push_back(entry->d_name);
  }
  ::closedir(dir);
  for (const std::string& name : names) {
    std::optional<Record> record = ReadRecord(absl::StrCat(options_.state_dir, "/", name));
    if (record && record->id == name && record->instance == instance) {
      refs.push_back(BackendRef{RefValue(record->id, record->uid)});
    } else if (!record) {
      // Half made: its owner died between mkdir and state.json, after
      // making cgroups perhaps. The state dir is locked to this providerd,
      // so it is ours; Destroy removes it and the cgroups its id names.
      refs.push_back(BackendRef{name});
    }
  }
  return refs;
}

absl::Status LocalBackend::Watch(EventSink* sink) {
  absl::MutexLock lock(&mu_);
  sink_ = sink;
  return absl::OkStatus();
}

absl::Status LocalBackend::StreamLogs(const BackendRef& ref, int64_t offset, bool follow,
                                      LogSink* sink) {
  std::shared_ptr<Sandbox> sandbox = Find(RefId(ref));
  if (sandbox == nullptr) {
    return ProviderError(absl::StatusCode::kNotFound, kReasonSandboxNotFound,
                         absl::StrCat("no local sandbox ", ref.value));
  }
  std::shared_ptr<SandboxLog> log = sandbox->log;
  while (true) {
    SandboxLog::Chunk chunk = log->Read(offset, 64 << 10);
    if (!chunk.data.empty() || chunk.truncated) {
      if (!sink->OnLogData(chunk.offset, chunk.data, chunk.truncated)) return absl::OkStatus();
      offset = chunk.offset + chunk.data.size();
      continue;
    }
    if (chunk.end || !follow) return absl::OkStatus();
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) return absl::OkStatus();
    }
    log->WaitBeyond(offset, absl::Now() + absl::Milliseconds(500));
  }
}

std::string LocalBackend::LogTail(const BackendRef& ref, size_t max_bytes) {
  std::shared_ptr<Sandbox> sandbox = Find(RefId(ref));
  if (sandbox == nullptr || sandbox->log == nullptr) return "";
  return sandbox->log->Tail(max_bytes);
}

void LocalBackend::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    sink_ = nullptr;
  }
  if (wake_.valid()) {
    uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof(one));
  }
  if (watcher_.joinable()) watcher_.join();
  // The launcher thread's exit fires bwrap's --die-with-parent: the
  // sandboxes die with the backend, as they do with providerd.
  launcher_.reset();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> NewLocalBackend(LocalBackendOptions options) {
  auto backend = std::make_unique<LocalBackend>(std::move(options));
  if (absl::Status status = backend->Init(); !status.ok()) return status;
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace agentix::providers::local
