#include "providers/backends/kubernetes/kubernetes_backend.h"

#include <algorithm>
#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "providers/backends/kubernetes/kube_http.h"

namespace agentix::providers::kubernetes {
namespace {

using json = nlohmann::json;

// Which NetworkPolicy Destroy removes with the Pod (none for network HOST).
constexpr char kAnnotationNetworkPolicy[] = "agentix.dev/network-policy";
constexpr char kMergePatch[] = "application/merge-patch+json";

std::string Str(const json& obj, const char* key) {
  if (!obj.is_object()) return "";
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : "";
}

const json& Field(const json& obj, const char* key) {
  static const json kNull;
  if (!obj.is_object()) return kNull;
  auto it = obj.find(key);
  return it == obj.end() ? kNull : *it;
}

std::string Name(const json& obj) { return Str(Field(obj, "metadata"), "name"); }
std::string Rv(const json& obj) { return Str(Field(obj, "metadata"), "resourceVersion"); }
std::string Label(const json& obj, const char* key) {
  return Str(Field(Field(obj, "metadata"), "labels"), key);
}

bool PodReady(const json& pod) {
  for (const json& c : Field(Field(pod, "status"), "conditions")) {
    if (Str(c, "type") == "Ready") return Str(c, "status") == "True";
  }
  return false;
}

std::string UrlEncode(absl::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppend(&out, "%", absl::BytesToHexString(absl::string_view(
                                     reinterpret_cast<const char*>(&c), 1)));
    }
  }
  return out;
}

bool SameState(const Observed& a, const Observed& b) {
  return a.state == b.state && a.exit_code == b.exit_code && a.oom_killed == b.oom_killed;
}

class KubernetesBackend final : public Backend {
 public:
  explicit KubernetesBackend(KubernetesBackendOptions options)
      : options_(std::move(options)),
        http_(options_.config),
        ns_(options_.config.ns.empty() ? "default" : options_.config.ns) {
    options_.render.namespace_name = ns_;
    informer_ = std::thread([this] { InformerLoop(); });
  }

  ~KubernetesBackend() override { Shutdown(); }

  absl::string_view name() const override { return "kubernetes"; }

  absl::StatusOr<pb::BackendCapabilities> Probe() override {
    auto response = http_.Request("GET", "/version", "", "", options_.request_timeout);
    if (!response.ok()) return response.status();
    if (response->status != 200) return KubeError(*response, "GET /version");
    json version = json::parse(response->body, nullptr, false);
    pb::BackendCapabilities caps;
    caps.set_name("kubernetes");
    caps.set_memory_limit(true);
    caps.set_cpu_limit(true);
    caps.set_network_none(true);
    caps.set_scratch_limit(true);
    caps.set_version(Str(version, "gitVersion"));
    caps.set_detail(absl::StrCat(http_.config().source, ", namespace ", ns_,
                                 "; pids and nofile limits are the node's, not per Pod"));
    return caps;
  }

  absl::Status Validate(const LaunchSpec& spec) const override {
    return ValidatePodSpec(spec, options_.render);
  }

  absl::StatusOr<BackendRef> Launch(const LaunchSpec& spec, absl::Time deadline) override {
    PodAnnotations annotations;
    annotations.request_id = spec.request_id;
    annotations.expire_time = spec.expire_time;
    if (annotations.expire_time == absl::InfinitePast() && spec.spec.has_ttl()) {
      // No expiry from the controller: the TTL from now, which is at most
      // the create's latency later than the controller's own.
      annotations.expire_time =
          absl::Now() + absl::Seconds(spec.spec.ttl().seconds()) +
          absl::Nanoseconds(spec.spec.ttl().nanos());
    }
    auto rendered = RenderPod(spec, options_.render, annotations);
    if (!rendered.ok()) return rendered.status();
    json pod = *std::move(rendered);
    json& md = pod["metadata"];
    md["namespace"] = ns_;
    md["labels"][kLabelManagedBy] = options_.instance.empty() ? spec.instance : options_.instance;
    md["labels"][kLabelSandboxId] = spec.sandbox_id;
    md["labels"][kLabelUid] = spec.uid;
    const std::string name = Name(pod);
    if (name.empty()) return absl::InternalError("RenderPod made a Pod without a name");

    std::string policy;
    auto mode = spec.spec.network().mode();
    if (mode == pb::Network::NONE || mode == pb::Network::MODE_UNSPECIFIED) {
      // The policy first: the Pod never runs without it.
      auto np = RenderNetworkPolicy(spec, options_.render);
      if (!np.ok()) return np.status();
      (*np)["metadata"]["namespace"] = ns_;
      policy = Name(*np);
      auto made = Write("POST", NetpolPath(""), np->dump(), "", deadline);
      if (!made.ok()) return made.status();
      if (made->status != 201 && made->status != 200 && made->status != 409) {
        return KubeError(*made, absl::StrCat("create NetworkPolicy ", policy));
      }
      md["annotations"][kAnnotationNetworkPolicy] = policy;
    }
    auto undo = [&] {
      if (!policy.empty()) {
        (void)http_.Request("DELETE", NetpolPath(policy), "", "", options_.request_timeout);
      }
    };
    // A POST whose answer was lost may still have made the Pod: retry, and
    // a 409 then finds our own attempt (the uid label) and adopts it.
    absl::StatusOr<HttpResponse> created = absl::UnavailableError("not tried");
    for (int attempt = 0; attempt < 3; ++attempt) {
      created = Write("POST", PodPath(""), pod.dump(), "", deadline);
      if (created.ok() && created->status == 409) {
        // The same request's Pod on its way out (an earlier attempt being
        // destroyed): wait for it to go, then create ours.
        absl::StatusOr<bool> gone = AwaitGoneIfLeaving(name, spec.request_id, deadline);
        if (!gone.ok()) {
          undo();
          return gone.status();
        }
        if (*gone) {
          --attempt;
          continue;
        }
      }
      if (created.ok() || !IsTransient(created.status()) || absl::Now() >= deadline) break;
      absl::SleepFor(absl::Milliseconds(100) * (attempt + 1));
    }
    if (!created.ok()) {
      undo();
      return created.status();
    }
    if (created->status == 201 || created->status == 200) {
      json obj = json::parse(created->body, nullptr, false);
      if (obj.is_object()) Remember(obj);
      if (absl::Status s = CreateAdminSecret(spec, Str(Field(obj, "metadata"), "uid"), deadline);
          !s.ok()) {
        (void)Destroy(BackendRef{name}, absl::ZeroDuration());
        return s;
      }
      return BackendRef{name};
    }
    if (created->status == 409) {
      auto got = http_.Request("GET", PodPath(name), "", "", options_.request_timeout);
      if (got.ok() && got->status == 200) {
        json existing = json::parse(got->body, nullptr, false);
        if (Label(existing, kLabelUid) == spec.uid) {
          Remember(existing);
          // Our own earlier attempt: adopt it (and make sure of its Secret).
          if (absl::Status s = CreateAdminSecret(
                  spec, Str(Field(existing, "metadata"), "uid"), deadline);
              !s.ok()) {
            return s;
          }
          return BackendRef{name};
        }
        if (SameRequest(existing, pod, spec.request_id)) {
          // Another attempt of the same request (e.g. before a providerd
          // restart) made it, with the same spec: take it over for this
          // attempt with one conditional write, so two attempts never both
          // adopt it.
          return AdoptForAttempt(spec, existing, deadline);
        }
      }
      return absl::AlreadyExistsError(absl::StrCat(
          "Pod ", name, " already exists in namespace ", ns_,
          " and was made neither by this launch (agentix.dev/uid) nor by the same request "
          "with the same spec (agentix.dev/request-id, agentix.dev/spec-hash)"));
    }
    undo();
    return KubeError(*created, absl::StrCat("create Pod ", name));
  }

  absl::StatusOr<pb::Endpoint> ResolveEndpoint(const BackendRef& ref) override {
    auto pod = Cached(ref.value);
    if (!pod.ok()) return pod.status();
    Observed observed = ObservePod(*pod);
    if (observed.state == Observed::State::kExited) {
      return absl::FailedPreconditionError(
          absl::StrCat("Pod ", ref.value, " ended: ", observed.reason));
    }
    std::string ip = Str(Field(*pod, "status"), "podIP");
    if (!PodReady(*pod) || ip.empty()) {
      std::string phase = Str(Field(*pod, "status"), "phase");
      return absl::UnavailableError(absl::StrCat("Pod ", ref.value, " is ",
                                                 phase.empty() ? "Pending" : phase,
                                                 ", not Ready yet"));
    }
    pb::Endpoint endpoint;
    bool v6 = ip.find(':') != std::string::npos;
    endpoint.set_target(v6 ? absl::StrCat("ipv6:[", ip, "]:", options_.render.runtime_port)
                           : absl::StrCat("ipv4:", ip, ":", options_.render.runtime_port));
    return endpoint;
  }

  absl::StatusOr<Observed> Inspect(const BackendRef& ref) override {
    auto pod = Cached(ref.value);
    if (pod.status().code() == absl::StatusCode::kNotFound) return Observed{};
    if (!pod.ok()) return pod.status();
    return ObservePod(*pod);
  }

  absl::Status Destroy(const BackendRef& ref, absl::Duration grace) override {
    std::string policy;
    bool known = false;
    {
      absl::MutexLock lock(&mu_);
      auto it = pods_.find(ref.value);
      if (it != pods_.end()) {
        known = true;
        policy = Str(Field(Field(it->second, "metadata"), "annotations"),
                     kAnnotationNetworkPolicy);
      }
    }
    if (!known) {  // not in the cache (not synced yet): ask the API server
      auto got = http_.Request("GET", PodPath(ref.value), "", "", options_.request_timeout);
      if (got.ok() && got->status == 200) {
        json pod = json::parse(got->body, nullptr, false);
        policy = Str(Field(Field(pod, "metadata"), "annotations"), kAnnotationNetworkPolicy);
      }
    }
    int64_t grace_s = std::max<int64_t>(0, absl::ToInt64Seconds(absl::Ceil(grace, absl::Seconds(1))));
    auto deleted = http_.Request(
        "DELETE", absl::StrCat(PodPath(ref.value), "?gracePeriodSeconds=", grace_s),
        json{{"kind", "DeleteOptions"}, {"apiVersion", "v1"},
             {"gracePeriodSeconds", grace_s}, {"propagationPolicy", "Background"}}.dump(),
        "", options_.request_timeout);
    if (!deleted.ok()) return deleted.status();
    if (deleted->status != 200 && deleted->status != 202 && deleted->status != 404) {
      return KubeError(*deleted, absl::StrCat("delete Pod ", ref.value));
    }
    if (!policy.empty()) {
      auto np = http_.Request("DELETE", NetpolPath(policy), "", "", options_.request_timeout);
      if (np.ok() && np->status != 200 && np->status != 404) {
        return KubeError(*np, absl::StrCat("delete NetworkPolicy ", policy));
      }
    }
    // The Secret is owned by the Pod (garbage-collected with it); deleting
    // it here too does not depend on the cluster's garbage collector.
    if (absl::StartsWith(ref.value, "sbx-")) {
      auto secret = http_.Request("DELETE", SecretPath(AdminSecretName(ref.value.substr(4))), "",
                                  "", options_.request_timeout);
      if (secret.ok() && secret->status != 200 && secret->status != 404) {
        return KubeError(*secret, absl::StrCat("delete Secret of ", ref.value));
      }
    }
    // The DELETE is accepted; wait (bounded) for the watch to see the Pod
    // go, so "destroyed" means no container is left running.
    if (deleted->status != 404) {
      absl::Time until = absl::Now() + grace + absl::Seconds(10);
      absl::MutexLock lock(&mu_);
      auto gone = [this, &ref]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !pods_.count(ref.value);
      };
      mu_.AwaitWithDeadline(absl::Condition(&gone), until);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<BackendRef>> ListOwned(absl::string_view instance) override {
    auto listed = http_.Request(
        "GET",
        absl::StrCat(PodPath(""), "?labelSelector=",
                     UrlEncode(absl::StrCat(kLabelManagedBy, "=", instance))),
        "", "", options_.request_timeout);
    if (!listed.ok()) return listed.status();
    if (listed->status != 200) return KubeError(*listed, "list Pods");
    json list = json::parse(listed->body, nullptr, false);
    std::vector<BackendRef> refs;
    for (const json& pod : Field(list, "items")) refs.push_back(BackendRef{Name(pod)});
    return refs;
  }

  absl::Status Watch(EventSink* sink) override {
    absl::MutexLock lock(&mu_);
    sink_ = sink;
    return absl::OkStatus();
  }

  absl::Status Claim(const BackendRef& ref, const ClaimInfo& claim) override {
    std::string rv;
    {
      absl::MutexLock lock(&mu_);
      auto it = pods_.find(ref.value);
      if (it != pods_.end()) {
        if (Label(it->second, kLabelClaimed) == "true") return ClaimedElsewhere(ref, it->second);
        rv = Rv(it->second);
      }
    }
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (rv.empty()) {
        auto fresh = FreshPod(ref.value);
        if (!fresh.ok()) return fresh.status();
        if (Label(*fresh, kLabelClaimed) == "true") return ClaimedElsewhere(ref, *fresh);
        rv = Rv(*fresh);
      }
      json patch;
      patch["metadata"]["resourceVersion"] = rv;
      patch["metadata"]["labels"][kLabelClaimed] = "true";
      patch["metadata"]["labels"][kLabelSandboxId] = claim.sandbox_id;
      auto patched = http_.Request("PATCH", PodPath(ref.value), patch.dump(), kMergePatch,
                                   options_.request_timeout);
      if (!patched.ok()) return patched.status();
      if (patched->status == 200) {
        json obj = json::parse(patched->body, nullptr, false);
        if (obj.is_object()) Remember(obj);
        return absl::OkStatus();
      }
      if (patched->status != 409) {
        return KubeError(*patched, absl::StrCat("claim Pod ", ref.value));
      }
      // Stale resourceVersion: something wrote the Pod since our cache saw
      // it (the kubelet's status, or another claimer). Look once, fresh.
      rv.clear();
    }
    return absl::AbortedError(absl::StrCat("claim Pod ", ref.value,
                                           ": it kept changing under the claim"));
  }

  // One merge PATCH of the expire-time annotation. activeDeadlineSeconds
  // cannot be raised on a running Pod; it is the max lifetime from the
  // start, which no extension goes past (docs/PROVIDERS.md).
  absl::Status Extend(const BackendRef& ref, absl::Time expire) override {
    json patch;
    patch["metadata"]["annotations"][kAnnotationExpireTime] =
        absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", expire, absl::UTCTimeZone());
    auto patched = http_.Request("PATCH", PodPath(ref.value), patch.dump(), kMergePatch,
                                 options_.request_timeout);
    if (!patched.ok()) return patched.status();
    if (patched->status != 200) return KubeError(*patched, absl::StrCat("extend Pod ", ref.value));
    json obj = json::parse(patched->body, nullptr, false);
    if (obj.is_object()) Remember(obj);
    return absl::OkStatus();
  }

  absl::Status StreamLogs(const BackendRef& ref, int64_t offset, bool follow,
                          LogSink* sink) override {
    std::string path = absl::StrCat(PodPath(ref.value), "/log?container=",
                                    UrlEncode(MainContainer(ref.value)),
                                    follow ? "&follow=true" : "");
    int64_t seen = 0;
    bool stopped = false;
    auto on_data = [&](absl::string_view data) {
      int64_t start = seen;
      seen += data.size();
      if (seen <= offset) return true;
      if (start < offset) {
        data.remove_prefix(offset - start);
        start = offset;
      }
      if (!sink->OnLogData(start, data, false)) {
        stopped = true;
        return false;
      }
      return true;
    };
    long status = 0;
    std::string error;
    absl::Status s = http_.Stream(path, on_data, nullptr, &status, &error);
    if (stopped) return absl::OkStatus();
    if (!s.ok()) return s;
    if (status < 200 || status >= 300) {
      absl::Status err = KubeError(HttpResponse{status, error}, absl::StrCat("logs of Pod ", ref.value));
      if (status == 400) return absl::FailedPreconditionError(err.message());
      return err;
    }
    return absl::OkStatus();
  }

  std::string LogTail(const BackendRef& ref, size_t max_bytes) override {
    if (max_bytes == 0) return "";
    size_t lines = std::min<size_t>(10000, max_bytes / 16 + 1);
    auto got = http_.Request("GET",
                             absl::StrCat(PodPath(ref.value), "/log?container=",
                                          UrlEncode(MainContainer(ref.value)),
                                          "&tailLines=", lines),
                             "", "", options_.request_timeout);
    if (!got.ok() || got->status != 200) return "";
    std::string body = std::move(got->body);
    if (body.size() > max_bytes) body.erase(0, body.size() - max_bytes);
    return body;
  }

  void Shutdown() override {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) {
        if (!informer_.joinable()) return;
      }
      stopping_ = true;
      if (watch_canceller_) watch_canceller_->Cancel();
    }
    if (informer_.joinable()) informer_.join();
  }

 private:
  std::string PodPath(const std::string& name) const {
    return absl::StrCat("/api/v1/namespaces/", ns_, "/pods", name.empty() ? "" : "/", name);
  }
  std::string SecretPath(const std::string& name) const {
    return absl::StrCat("/api/v1/namespaces/", ns_, "/secrets", name.empty() ? "" : "/", name);
  }
  std::string NetpolPath(const std::string& name) const {
    return absl::StrCat("/apis/networking.k8s.io/v1/namespaces/", ns_, "/networkpolicies",
                        name.empty() ? "" : "/", name);
  }
  std::string Selector() const {
    return UrlEncode(absl::StrCat(kLabelManagedBy, "=", options_.instance));
  }

  static bool IsTransient(const absl::Status& s) {
    return s.code() == absl::StatusCode::kUnavailable ||
           s.code() == absl::StatusCode::kDeadlineExceeded;
  }

  absl::StatusOr<HttpResponse> Write(absl::string_view method, const std::string& path,
                                     const std::string& body, absl::string_view content_type,
                                     absl::Time deadline) {
    absl::Duration left = std::min(options_.request_timeout, deadline - absl::Now());
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(method, " ", path, ": launch deadline passed"));
    }
    return http_.Request(method, path, body, content_type, left);
  }

  static std::string Annotation(const json& obj, const char* key) {
    return Str(Field(Field(obj, "metadata"), "annotations"), key);
  }

  // `existing` was made by request `request_id` of the same instance for
  // the same spec as `ours` (the Pod this launch renders), and is not being
  // deleted.
  static bool SameRequest(const json& existing, const json& ours, const std::string& request_id) {
    return !request_id.empty() && Annotation(existing, kAnnotationRequestId) == request_id &&
           Annotation(existing, kAnnotationSpecHash) == Annotation(ours, kAnnotationSpecHash) &&
           Label(existing, kLabelManagedBy) == Label(ours, kLabelManagedBy) &&
           !Field(existing, "metadata").contains("deletionTimestamp");
  }

  // Relabels `existing` with this attempt's uid under its resourceVersion
  // (409: another attempt took it first → ALREADY_EXISTS), then makes sure
  // of its Secret.
  absl::StatusOr<BackendRef> AdoptForAttempt(const LaunchSpec& spec, const json& existing,
                                             absl::Time deadline) {
    const std::string name = Name(existing);
    json patch;
    patch["metadata"]["resourceVersion"] = Rv(existing);
    patch["metadata"]["labels"][kLabelUid] = spec.uid;
    auto patched = Write("PATCH", PodPath(name), patch.dump(), kMergePatch, deadline);
    if (!patched.ok()) return patched.status();
    if (patched->status == 409) {
      return absl::AlreadyExistsError(absl::StrCat(
          "Pod ", name, " of request ", spec.request_id, " was taken over by another attempt"));
    }
    if (patched->status != 200) return KubeError(*patched, absl::StrCat("adopt Pod ", name));
    json obj = json::parse(patched->body, nullptr, false);
    if (!obj.is_object()) return absl::InternalError("PATCH Pod: not a JSON object");
    Remember(obj);
    if (absl::Status s = CreateAdminSecret(spec, Str(Field(obj, "metadata"), "uid"), deadline);
        !s.ok()) {
      return s;
    }
    return BackendRef{name};
  }

  // After a 409 on create: true once Pod `name` — made by request
  // `request_id` and being deleted — is gone (polled, bounded by
  // `deadline`); false when it is not such a Pod (the caller decides).
  absl::StatusOr<bool> AwaitGoneIfLeaving(const std::string& name, const std::string& request_id,
                                          absl::Time deadline) {
    if (request_id.empty()) return false;
    for (;;) {
      auto got = http_.Request("GET", PodPath(name), "", "", options_.request_timeout);
      if (!got.ok()) return got.status();
      if (got->status == 404) return true;
      if (got->status != 200) return false;
      json pod = json::parse(got->body, nullptr, false);
      if (Annotation(pod, kAnnotationRequestId) != request_id ||
          !Field(pod, "metadata").contains("deletionTimestamp")) {
        return false;
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "Pod ", name, " of the same request was still terminating at the launch deadline"));
      }
      absl::SleepFor(std::min(absl::Milliseconds(50), deadline - absl::Now()));
    }
  }

  absl::StatusOr<json> FreshPod(const std::string& name) {
    auto got = http_.Request("GET", PodPath(name), "", "", options_.request_timeout);
    if (!got.ok()) return got.status();
    if (got->status != 200) return KubeError(*got, absl::StrCat("get Pod ", name));
    json pod = json::parse(got->body, nullptr, false);
    if (!pod.is_object()) return absl::InternalError("GET Pod: not a JSON object");
    return pod;
  }

  absl::Status ClaimedElsewhere(const BackendRef& ref, const json& pod) {
    return absl::AbortedError(absl::StrCat("Pod ", ref.value, " was claimed by sandbox ",
                                           Label(pod, kLabelSandboxId), " first"));
  }

  std::string MainContainer(const std::string&) { return kTaskContainer; }

  // The admin token's Secret, owned by the Pod `pod_uid` (the Pod's volume
  // waits for it, so the daemon never starts without its token).
  absl::Status CreateAdminSecret(const LaunchSpec& spec, const std::string& pod_uid,
                                 absl::Time deadline) {
    auto secret = RenderAdminSecret(spec, options_.render, pod_uid);
    if (!secret.ok()) return secret.status();
    (*secret)["metadata"]["namespace"] = ns_;
    auto made = Write("POST", SecretPath(""), secret->dump(), "", deadline);
    if (!made.ok()) return made.status();
    if (made->status == 201 || made->status == 200 || made->status == 409) {
      return absl::OkStatus();
    }
    return KubeError(*made, absl::StrCat("create Secret ", Name(*secret)));
  }

  // The cached Pod; waits (bounded) for the first LIST so a fresh backend
  // does not report a live Pod as missing.
  absl::StatusOr<json> Cached(const std::string& name) {
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return synced_ || stopping_; };
      mu_.AwaitWithTimeout(absl::Condition(&ready), options_.request_timeout);
      if (synced_) {
        auto it = pods_.find(name);
        if (it == pods_.end()) {
          return absl::NotFoundError(absl::StrCat("Pod ", name, " is gone"));
        }
        return it->second;
      }
    }
    return FreshPod(name);  // the watch is not up: ask directly
  }

  // A Pod from a write's answer: newer than or equal to what the cache has.
  void Remember(const json& pod) {
    absl::MutexLock lock(&mu_);
    std::string name = Name(pod);
    pods_[name] = pod;
    remembered_[name] = ++remember_seq_;
  }

  // ------------------------------------------------------------ informer
  void InformerLoop() {
    bool need_list = true;
    absl::Duration backoff = absl::Milliseconds(100);
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
      }
      absl::Status s;
      if (need_list) {
        s = Relist();
        if (s.ok()) need_list = false;
      } else {
        s = WatchOnce(&need_list);
        if (s.ok() && !need_list) backoff = absl::Milliseconds(100);
      }
      if (s.ok()) continue;
      absl::MutexLock lock(&mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      mu_.AwaitWithTimeout(absl::Condition(&stop), backoff);
      backoff = std::min(backoff * 2, absl::Seconds(5));
    }
  }

  absl::Status Relist() {
    int64_t seq;
    {
      absl::MutexLock lock(&mu_);
      seq = remember_seq_;
    }
    auto listed = http_.Request("GET", absl::StrCat(PodPath(""), "?labelSelector=", Selector()),
                                "", "", options_.request_timeout);
    if (!listed.ok()) return listed.status();
    if (listed->status != 200) return KubeError(*listed, "list Pods");
    json list = json::parse(listed->body, nullptr, false);
    if (!list.is_object()) return absl::InternalError("list Pods: not a JSON object");
    std::map<std::string, json> fresh;
    for (json& pod : list["items"]) {
      std::string name = Name(pod);
      fresh[name] = std::move(pod);
    }
    std::vector<std::pair<BackendRef, Observed>> events;
    EventSink* sink;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [name, old] : pods_) {
        auto it = fresh.find(name);
        auto written = remembered_.find(name);
        if (written != remembered_.end() && written->second > seq) continue;
        if (it == fresh.end()) {
          events.push_back({BackendRef{name}, Observed{}});
        } else {
          Changed(name, old, it->second, &events);
        }
      }
      // A Pod this backend wrote after the LIST was sent is newer than the
      // list: keep it (the watch from the list's resourceVersion follows).
      for (const auto& [name, at] : remembered_) {
        auto it = pods_.find(name);
        if (at > seq && it != pods_.end()) fresh[name] = it->second;
      }
      remembered_.clear();
      pods_ = std::move(fresh);
      list_rv_ = Rv(list);
      synced_ = true;
      relists_++;
      sink = sink_;
    }
    Deliver(sink, events);
    return absl::OkStatus();
  }

  // An exit or OOM the controller must hear about.
  static void Changed(const std::string& name, const json& before, const json& after,
                      std::vector<std::pair<BackendRef, Observed>>* events) {
    Observed now = ObservePod(after);
    if (now.state != Observed::State::kExited) return;
    if (!before.is_null() && SameState(ObservePod(before), now)) return;
    events->push_back({BackendRef{name}, now});
  }

  void Deliver(EventSink* sink, const std::vector<std::pair<BackendRef, Observed>>& events) {
    if (sink == nullptr) return;
    for (const auto& [ref, observed] : events) sink->OnObserved(ref, observed);
  }

  absl::Status WatchOnce(bool* need_list) {
    std::string rv;
    std::shared_ptr<StreamCanceller> canceller;
    {
      absl::MutexLock lock(&mu_);
      rv = list_rv_;
      watch_canceller_ = std::make_shared<StreamCanceller>();
      if (stopping_) watch_canceller_->Cancel();
      canceller = watch_canceller_;
    }
    std::string path = absl::StrCat(
        PodPath(""), "?watch=1&allowWatchBookmarks=true&labelSelector=", Selector(),
        "&resourceVersion=", UrlEncode(rv),
        "&timeoutSeconds=", absl::ToInt64Seconds(options_.watch_timeout));
    std::string buffer;
    bool gone = false;
    absl::Status bad_event;
    auto on_data = [&](absl::string_view data) {
      buffer.append(data.data(), data.size());
      size_t start = 0;
      for (size_t nl; (nl = buffer.find('\n', start)) != std::string::npos; start = nl + 1) {
        json event = json::parse(buffer.begin() + start, buffer.begin() + nl, nullptr, false);
        if (!event.is_object()) continue;
        if (!HandleEvent(event, &gone)) return false;
      }
      buffer.erase(0, start);
      return !gone;
    };
    long status = 0;
    std::string error;
    absl::Status s = http_.Stream(path, on_data, canceller.get(), &status, &error);
    if (gone || status == 410) {
      *need_list = true;  // our resourceVersion is too old: start over
      return absl::OkStatus();
    }
    if (!s.ok()) return s;
    if (status != 200) return KubeError(HttpResponse{status, error}, "watch Pods");
    return absl::OkStatus();  // the server ended the watch: reopen from rv
  }

  bool HandleEvent(const json& event, bool* gone) {
    std::string type = Str(event, "type");
    const json& obj = Field(event, "object");
    if (type == "ERROR") {
      if (Field(obj, "code") == 410) *gone = true;
      return false;
    }
    std::vector<std::pair<BackendRef, Observed>> events;
    EventSink* sink;
    {
      absl::MutexLock lock(&mu_);
      std::string rv = Rv(obj);
      if (!rv.empty()) list_rv_ = rv;
      sink = sink_;
      if (type == "BOOKMARK") return true;
      std::string name = Name(obj);
      if (type == "DELETED") {
        if (pods_.erase(name)) events.push_back({BackendRef{name}, Observed{}});
      } else if (type == "ADDED" || type == "MODIFIED") {
        auto it = pods_.find(name);
        json before = it == pods_.end() ? json() : it->second;
        Changed(name, before, obj, &events);
        pods_[name] = obj;
      }
    }
    Deliver(sink, events);
    return true;
  }

  KubernetesBackendOptions options_;
  KubeHttp http_;
  const std::string ns_;
  std::thread informer_;
  absl::Mutex mu_;
  std::map<std::string, json> pods_ ABSL_GUARDED_BY(mu_);
  std::string list_rv_ ABSL_GUARDED_BY(mu_);
  bool synced_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t relists_ ABSL_GUARDED_BY(mu_) = 0;
  // Pods written by this backend (Launch, Claim) -> when, to keep them over
  // a LIST that was answered before the write.
  std::map<std::string, int64_t> remembered_ ABSL_GUARDED_BY(mu_);
  int64_t remember_seq_ ABSL_GUARDED_BY(mu_) = 0;
  EventSink* sink_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::shared_ptr<StreamCanceller> watch_canceller_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

Observed ObservePod(const json& pod) {
  Observed o;
  const json& status = Field(pod, "status");
  o.node = Str(Field(pod, "spec"), "nodeName");
  std::string phase = Str(status, "phase");
  if (phase == "Running") {
    o.state = Observed::State::kRunning;
  } else if (phase == "Succeeded" || phase == "Failed") {
    o.state = Observed::State::kExited;
  } else {
    o.state = Observed::State::kCreating;
  }
  std::string detail = absl::StrCat("Pod phase ", phase.empty() ? "Pending" : phase);
  if (std::string r = Str(status, "reason"); !r.empty()) absl::StrAppend(&detail, " (", r, ")");
  for (const json& cs : Field(status, "containerStatuses")) {
    const json& term = Field(Field(cs, "state"), "terminated");
    if (!term.is_object()) continue;
    const json& code = Field(term, "exitCode");
    if (code.is_number_integer() && !o.exit_code) o.exit_code = code.get<int>();
    std::string reason = Str(term, "reason");
    if (reason == "OOMKilled") o.oom_killed = true;
    absl::StrAppend(&detail, "; container ", Str(cs, "name"), " terminated",
                    reason.empty() ? "" : ": ", reason,
                    code.is_number_integer() ? absl::StrCat(" (exit ", code.get<int>(), ")") : "");
  }
  if (std::string m = Str(status, "message"); !m.empty()) absl::StrAppend(&detail, ": ", m);
  o.reason = detail;
  return o;
}

absl::StatusOr<std::unique_ptr<Backend>> NewKubernetesBackend(KubernetesBackendOptions options) {
  if (options.config.server.empty()) {
    return absl::InvalidArgumentError("kubernetes backend: no API server");
  }
  if (options.instance.empty()) {
    return absl::InvalidArgumentError("kubernetes backend: no instance name");
  }
  return std::unique_ptr<Backend>(new KubernetesBackend(std::move(options)));
}

}  // namespace agentix::providers::kubernetes
