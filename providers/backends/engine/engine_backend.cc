#include "providers/backends/engine/engine_backend.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"
#include "providers/backends/curl_http/curl_http.h"
#include "providers/backends/engine/engine_http.h"
#include "providers/backends/engine/log_demux.h"
#include "providers/core/errors.h"

namespace agentix::providers::engine {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr char kApiPrefix[] = "/v1.41";
constexpr int kMinApiMajor = 1, kMinApiMinor = 41;
constexpr absl::Duration kWatchRetry = absl::Seconds(1);

std::string QueryEscape(absl::string_view value) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : value) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

std::string LabelFilter(absl::string_view instance) {
  std::string label = instance.empty() ? std::string(kLabelManagedBy)
                                       : absl::StrCat(kLabelManagedBy, "=", instance);
  return QueryEscape(json{{"label", json::array({label})}}.dump());
}

int64_t NofileHardLimit() {
  struct rlimit limit;
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_max == RLIM_INFINITY) return 0;
  return static_cast<int64_t>(limit.rlim_max);
}

bool ApiAtLeastFloor(absl::string_view version) {
  std::vector<std::string> parts = absl::StrSplit(version, '.');
  int major = 0, minor = 0;
  if (parts.size() < 2 || !absl::SimpleAtoi(parts[0], &major) ||
      !absl::SimpleAtoi(parts[1], &minor)) {
    return false;
  }
  return major > kMinApiMajor || (major == kMinApiMajor && minor >= kMinApiMinor);
}

std::string StringAt(const json& object, const char* key) {
  if (!object.is_object()) return "";
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

bool BoolAt(const json& object, const char* key, bool fallback) {
  if (!object.is_object()) return fallback;
  auto it = object.find(key);
  return it != object.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

// State of a container from GET /containers/{id}/json.
Observed ObservedFrom(const json& inspect) {
  Observed observed;
  const json& state = inspect.is_object() && inspect.contains("State") ? inspect["State"] : json();
  std::string status = StringAt(state, "Status");
  if (status == "created" || status == "configured" || status == "initialized") {
    observed.state = Observed::State::kCreating;
  } else if (status == "running" || status == "paused" || status == "restarting") {
    observed.state = Observed::State::kRunning;
  } else {
    observed.state = Observed::State::kExited;
    if (state.contains("ExitCode") && state["ExitCode"].is_number_integer()) {
      observed.exit_code = state["ExitCode"].get<int>();
    }
  }
  observed.oom_killed = BoolAt(state, "OOMKilled", false);
  std::string error = StringAt(state, "Error");
  observed.reason = error.empty() ? status : absl::StrCat(status, ": ", error);
  return observed;
}

// Whether the kernel log (/dev/kmsg, readable by root) holds an OOM kill
// whose memory cgroup names `container_id` (docker: /docker/<id>, podman:
// /libpod_parent/libpod-<id>). Reads the ring without blocking.
bool KernelLoggedOomKill(const std::string& container_id) {
  if (container_id.size() < 12) return false;
  int fd = ::open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  bool found = false;
  char record[8192];
  while (!found) {
    ssize_t n = ::read(fd, record, sizeof(record));
    if (n < 0 && errno == EPIPE) continue;  // a record was overwritten meanwhile
    if (n <= 0) break;                       // EAGAIN: the end of the ring
    absl::string_view line(record, static_cast<size_t>(n));
    size_t memcg = line.find("oom_memcg=");
    if (line.find("oom-kill:") == absl::string_view::npos || memcg == absl::string_view::npos) {
      continue;
    }
    absl::string_view path = line.substr(memcg);
    path = path.substr(0, path.find(','));
    found = path.find(container_id) != absl::string_view::npos;
  }
  ::close(fd);
  return found;
}

// Splits a stream of newline-separated JSON documents (GET /events).
class LineSplitter {
 public:
  template <typename Fn>
  void Feed(absl::string_view data, Fn&& on_line) {
    buffer_.append(data.data(), data.size());
    size_t start = 0, end;
    while ((end = buffer_.find('\n', start)) != std::string::npos) {
      on_line(absl::string_view(buffer_).substr(start, end - start));
      start = end + 1;
    }
    buffer_.erase(0, start);
    if (buffer_.size() > (1 << 20)) buffer_.clear();  // no event is this large
  }

 private:
  std::string buffer_;
};

class EngineBackend final : public Backend {
 public:
  explicit EngineBackend(EngineOptions options)
      : options_(std::move(options)),
        http_(options_.socket_path, kApiPrefix),
        nofile_hard_limit_(NofileHardLimit()) {}

  ~EngineBackend() override { Shutdown(); }

  absl::string_view name() const override { return options_.name; }

  absl::StatusOr<pb::BackendCapabilities> Probe() override { return ProbeEngine(); }

  // Containers are the engine's children, not providerd's.
  bool SandboxesSurviveRestart() const override { return true; }

  absl::Status Validate(const LaunchSpec& spec) const override {
    AGX_RETURN_IF_ERROR(ValidateStatic(spec, options_, nofile_hard_limit_));
    AGX_RETURN_IF_ERROR(CheckCapabilities(spec));
    const std::string& image = spec.spec.image();
    AGX_ASSIGN_OR_RETURN(HttpResponse response,
                         Call("GET", absl::StrCat("/images/", image, "/json"), "",
                              options_.request_timeout));
    if (response.status == 404) {
      return ProviderError(
          absl::StatusCode::kFailedPrecondition, kReasonImageNotPresent,
          absl::StrCat("image ", image, " is not present on ", options_.name, " (unix://",
                       options_.socket_path, "); `", options_.name, " load -i FILE` (or `",
                       options_.name, " pull` where a registry is reachable) it first"));
    }
    if (response.status != 200) return HttpError("inspect image " + image, response);
    const std::string& platform = spec.spec.platform();
    if (!platform.empty()) {
      json info = json::parse(response.body, nullptr, false);
      std::string have = NormalizePlatform(StringAt(info, "Os"), StringAt(info, "Architecture"));
      if (have != platform) {
        return NotEnforceable(absl::StrCat("image ", image, " is ", have, ", not ", platform));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<BackendRef> Launch(const LaunchSpec& spec, absl::Time deadline) override {
    // Validate minus the image lookup: create answers 404 for a missing image.
    AGX_RETURN_IF_ERROR(ValidateStatic(spec, options_, nofile_hard_limit_));
    AGX_RETURN_IF_ERROR(CheckCapabilities(spec));
    AGX_ASSIGN_OR_RETURN(std::string nix_dir, BundleNixDir(spec.spec.bundle()));
    // ListOwned must not take this run dir for a leftover while it has no
    // container yet.
    LaunchInFlight in_flight(this, spec.sandbox_id);
    std::string run_dir = RunDir(options_, spec.sandbox_id);
    std::error_code ec;
    fs::create_directories(options_.run_root, ec);
    bool made_dir = ::mkdir(run_dir.c_str(), 0700) == 0;
    if (!made_dir && errno != EEXIST) {
      return absl::InternalError(absl::StrCat("mkdir ", run_dir, ": ", std::strerror(errno)));
    }
    auto undo_dir = [&] {
      if (made_dir) RemoveRunDir(run_dir).IgnoreError();
    };
    if (made_dir && options_.run_dir_tmpfs_bytes > 0) {
      std::string data = absl::StrCat("size=", options_.run_dir_tmpfs_bytes, ",mode=0700");
      if (::mount("tmpfs", run_dir.c_str(), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                  data.c_str()) != 0) {
        int error = errno;
        undo_dir();
        return absl::InternalError(absl::StrCat("mount tmpfs on ", run_dir, ": ",
                                                std::strerror(error)));
      }
    }

    json body = RenderCreateBody(spec, options_, nix_dir, run_dir);
    auto created = Call("POST",
                        absl::StrCat("/containers/create?name=", ContainerName(spec.sandbox_id)),
                        body.dump(), Remaining(deadline));
    if (!created.ok()) {
      // Timed out: the engine may still have made it. Best effort; a
      // leftover is found by ListOwned and adopted by a retry of this uid.
      if (absl::IsDeadlineExceeded(created.status())) {
        RemoveContainer(ContainerName(spec.sandbox_id)).IgnoreError();
      }
      undo_dir();
      return created.status();
    }
    std::string id;
    bool adopted = false;
    if (created->status == 201) {
      id = StringAt(json::parse(created->body, nullptr, false), "Id");
    } else if (created->status == 409 ||
               (created->status == 500 &&
                created->body.find("already in use") != std::string::npos)) {  // podman
      // A retry of this attempt finds its container; another attempt's is not ours.
      auto existing = InspectJson(ContainerName(spec.sandbox_id));
      if (!existing.ok()) {
        undo_dir();
        return existing.status();
      }
      const json& labels = (*existing)["Config"]["Labels"];
      if (StringAt(labels, kLabelUid) != spec.uid) {
        undo_dir();  // only what this call made; the other launch's dir stays
        return ProviderError(absl::StatusCode::kAlreadyExists, kReasonSandboxIdTaken,
                             absl::StrCat(options_.name, ": container ",
                                          ContainerName(spec.sandbox_id),
                                          " already exists for another launch (uid ",
                                          StringAt(labels, kLabelUid), ")"));
      }
      id = StringAt(*existing, "Id");
      // Made but never started (the earlier attempt died in between): it
      // still needs its token file.
      adopted = StringAt((*existing)["State"], "Status") != "created";
    } else {
      undo_dir();
      if (created->status == 404) {
        return ProviderError(absl::StatusCode::kFailedPrecondition, kReasonImageNotPresent,
                             absl::StrCat(options_.name, ": ",
                                          curl_http::JsonErrorMessage(created->body), "; `",
                                          options_.name, " load` the image first"));
      }
      return HttpError("create container", *created);
    }
    if (id.empty()) {
      undo_dir();
      return absl::UnknownError(absl::StrCat(options_.name, ": create answered without an Id"));
    }
    if (!adopted) {
      // A container not started yet: nothing inside reads the dir yet.
      absl::Status prepared = PrepareRunDir(run_dir, spec.admin_token);
      if (!prepared.ok()) {
        RemoveContainer(id).IgnoreError();  // ListOwned finds it if this fails
        undo_dir();
        return prepared;
      }
    }
    Remember(id, spec.sandbox_id);
    auto started = Call("POST", absl::StrCat("/containers/", id, "/start"), "", Remaining(deadline));
    if (started.ok() && (started->status == 204 || started->status == 304)) {
      return BackendRef{id};
    }
    absl::Status failure =
        started.ok()
            ? ProviderError(absl::StatusCode::kFailedPrecondition, kReasonStartFailed,
                            absl::StrCat(options_.name, ": starting ", kEntryPoint, " in ",
                                         spec.spec.image(), " failed: ",
                                         curl_http::JsonErrorMessage(started->body),
                                         Tail(LogTail(BackendRef{id}, 4096))))
            : started.status();
    RemoveContainer(id).IgnoreError();  // ListOwned finds it if this fails
    Forget(id);
    RemoveRunDir(run_dir).IgnoreError();
    return failure;
  }

  absl::StatusOr<pb::Endpoint> ResolveEndpoint(const BackendRef& ref) override {
    AGX_ASSIGN_OR_RETURN(std::string run_dir, RunDirOf(ref));
    std::string socket = absl::StrCat(run_dir, "/", kSocketName);
    struct stat st;
    // lstat: the container can write this directory; a symlink or a file
    // of that name is not the daemon's socket.
    if (::lstat(socket.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) {
      return absl::UnavailableError(absl::StrCat(socket, " is not a socket yet"));
    }
    // The daemon read its admin token before it listened: take the file away.
    ::unlink(absl::StrCat(run_dir, "/", kAdminTokenName).c_str());
    pb::Endpoint endpoint;
    endpoint.set_target(absl::StrCat("unix://", socket));
    return endpoint;
  }

  absl::StatusOr<Observed> Inspect(const BackendRef& ref) override {
    auto inspect = InspectJson(ref.value);
    if (absl::IsNotFound(inspect.status())) {
      Observed missing;
      missing.state = Observed::State::kMissing;
      missing.reason = "container not found";
      return missing;
    }
    if (!inspect.ok()) return inspect.status();
    return Observe(*inspect);
  }

  absl::Status Destroy(const BackendRef& ref, absl::Duration grace) override {
    auto run_dir = RunDirOf(ref);
    if (!run_dir.ok() && !absl::IsNotFound(run_dir.status())) return run_dir.status();
    if (run_dir.ok()) {
      int64_t seconds = (absl::ToInt64Milliseconds(grace) + 999) / 1000;
      if (seconds > 0) {
        // 204 stopped, 304 not running, 404 gone: all fine; the DELETE below
        // kills whatever is left.
        auto stopped = Call("POST", absl::StrCat("/containers/", ref.value, "/stop?t=", seconds),
                            "", grace + options_.request_timeout);
        if (!stopped.ok() && absl::IsUnavailable(stopped.status())) return stopped.status();
      }
      AGX_RETURN_IF_ERROR(RemoveContainer(ref.value));
      AGX_RETURN_IF_ERROR(RemoveRunDir(*run_dir));
    }
    Forget(ref.value);
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<BackendRef>> ListOwned(absl::string_view instance) override {
    AGX_ASSIGN_OR_RETURN(HttpResponse response,
                         Call("GET", absl::StrCat("/containers/json?all=1&filters=",
                                                  LabelFilter(instance)),
                              "", options_.request_timeout));
    if (response.status != 200) return HttpError("list containers", response);
    json list = json::parse(response.body, nullptr, false);
    std::vector<BackendRef> owned;
    std::set<std::string> sandbox_ids;
    if (list.is_array()) {
      for (const json& container : list) {
        std::string id = StringAt(container, "Id");
        std::string sandbox_id = StringAt(container["Labels"], kLabelSandboxId);
        if (id.empty()) continue;
        owned.push_back(BackendRef{id});
        if (!sandbox_id.empty()) {
          Remember(id, sandbox_id);
          sandbox_ids.insert(sandbox_id);
        }
      }
    }
    if (!options_.instance.empty() && instance == options_.instance) {
      RemoveStaleRunDirs(sandbox_ids);
    }
    return owned;
  }

  absl::Status Watch(EventSink* sink) override {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::FailedPreconditionError("backend is shut down");
    if (watcher_.joinable()) return absl::FailedPreconditionError("Watch was already called");
    watcher_ = std::thread([this, sink] { WatchLoop(sink); });
    return absl::OkStatus();
  }

  absl::Status StreamLogs(const BackendRef& ref, int64_t offset, bool follow,
                          LogSink* sink) override {
    int64_t position = 0;
    LogDemuxer demux;
    auto deliver = [&](int, absl::string_view piece) {
      int64_t end = position + static_cast<int64_t>(piece.size());
      if (end <= offset) {
        position = end;
        return true;
      }
      if (position < offset) {
        piece.remove_prefix(static_cast<size_t>(offset - position));
        position = offset;
      }
      bool more = sink->OnLogData(position, piece, false);
      position += static_cast<int64_t>(piece.size());
      return more;
    };
    return StreamContainerLogs(ref, follow, [&](absl::string_view data) {
      return demux.Feed(data, deliver);
    });
  }

  std::string LogTail(const BackendRef& ref, size_t max_bytes) override {
    std::string tail;
    LogDemuxer demux;
    auto keep = [&](int, absl::string_view piece) {
      tail.append(piece.data(), piece.size());
      if (tail.size() > 2 * max_bytes + 4096) tail.erase(0, tail.size() - max_bytes);
      return true;
    };
    // The engine trims by lines, and every line is at least one byte: the
    // last max_bytes lines hold the last max_bytes bytes, and a long log is
    // not read in full for them.
    absl::Status status = StreamContainerLogs(
        ref, false, [&](absl::string_view data) { return demux.Feed(data, keep); },
        max_bytes + 1);
    (void)status;  // a tail is best effort: what was read is returned
    if (tail.size() > max_bytes) tail.erase(0, tail.size() - max_bytes);
    return tail;
  }

  void Shutdown() override {
    std::thread watcher;
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      for (StreamCanceller* canceller : streams_) canceller->Cancel();
      watcher = std::move(watcher_);
    }
    if (watcher.joinable()) watcher.join();
  }

 private:
  struct Known {
    std::string sandbox_id;
  };
  class LaunchInFlight {
   public:
    LaunchInFlight(EngineBackend* backend, std::string sandbox_id)
        : backend_(backend), sandbox_id_(std::move(sandbox_id)) {
      absl::MutexLock lock(&backend_->mu_);
      backend_->launching_.insert(sandbox_id_);
    }
    ~LaunchInFlight() {
      absl::MutexLock lock(&backend_->mu_);
      backend_->launching_.erase(backend_->launching_.find(sandbox_id_));
    }
    LaunchInFlight(const LaunchInFlight&) = delete;
    LaunchInFlight& operator=(const LaunchInFlight&) = delete;

   private:
    EngineBackend* backend_;
    std::string sandbox_id_;
  };

  // What the engine itself cannot enforce (from the cached Probe).
  absl::Status CheckCapabilities(const LaunchSpec& spec) const {
    AGX_ASSIGN_OR_RETURN(pb::BackendCapabilities caps, ProbeEngine());
    const pb::Resources& r = spec.spec.resources();
    if (r.gpus() > 0 && !caps.gpu()) {
      return NotEnforceable(absl::StrCat(options_.name,
                                         ": no GPU here (the engine has no nvidia runtime)"));
    }
    if (r.memory_bytes() > 0 && !caps.memory_limit()) {
      return NotEnforceable(absl::StrCat(options_.name, ": the engine cannot limit memory"));
    }
    if (r.cpu_millis() > 0 && !caps.cpu_limit()) {
      return NotEnforceable(absl::StrCat(options_.name, ": the engine cannot limit cpu"));
    }
    if (r.pids() > 0 && !caps.pids_limit()) {
      return NotEnforceable(absl::StrCat(options_.name, ": the engine cannot limit pids"));
    }
    return absl::OkStatus();
  }

  static absl::Status NotEnforceable(std::string message) {
    return ProviderError(absl::StatusCode::kFailedPrecondition, kReasonLimitNotEnforceable,
                         message);
  }

  static std::string Tail(const std::string& output) {
    return output.empty() ? "" : absl::StrCat("\n--- output ---\n", output);
  }

  absl::Duration Remaining(absl::Time deadline) const {
    absl::Duration left = deadline - absl::Now();
    if (left > options_.request_timeout) return options_.request_timeout;
    return left < absl::Milliseconds(1) ? absl::Milliseconds(1) : left;
  }

  // Transport failures become UNAVAILABLE with a reason and a retry delay:
  // the engine may be restarting.
  absl::StatusOr<HttpResponse> Call(absl::string_view method, const std::string& path,
                                    const std::string& body, absl::Duration timeout) const {
    auto response = http_.Request(method, path, body, timeout);
    if (response.ok()) return response;
    const absl::Status& status = response.status();
    if (absl::IsUnavailable(status)) {
      return WithRetryAfter(ProviderError(absl::StatusCode::kUnavailable,
                                          kReasonEngineUnavailable,
                                          absl::StrCat(options_.name, ": ", status.message())),
                            absl::Seconds(1));
    }
    return absl::Status(status.code(), absl::StrCat(options_.name, ": ", status.message()));
  }

  // The engine's answer to a request it refused, with its own message.
  absl::Status HttpError(absl::string_view what, const HttpResponse& response) const {
    std::string message = absl::StrCat(options_.name, ": ", what, ": ",
                                       curl_http::JsonErrorMessage(response.body), " (HTTP ",
                                       response.status, ")");
    switch (response.status) {
      case 400:
        return ProviderError(absl::StatusCode::kInvalidArgument, kReasonInvalidSpec, message);
      case 404:
        return absl::NotFoundError(message);
      case 409:
        return ProviderError(absl::StatusCode::kAborted, kReasonEngineError, message);
      default:
        return ProviderError(absl::StatusCode::kUnknown, kReasonEngineError, message);
    }
  }

  absl::StatusOr<pb::BackendCapabilities> ProbeEngine() const {
    {
      absl::MutexLock lock(&mu_);
      if (capabilities_) return *capabilities_;
    }
    AGX_ASSIGN_OR_RETURN(HttpResponse ping, Call("GET", "/_ping", "", options_.request_timeout));
    if (ping.status != 200) return HttpError("ping", ping);
    AGX_ASSIGN_OR_RETURN(HttpResponse version,
                         Call("GET", "/version", "", options_.request_timeout));
    if (version.status != 200) return HttpError("version", version);
    AGX_ASSIGN_OR_RETURN(HttpResponse info, Call("GET", "/info", "", options_.request_timeout));
    if (info.status != 200) return HttpError("info", info);
    json v = json::parse(version.body, nullptr, false);
    json i = json::parse(info.body, nullptr, false);
    std::string api = StringAt(v, "ApiVersion");
    if (!ApiAtLeastFloor(api)) {
      return ProviderError(absl::StatusCode::kFailedPrecondition, kReasonEngineError,
                           absl::StrCat(options_.name, ": the engine speaks API ", api,
                                        "; at least 1.41 is needed"));
    }
    std::string kind = "docker";
    if (v.contains("Components") && v["Components"].is_array()) {
      for (const json& component : v["Components"]) {
        if (StringAt(component, "Name").find("Podman") != std::string::npos) kind = "podman";
      }
    }
    pb::BackendCapabilities caps;
    caps.set_name(options_.name);
    caps.set_memory_limit(BoolAt(i, "MemoryLimit", true));
    caps.set_cpu_limit(BoolAt(i, "CpuCfsQuota", true));
    caps.set_pids_limit(BoolAt(i, "PidsLimit", true));
    caps.set_gpu(i.contains("Runtimes") && i["Runtimes"].is_object() &&
                 i["Runtimes"].contains("nvidia"));
    caps.set_network_none(true);
    caps.set_network_host(true);
    caps.set_network_bridge(false);
    caps.set_egress_policy(false);
    caps.set_scratch_limit(true);
    caps.set_nofile_limit(true);
    caps.set_version(absl::StrCat(kind, " ", StringAt(v, "Version"), " (API ", api, ")"));
    std::vector<std::string> detail;
    if (kind != options_.name) {
      detail.push_back(absl::StrCat("the engine at unix://", options_.socket_path, " is ", kind));
    }
    if (!caps.gpu()) detail.push_back("no nvidia runtime");
    detail.push_back("network BRIDGE and egress lists not supported yet");
    caps.set_detail(absl::StrJoin(detail, "; "));
    absl::MutexLock lock(&mu_);
    capabilities_ = caps;
    return caps;
  }

  // ObservedFrom, plus the kernel's word on an OOM kill: podman 4.3 here
  // never sets State.OOMKilled (conmon 2.1.6 writes its marker to the
  // service's cwd instead of the container's dir), so a memory-limited container that ended with 137 is checked
  // against the kernel log's "oom-kill: ... oom_memcg=<its cgroup>" record.
  Observed Observe(const json& inspect) const {
    Observed observed = ObservedFrom(inspect);
    if (observed.state == Observed::State::kExited && observed.exit_code == 137 &&
        !observed.oom_killed && inspect.contains("HostConfig") &&
        inspect["HostConfig"].value("Memory", int64_t{0}) > 0) {
      observed.oom_killed = KernelLoggedOomKill(StringAt(inspect, "Id"));
    }
    return observed;
  }

  absl::StatusOr<json> InspectJson(const std::string& id_or_name) const {
    AGX_ASSIGN_OR_RETURN(HttpResponse response,
                         Call("GET", absl::StrCat("/containers/", id_or_name, "/json"), "",
                              options_.request_timeout));
    if (response.status != 200) return HttpError("inspect " + id_or_name, response);
    json parsed = json::parse(response.body, nullptr, false);
    if (!parsed.is_object()) return absl::UnknownError("inspect answered no JSON object");
    return parsed;
  }

  // DELETE ?force=1&v=1: kills what still runs, removes anonymous volumes.
  absl::Status RemoveContainer(const std::string& id) {
    absl::Time until = absl::Now() + options_.request_timeout;
    while (true) {
      AGX_ASSIGN_OR_RETURN(HttpResponse response,
                           Call("DELETE", absl::StrCat("/containers/", id, "?force=1&v=1"), "",
                                options_.request_timeout));
      if (response.status == 204 || response.status == 200 || response.status == 404) {
        return absl::OkStatus();
      }
      // 409: a removal is already in progress; wait for it.
      if (response.status != 409 || absl::Now() > until) {
        return HttpError("remove container", response);
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  }

  // A fresh run dir: nothing but the admin token (0600, never in the
  // container's environment or command line).
  absl::Status PrepareRunDir(const std::string& run_dir, const std::string& token) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(run_dir, ec)) fs::remove_all(entry.path(), ec);
    if (token.empty()) return absl::OkStatus();
    std::string path = absl::StrCat(run_dir, "/", kAdminTokenName);
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return absl::InternalError(absl::StrCat("create ", path, ": ", std::strerror(errno)));
    ssize_t written = ::write(fd, token.data(), token.size());
    ::close(fd);
    if (written != static_cast<ssize_t>(token.size())) {
      return absl::InternalError(absl::StrCat("write ", path, " failed"));
    }
    return absl::OkStatus();
  }

  // A run dir with no container of this instance is a leftover (a launch
  // that died half-way, a container removed while providerd was down) unless
  // this object is launching it or knows its container (made after `live`
  // was listed). One backend object owns a run root (providerd's state-dir
  // lock), so there is no other launch to wait for.
  void RemoveStaleRunDirs(std::set<std::string> live) {
    {
      absl::MutexLock lock(&mu_);
      live.insert(launching_.begin(), launching_.end());
      for (const auto& [id, known] : known_) live.insert(known.sandbox_id);
    }
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(options_.run_root, ec)) {
      std::string name = entry.path().filename().string();
      if (live.count(name) || !entry.is_directory(ec)) continue;
      RemoveRunDir(entry.path().string()).IgnoreError();
    }
  }

  // Unmounts the run dir's tmpfs (if it is one) and removes the directory;
  // remove_all does not follow the symlinks a sandbox may have left in it.
  static absl::Status RemoveRunDir(const std::string& run_dir) {
    while (::umount2(run_dir.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW) == 0) {
    }
    std::error_code ec;
    fs::remove_all(run_dir, ec);
    if (ec) return absl::InternalError(absl::StrCat("removing ", run_dir, ": ", ec.message()));
    return absl::OkStatus();
  }

  void Remember(const std::string& id, const std::string& sandbox_id) {
    absl::MutexLock lock(&mu_);
    known_[id] = Known{sandbox_id};
  }

  void Forget(const std::string& id) {
    absl::MutexLock lock(&mu_);
    known_.erase(id);
  }

  // The run dir of a container this backend made (or found by ListOwned),
  // else from its labels. NOT_FOUND when the container is gone and unknown.
  absl::StatusOr<std::string> RunDirOf(const BackendRef& ref) const {
    {
      absl::MutexLock lock(&mu_);
      auto it = known_.find(ref.value);
      if (it != known_.end()) return RunDir(options_, it->second.sandbox_id);
    }
    AGX_ASSIGN_OR_RETURN(json inspect, InspectJson(ref.value));
    std::string sandbox_id = StringAt(inspect["Config"]["Labels"], kLabelSandboxId);
    if (sandbox_id.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(options_.name, ": container ", ref.value, " is not an agentix sandbox"));
    }
    return RunDir(options_, sandbox_id);
  }

  template <typename Fn>
  absl::Status StreamContainerLogs(const BackendRef& ref, bool follow, Fn&& on_data,
                                   size_t tail_lines = 0) {
    StreamCanceller canceller;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return absl::UnavailableError("backend is shut down");
      streams_.insert(&canceller);
    }
    long status = 0;
    std::string error;
    absl::Status result = http_.Stream(
        absl::StrCat("/containers/", ref.value, "/logs?stdout=1&stderr=1&follow=", follow ? 1 : 0,
                     tail_lines > 0 ? absl::StrCat("&tail=", tail_lines) : ""),
        on_data, &canceller, &status, &error);
    {
      absl::MutexLock lock(&mu_);
      streams_.erase(&canceller);
    }
    if (!result.ok()) return result;
    if (status != 0 && (status < 200 || status >= 300)) {
      return HttpError("logs of " + ref.value, HttpResponse{status, error});
    }
    return absl::OkStatus();
  }

  void WatchLoop(EventSink* sink) {
    std::string since;
    std::set<std::string> oom_seen;
    while (true) {
      StreamCanceller canceller;
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
        streams_.insert(&canceller);
      }
      std::string filters = QueryEscape(
          json{{"type", json::array({"container"})},
               {"label", json::array({options_.instance.empty()
                                          ? std::string(kLabelManagedBy)
                                          : absl::StrCat(kLabelManagedBy, "=", options_.instance)})}}
              .dump());
      std::string path = absl::StrCat("/events?filters=", filters);
      if (!since.empty()) absl::StrAppend(&path, "&since=", since);
      LineSplitter lines;
      long status = 0;
      std::string error;
      // Its outcome does not matter: any end is followed by a reconnect.
      http_.Stream(path, [&](absl::string_view data) {
        lines.Feed(data, [&](absl::string_view line) {
          json event = json::parse(line.begin(), line.end(), nullptr, false);
          if (!event.is_object()) return;
          if (event.contains("time") && event["time"].is_number_integer()) {
            since = absl::StrCat(event["time"].get<int64_t>());
          }
          HandleEvent(event, sink, &oom_seen);
        });
        return true;
      }, &canceller, &status, &error).IgnoreError();
      absl::MutexLock lock(&mu_);
      streams_.erase(&canceller);
      if (stopping_) return;
      // The engine went away or ended the stream: reconnect from the last
      // event seen (events in that second may come twice; sinks dedupe).
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), kWatchRetry);
      if (stopping_) return;
    }
  }

  void HandleEvent(const json& event, EventSink* sink, std::set<std::string>* oom_seen) {
    std::string action = StringAt(event, "Action");
    if (action.empty()) action = StringAt(event, "status");
    const json& actor = event.contains("Actor") ? event["Actor"] : json();
    std::string id = StringAt(actor, "ID");
    if (id.empty()) id = StringAt(event, "id");
    if (id.empty()) return;
    BackendRef ref{id};
    if (action == "oom") {
      oom_seen->insert(id);
      return;
    }
    if (action == "die" || action == "died") {
      Observed observed;
      auto inspect = InspectJson(id);
      if (inspect.ok()) {
        observed = Observe(*inspect);
      } else {
        observed.state = Observed::State::kExited;
        int code = 0;
        if (absl::SimpleAtoi(StringAt(actor["Attributes"], "exitCode"), &code)) {
          observed.exit_code = code;
        }
        observed.reason = "exited";
      }
      if (observed.state == Observed::State::kRunning) return;  // restarted since
      if (oom_seen->erase(id) > 0) observed.oom_killed = true;
      sink->OnObserved(ref, observed);
      return;
    }
    if (action == "destroy" || action == "remove") {
      oom_seen->erase(id);
      Observed missing;
      missing.state = Observed::State::kMissing;
      missing.reason = "container removed";
      sink->OnObserved(ref, missing);
    }
  }

  const EngineOptions options_;
  const EngineHttp http_;
  const int64_t nofile_hard_limit_;

  mutable absl::Mutex mu_;
  mutable std::optional<pb::BackendCapabilities> capabilities_ ABSL_GUARDED_BY(mu_);
  std::multiset<std::string> launching_ ABSL_GUARDED_BY(mu_);  // sandbox ids
  std::map<std::string, Known> known_ ABSL_GUARDED_BY(mu_);  // container id ->
  std::set<StreamCanceller*> streams_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watcher_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<Backend> NewEngineBackend(EngineOptions options) {
  return std::make_unique<EngineBackend>(std::move(options));
}

}  // namespace agentix::providers::engine
