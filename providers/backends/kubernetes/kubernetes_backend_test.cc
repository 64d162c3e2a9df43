// The Kubernetes backend's client logic against testing/k8s/fake_apiserver.py,
// which speaks the Pods API with resourceVersions: create (+ NetworkPolicy),
// the watch cache, relist on 410, adopt on 409, claim by PATCH with a stale
// resourceVersion, delete, a rejected Pod, an unreachable server, logs.
#include "providers/backends/kubernetes/kubernetes_backend.h"

#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "providers/backends/kubernetes/fake_apiserver_process.h"
#include "providers/backends/kubernetes/kube_http.h"
#include "testing/status_matchers.h"

namespace agentix::providers::kubernetes {
namespace {

using testing::FakeApiServer;
using json = nlohmann::json;

class RecordingSink : public EventSink {
 public:
  void OnObserved(const BackendRef& ref, const Observed& observed) override {
    absl::MutexLock lock(&mu_);
    events_.push_back({ref.value, observed});
  }
  // The first event for `name` matching `pred`, waiting up to 5 s.
  std::optional<Observed> WaitFor(const std::string& name,
                                  const std::function<bool(const Observed&)>& pred) {
    absl::Time until = absl::Now() + absl::Seconds(5);
    while (absl::Now() < until) {
      {
        absl::MutexLock lock(&mu_);
        for (auto& [n, o] : events_) {
          if (n == name && pred(o)) return o;
        }
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    return std::nullopt;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::pair<std::string, Observed>> events_;
};

LaunchSpec Spec(const std::string& id, const std::string& uid = "attempt-1") {
  LaunchSpec spec;
  spec.sandbox_id = id;
  spec.uid = uid;
  spec.instance = "pd-test";
  spec.spec.set_image("registry.example/task:1");
  spec.spec.mutable_bundle()->set_oci_reference("registry.example/agentix/bundle:1");
  spec.spec.mutable_bundle()->set_digest(
      "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef");
  spec.admin_token = "admin-token-" + id;
  spec.labels["agentix.dev/managed-by"] = "pd-test";
  spec.labels["team"] = "a";
  return spec;
}

std::unique_ptr<Backend> MakeBackend(FakeApiServer& server, KubeConfig config = {}) {
  KubernetesBackendOptions options;
  options.config = config.server.empty() ? server.Config() : config;
  options.instance = "pd-test";
  options.render.runtime_port = 50051;
  options.render.allow_host_network = true;  // the "network HOST" section
  options.request_timeout = absl::Seconds(5);
  auto backend = NewKubernetesBackend(options);
  REQUIRE(backend.ok());
  return *std::move(backend);
}

template <typename F>
bool Eventually(F f, absl::Duration within = absl::Seconds(5)) {
  absl::Time until = absl::Now() + within;
  while (absl::Now() < until) {
    if (f()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return f();
}

json FindPod(FakeApiServer& server, const std::string& name) {
  for (const auto& pod : server.Control("pods")) {
    if (pod["metadata"]["name"] == name) return pod;
  }
  return nullptr;
}

TEST_CASE("launch creates the Pod and its NetworkPolicy; the endpoint waits for Ready") {
  auto server = FakeApiServer::Start();
  REQUIRE(server.ok());
  auto backend = MakeBackend(**server);
  REQUIRE_OK_AND_ASSIGN(auto caps, backend->Probe());
  CHECK(caps.version() == "v1.31.0-fake");
  CHECK(caps.network_none());

  REQUIRE_OK_AND_ASSIGN(BackendRef ref, backend->Launch(Spec("s1"), absl::Now() + absl::Seconds(10)));
  CHECK(ref.value == "sbx-s1");
  json pod = FindPod(**server, "sbx-s1");
  REQUIRE(pod.is_object());
  CHECK(pod["metadata"]["labels"]["agentix.dev/managed-by"] == "pd-test");
  CHECK(pod["metadata"]["labels"]["agentix.dev/sandbox-id"] == "s1");
  CHECK(pod["metadata"]["labels"]["agentix.dev/uid"] == "attempt-1");
  CHECK(pod["metadata"]["labels"]["agentix.dev/label.team"] == "a");
  // The admin token's Secret, owned by the Pod.
  auto secrets = (*server)->Control("secrets");
  REQUIRE(secrets.size() == 1);
  CHECK(secrets[0]["metadata"]["name"] == "sbx-s1-admin");
  CHECK(secrets[0]["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]);
  CHECK((*server)->Control("netpols").size() == 1);
  // The policy is written before the Pod.
  auto log = (*server)->Requests();
  REQUIRE(log.size() >= 2);
  std::vector<std::string> posts;
  for (auto& r : log) {
    if (r["method"] == "POST") posts.push_back(r["path"]);
  }
  REQUIRE(posts.size() == 3);
  CHECK(posts[0].find("networkpolicies") != std::string::npos);
  CHECK(posts[1].find("/pods") != std::string::npos);
  CHECK(posts[2].find("/secrets") != std::string::npos);

  auto pending = backend->ResolveEndpoint(ref);
  INFO(pending.status().ToString());
  CHECK(pending.status().code() == absl::StatusCode::kUnavailable);
  REQUIRE_OK_AND_ASSIGN(Observed o, backend->Inspect(ref));
  CHECK(o.state == Observed::State::kCreating);

  (*server)->Control("run", {{"namespace", "ns"}, {"name", "sbx-s1"}, {"pod_ip", "10.1.2.3"}});
  REQUIRE(Eventually([&] { return backend->ResolveEndpoint(ref).ok(); }));
  CHECK(backend->ResolveEndpoint(ref)->target() == "ipv4:10.1.2.3:50051");
  REQUIRE_OK_AND_ASSIGN(o, backend->Inspect(ref));
  CHECK(o.state == Observed::State::kRunning);
  CHECK(o.node == "fake-node");

  SECTION("network HOST makes no NetworkPolicy") {
    LaunchSpec host = Spec("s2");
    host.spec.mutable_network()->set_mode(pb::Network::HOST);
    REQUIRE_OK(backend->Launch(host, absl::Now() + absl::Seconds(10)).status());
    CHECK((*server)->Control("netpols").size() == 1);
  }
  backend->Shutdown();
}

TEST_CASE("the watch reports OOMKilled, exit codes and deleted Pods") {
  auto server = FakeApiServer::Start();
  REQUIRE(server.ok());
  auto backend = MakeBackend(**server);
  RecordingSink sink;
  REQUIRE_OK(backend->Watch(&sink));
  REQUIRE_OK_AND_ASSIGN(BackendRef a, backend->Launch(Spec("oom"), absl::Now() + absl::Seconds(10)));
  REQUIRE_OK_AND_ASSIGN(BackendRef b, backend->Launch(Spec("done"), absl::Now() + absl::Seconds(10)));
  REQUIRE_OK_AND_ASSIGN(BackendRef c, backend->Launch(Spec("gone"), absl::Now() + absl::Seconds(10)));
  (*server)->Control("fail", {{"namespace", "ns"}, {"name", a.value}});
  (*server)->Control("fail", {{"namespace", "ns"}, {"name", b.value}, {"reason", "Error"},
                              {"exit_code", 3}});
  (*server)->Control("vanish", {{"namespace", "ns"}, {"name", c.value}});

  auto oom = sink.WaitFor(a.value, [](const Observed& o) { return o.oom_killed; });
  REQUIRE(oom.has_value());
  CHECK(oom->state == Observed::State::kExited);
  CHECK(oom->exit_code == 137);
  CHECK(oom->reason.find("OOMKilled") != std::string::npos);
  auto exited = sink.WaitFor(b.value, [](const Observed& o) {
    return o.state == Observed::State::kExited;
  });
  REQUIRE(exited.has_value());
  CHECK(exited->exit_code == 3);
  CHECK_FALSE(exited->oom_killed);
  auto missing = sink.WaitFor(c.value, [](const Observed& o) {
    return o.state == Observed::State::kMissing;
  });
  REQUIRE(missing.has_value());
  REQUIRE_OK_AND_ASSIGN(Observed o, backend->Inspect(c));
  CHECK(o.state == Observed::State::kMissing);
  auto ended = backend->ResolveEndpoint(a);
  CHECK(ended.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(ended.status().message()).find("OOMKilled") != std::string::npos);
  backend->Shutdown();
}

TEST_CASE("a watch from a compacted resourceVersion gets 410 and the backend relists") {
  auto server = FakeApiServer::Start();
  REQUIRE(server.ok());
  auto backend = MakeBackend(**server);
  RecordingSink sink;
  REQUIRE_OK(backend->Watch(&sink));
  REQUIRE_OK_AND_ASSIGN(BackendRef a, backend->Launch(Spec("r1"), absl::Now() + absl::Seconds(10)));
  auto lists = [&] {
    int n = 0;
    for (auto& r : (*server)->Requests()) {
      if (r["method"] == "GET" && r["path"] == "/api/v1/namespaces/ns/pods" &&
          !r["query"].contains("watch")) {
        n++;
      }
    }
    return n;
  };
  REQUIRE(Eventually([&] { return lists() == 1; }));
  // The Pod fails while the watch is stalled, history is compacted and the
  // connection drops: the re-opened watch gets ERROR 410, and only a relist
  // can find the exit.
  (*server)->Control("freeze");
  (*server)->Control("fail", {{"namespace", "ns"}, {"name", a.value}});
  (*server)->Control("compact");
  (*server)->Control("drop_watches");
  (*server)->Control("thaw");
  REQUIRE(Eventually([&] { return lists() >= 2; }));
  auto oom = sink.WaitFor(a.value, [](const Observed& o) { return o.oom_killed; });
  REQUIRE(oom.has_value());
  // And the watch after the relist delivers new changes.
  REQUIRE_OK_AND_ASSIGN(BackendRef b, backend->Launch(Spec("r2"), absl::Now() + absl::Seconds(10)));
  (*server)->Control("run", {{"namespace", "ns"}, {"name", b.value}});
  REQUIRE(Eventually([&] { return backend->ResolveEndpoint(b).ok(); }));
  backend->Shutdown();
}

TEST_CASE("a create that meets 409 adopts the Pod of the same attempt only") {
  auto server = FakeApiServer::Start();
  REQUIRE(server.ok());
  auto backend = MakeBackend(**server);
  // An earlier POST of this attempt reached the server but its answer was lost.
  REQUIRE_OK_AND_ASSIGN(BackendRef first, backend->Launch(Spec("dup", "u-1"), absl::Now() + absl::Seconds(10)));
  std::string uid = FindPod(**server, "sbx-dup")["metadata"]["uid"];
  REQUIRE_OK_AND_ASSIGN(BackendRef again, backend->Launch(Spec("dup", "u-1"), absl::Now() + absl::Seconds(10)));
  CHECK(again.value == first.value);
  CHECK(FindPod(**server, "sbx-dup")["metadata"]["uid"] == uid);  // not recreated
  auto other = backend->Launch(Spec("dup", "u-2"), absl::Now() + absl::Seconds(10));
  REQUIRE(other.status().code() == absl::StatusCode::kAlreadyExists);
  CHECK(std::string(other.status().message()).find("sbx-dup") != std::string::npos);
  backend->Shutdown();
}

LaunchSpec RequestSpec(const std::string& id, const std::string& uid, const std::string& request) {
  LaunchSpec spec = Spec(id, uid);
  spec.request_id = request;
  return spec;
}

TEST_CASE("the Pod carries the request id and the expiry; without one, the TTL from now") {
  auto server = FakeApiServer::Start();
  REQUIRE(server.ok());
  auto backend = MakeBackend(**server);
  LaunchSpec spec = RequestSpec("ann", "u-1", "req-42");
  spec.expire_time = absl::FromUnixSeconds(1893456000);  // 2030-01-01T00:00:00Z
  REQUIRE_OK(backend->Launch(spec, absl::Now() + absl::Seconds(10)).status());
  json annotations = FindPod(**server, "sbx-ann")["metadata"]["annotations"];
  CHECK(annotations["agentix.dev/request-id"] == "req-42");
  CHECK(annotations["agentix.dev/expire-time"] == "2030-01-01T00:00:00Z");

  LaunchSpec ttl_only = Spec("ttl");
  ttl_only.spec.mutable_ttl()->set_seconds(3600);
  absl::Time before = absl::Now();
  REQUIRE_OK(backend->Launch(ttl_only, absl::Now() + absl::Seconds(10)).status());
  json pod = FindPod(**server, "sbx-ttl");
  CHECK_FALSE(pod["metadata"]["annotations"].contains("agentix.dev/request-id"));
  absl::Time expire;
  std::string err;
  REQUIRE(absl::ParseTime("%Y-%m-%dT%H:%M:%SZ",
                          pod["metadata"]["annotations"]["agentix.dev/expire-time"].get<std::string>(),
                          &expire, &err));
  CHECK(expire >= before + absl::Seconds(3599));
  CHECK(expire <= absl::Now() + absl::Seconds(3601));
  backend->Shutdown();
}

TEST_CASE("extend rewrites the expire-time annotation by one PATCH; errors are definite") {
  auto server = FakeApiServer::Start();
  REQUIRE(server.ok());
  auto backend = MakeBackend(**server);
  LaunchSpec spec = Spec("ext");
  spec.expire_time = absl::FromUnixSeconds(1893456000);  // 2030-01-01T00:00:00Z
  REQUIRE_OK_AND_ASSIGN(BackendRef ref, backend->Launch(spec, absl::Now() + absl::Seconds(10)));
  const json deadline = FindPod(**server, "sbx-ext")["spec"]["activeDeadlineSeconds"];
  REQUIRE(deadline.is_number());

  (*server)->ClearRequests();
  REQUIRE_OK(backend->Extend(ref, absl::FromUnixSeconds(1893459600)));  // +1 h
  CHECK((*server)->Writes() == 1);
  CHECK((*server)->Writes("PATCH") == 1);
  json pod = FindPod(**server, "sbx-ext");
  CHECK(pod["metadata"]["annotations"]["agentix.dev/expire-time"] == "2030-01-01T01:00:00Z");
  CHECK(pod["metadata"]["annotations"]["agentix.dev/spec-hash"].is_string());  // the rest kept
  CHECK(pod["spec"]["activeDeadlineSeconds"] == deadline);  // immutable on a running Pod

  SECTION("forbidden: PERMISSION_DENIED naming the verb, the annotation kept") {
    (*server)->Control("config", {{"forbid", {"patch"}}});
    absl::Status denied = backend->Extend(ref, absl::FromUnixSeconds(1893463200));
    CHECK(denied.code() == absl::StatusCode::kPermissionDenied);
    CHECK(std::string(denied.message()).find("patch") != std::string::npos);
    CHECK(FindPod(**server, "sbx-ext")["metadata"]["annotations"]["agentix.dev/expire-time"] ==
          "2030-01-01T01:00:00Z");
  }
  SECTION("a Pod that is gone: NOT_FOUND") {
    (*server)->Control("vanish", {{"namespace", "ns"}, {"name", ref.value}});
    CHECK(backend->Extend(ref, absl::FromUnixSeconds(1893463200)).code() ==
          absl::StatusCode::kNotFound);
  }
  backend->Shutdown();
}

TEST_CASE("a create that meets 409 adopts the Pod of the same request and spec, by one conditional write") {
  auto server = FakeApiServer::Start();
  REQUIRE(server.ok());
  auto backend = MakeBackend(**server);
  // Attempt 1 of request req-7 made the Pod (then providerd restarted).
  REQUIRE_OK(backend->Launch(RequestSpec("rq", "u-1", "req-7"), absl::Now() + absl::Seconds(10)).status());
  std::string pod_uid = FindPod(**server, "sbx-rq")["metadata"]["uid"];

  // Another request, or the same request with another spec: not ours.
  auto other = backend->Launch(RequestSpec("rq", "u-2", "req-8"), absl::Now() + absl::Seconds(10));
  CHECK(other.status().code() == absl::StatusCode::kAlreadyExists);
  LaunchSpec changed = RequestSpec("rq", "u-2", "req-7");
  changed.spec.set_image("registry.example/task:2");
  CHECK(backend->Launch(changed, absl::Now() + absl::Seconds(10)).status().code() ==
        absl::StatusCode::kAlreadyExists);
  CHECK(FindPod(**server, "sbx-rq")["metadata"]["labels"]["agentix.dev/uid"] == "u-1");

  // Attempt 2 of the same request: adopted, relabelled for this attempt.
  (*server)->ClearRequests();
  REQUIRE_OK_AND_ASSIGN(BackendRef ref, backend->Launch(RequestSpec("rq", "u-2", "req-7"),
                                                        absl::Now() + absl::Seconds(10)));
  CHECK(ref.value == "sbx-rq");
  json pod = FindPod(**server, "sbx-rq");
  CHECK(pod["metadata"]["uid"] == pod_uid);  // the same Pod, not recreated
  CHECK(pod["metadata"]["labels"]["agentix.dev/uid"] == "u-2");
  CHECK((*server)->Writes("PATCH") == 1);
  bool conditional = false;
  for (auto& r : (*server)->Requests()) {
    if (r["method"] == "PATCH" && r["path"] == "/api/v1/namespaces/ns/pods/sbx-rq") conditional = true;
  }
  CHECK(conditional);

  backend->Shutdown();
}

TEST_CASE("a create that meets the same request's Pod being deleted waits for it and makes a new one") {
  auto server = FakeApiServer::Start();
  REQUIRE(server.ok());
  auto backend = MakeBackend(**server);
  REQUIRE_OK(backend->Launch(RequestSpec("gone", "u-1", "req-9"), absl::Now() + absl::Seconds(10)).status());
  std::string old_uid = FindPod(**server, "sbx-gone")["metadata"]["uid"];
  // An earlier attempt's cleanup: a graceful DELETE the kubelet takes 1 s to finish.
  (*server)->Control("config", {{"max_grace_ms", 1000}});
  KubeHttp raw((*server)->Config());
  REQUIRE_OK_AND_ASSIGN(HttpResponse deleting,
                        raw.Request("DELETE", "/api/v1/namespaces/ns/pods/sbx-gone?gracePeriodSeconds=30",
                                    "", "", absl::Seconds(5)));
  REQUIRE(deleting.status == 200);
  REQUIRE(FindPod(**server, "sbx-gone")["metadata"].contains("deletionTimestamp"));
  REQUIRE_OK_AND_ASSIGN(BackendRef ref, backend->Launch(RequestSpec("gone", "u-2", "req-9"),
                                                        absl::Now() + absl::Seconds(10)));
  json pod = FindPod(**server, ref.value);
  REQUIRE(pod.is_object());
  CHECK(pod["metadata"]["uid"] != old_uid);
  CHECK(pod["metadata"]["labels"]["agentix.dev/uid"] == "u-2");
  CHECK_FALSE(pod["metadata"].contains("deletionTimestamp"));
  // Another request's terminating Pod is not waited for.
  REQUIRE_OK_AND_ASSIGN(deleting,
                        raw.Request("DELETE", "/api/v1/namespaces/ns/pods/sbx-gone?gracePeriodSeconds=30",
                                    "", "", absl::Seconds(5)));
  auto other = backend->Launch(RequestSpec("gone", "u-3", "req-10"), absl::Now() + absl::Seconds(10));
  CHECK(other.status().code() == absl::StatusCode::kAlreadyExists);
  backend->Shutdown();
}

TEST_CASE("a warm claim is one PATCH with the resourceVersion; a lost race is ABORTED") {
  auto server = FakeApiServer::Start();
  REQUIRE(server.ok());
  auto a = MakeBackend(**server);
  auto b = MakeBackend(**server);  // a second providerd replica of the same instance
  std::vector<BackendRef> members;
  for (const char* id : {"wp-1", "wp-2", "wp-3"}) {
    REQUIRE_OK_AND_ASSIGN(BackendRef m, a->Launch(Spec(id), absl::Now() + absl::Seconds(10)));
    (*server)->Control("run", {{"namespace", "ns"}, {"name", m.value}});
    members.push_back(m);
  }
  for (auto& m : members) {
    REQUIRE(Eventually([&] { return a->ResolveEndpoint(m).ok() && b->ResolveEndpoint(m).ok(); }));
  }
  auto labels = [&](const BackendRef& m) { return FindPod(**server, m.value)["metadata"]["labels"]; };

  // Uncontended: exactly one API write.
  (*server)->ClearRequests();
  REQUIRE_OK(a->Claim(members[0], ClaimInfo{"sbx-one", {}}));
  CHECK((*server)->Writes() == 1);
  CHECK((*server)->Writes("PATCH") == 1);
  CHECK(labels(members[0])["agentix.dev/claimed"] == "true");
  CHECK(labels(members[0])["agentix.dev/sandbox-id"] == "sbx-one");
  // Once the watch has seen it, a second claim costs no write at all.
  REQUIRE(Eventually([&] { return b->Claim(members[0], ClaimInfo{"sbx-x", {}}).code() ==
                                  absl::StatusCode::kAborted; }));
  CHECK((*server)->Writes() == 1);

  // Two claimers, b's cache stale: b's PATCH carries the old
  // resourceVersion, gets 409 Conflict, reads the Pod and gives it up.
  (*server)->Control("freeze");
  (*server)->ClearRequests();
  REQUIRE_OK(a->Claim(members[1], ClaimInfo{"sbx-a", {}}));
  absl::Status lost = b->Claim(members[1], ClaimInfo{"sbx-b", {}});
  CHECK(lost.code() == absl::StatusCode::kAborted);
  CHECK(std::string(lost.message()).find("sbx-a") != std::string::npos);
  CHECK(labels(members[1])["agentix.dev/sandbox-id"] == "sbx-a");
  CHECK((*server)->Writes("PATCH") == 2);  // a's and b's refused one

  // A stale resourceVersion on an unclaimed member (the kubelet wrote its
  // status): one fresh GET and a second PATCH; still <= 2 writes.
  (*server)->Control("label", {{"namespace", "ns"}, {"name", members[2].value},
                               {"labels", {{"unrelated", "x"}}}});
  (*server)->ClearRequests();
  REQUIRE_OK(b->Claim(members[2], ClaimInfo{"sbx-c", {}}));
  CHECK((*server)->Writes() == 2);
  CHECK(labels(members[2])["agentix.dev/sandbox-id"] == "sbx-c");
  (*server)->Control("thaw");

  // A member that is gone is NOT_FOUND.
  (*server)->Control("vanish", {{"namespace", "ns"}, {"name", members[2].value}});
  REQUIRE(Eventually([&] { return !a->ResolveEndpoint(members[2]).ok(); }));
  CHECK(a->Claim(members[2], ClaimInfo{"sbx-d", {}}).code() == absl::StatusCode::kNotFound);
  a->Shutdown();
  b->Shutdown();
}

TEST_CASE("destroy deletes the Pod and its NetworkPolicy; a missing Pod is OK") {
  auto server = FakeApiServer::Start();
  REQUIRE(server.ok());
  auto backend = MakeBackend(**server);
  REQUIRE_OK_AND_ASSIGN(BackendRef ref, backend->Launch(Spec("del"), absl::Now() + absl::Seconds(10)));
  REQUIRE_OK_AND_ASSIGN(auto owned, backend->ListOwned("pd-test"));
  REQUIRE(owned.size() == 1);
  CHECK(owned[0].value == ref.value);
  REQUIRE_OK_AND_ASSIGN(auto others, backend->ListOwned("someone-else"));
  CHECK(others.empty());
  (*server)->ClearRequests();
  REQUIRE_OK(backend->Destroy(ref, absl::Seconds(1)));
  CHECK(FindPod(**server, "sbx-del").is_null());  // gone once Destroy returns
  CHECK((*server)->Control("netpols").empty());
  CHECK((*server)->Control("secrets").empty());
  bool graceful = false;
  for (auto& r : (*server)->Requests()) {
    if (r["method"] == "DELETE" && r["path"] == "/api/v1/namespaces/ns/pods/sbx-del") {
      graceful = r["query"]["gracePeriodSeconds"] == "1";
    }
  }
  CHECK(graceful);
  REQUIRE_OK_AND_ASSIGN(Observed o, backend->Inspect(ref));
  CHECK(o.state == Observed::State::kMissing);
  REQUIRE_OK(backend->Destroy(ref, absl::ZeroDuration()));  // again: 404 is fine
  backend->Shutdown();
}

TEST_CASE("API errors are definite statuses with the API server's message") {
  auto server = FakeApiServer::Start();
  REQUIRE(server.ok());
  auto backend = MakeBackend(**server);

  SECTION("a Pod the server rejects: INVALID_ARGUMENT, nothing left behind") {
    (*server)->Control("config", {{"reject_create",
                                   "spec.containers[0].resources.limits.memory: Invalid value: "
                                   "\"-1\": must be greater than or equal to 0"}});
    auto launched = backend->Launch(Spec("bad"), absl::Now() + absl::Seconds(10));
    REQUIRE(launched.status().code() == absl::StatusCode::kInvalidArgument);
    std::string message(launched.status().message());
    CHECK(message.find("Pod \"sbx-bad\" is invalid") != std::string::npos);
    CHECK(message.find("must be greater than or equal to 0") != std::string::npos);
    CHECK((*server)->Control("pods").empty());
    CHECK((*server)->Control("netpols").empty());  // the policy was undone
    CHECK((*server)->Control("secrets").empty());
  }
  SECTION("forbidden: PERMISSION_DENIED naming the verb") {
    (*server)->Control("config", {{"forbid", {"create"}}});
    auto launched = backend->Launch(Spec("nope"), absl::Now() + absl::Seconds(10));
    REQUIRE(launched.status().code() == absl::StatusCode::kPermissionDenied);
    CHECK(std::string(launched.status().message()).find("cannot create resource") !=
          std::string::npos);
  }
  SECTION("a wrong token: UNAUTHENTICATED") {
    KubeConfig config = (*server)->Config();
    config.token = "wrong";
    auto other = MakeBackend(**server, config);
    auto probed = other->Probe();
    CHECK(probed.status().code() == absl::StatusCode::kUnauthenticated);
    other->Shutdown();
  }
  backend->Shutdown();
}

TEST_CASE("an unreachable API server is UNAVAILABLE (retryable)") {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  ::close(fd);  // a port nothing listens on
  KubernetesBackendOptions options;
  options.config.server = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  options.config.token = "t";
  options.config.ns = "ns";
  options.instance = "pd-test";
  options.request_timeout = absl::Seconds(2);
  REQUIRE_OK_AND_ASSIGN(auto backend, NewKubernetesBackend(options));
  auto probed = backend->Probe();
  CHECK(probed.status().code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(probed.status().message()).find("not reachable") != std::string::npos);
  absl::Time start = absl::Now();
  auto launched = backend->Launch(Spec("x"), absl::Now() + absl::Seconds(2));
  CHECK(launched.status().code() == absl::StatusCode::kUnavailable);
  CHECK(absl::Now() - start < absl::Seconds(5));
  CHECK(backend->ListOwned("pd-test").status().code() == absl::StatusCode::kUnavailable);
  backend->Shutdown();
}

class Collect : public LogSink {
 public:
  bool OnLogData(int64_t offset, absl::string_view data, bool) override {
    if (text.empty()) first_offset = offset;
    text.append(data.data(), data.size());
    return true;
  }
  std::string text;
  int64_t first_offset = -1;
};

TEST_CASE("logs come from the Pod's log endpoint, from an offset, and follow to the end") {
  auto server = FakeApiServer::Start();
  REQUIRE(server.ok());
  auto backend = MakeBackend(**server);
  REQUIRE_OK_AND_ASSIGN(BackendRef ref, backend->Launch(Spec("logs"), absl::Now() + absl::Seconds(10)));
  (*server)->Control("log", {{"namespace", "ns"}, {"name", ref.value}, {"data", "line one\nline two\n"}});
  Collect all;
  REQUIRE_OK(backend->StreamLogs(ref, 0, false, &all));
  CHECK(all.text == "line one\nline two\n");
  Collect from;
  REQUIRE_OK(backend->StreamLogs(ref, 9, false, &from));
  CHECK(from.text == "line two\n");
  CHECK(from.first_offset == 9);
  CHECK(backend->LogTail(ref, 5) == " two\n");
  // follow: ends when the Pod ends.
  std::thread ender([&] {
    absl::SleepFor(absl::Milliseconds(300));
    (*server)->Control("log", {{"namespace", "ns"}, {"name", ref.value}, {"data", "last\n"}});
    (*server)->Control("fail", {{"namespace", "ns"}, {"name", ref.value}, {"reason", "Completed"},
                                {"exit_code", 0}});
  });
  Collect followed;
  REQUIRE_OK(backend->StreamLogs(ref, 0, true, &followed));
  ender.join();
  CHECK(followed.text == "line one\nline two\nlast\n");
  backend->Shutdown();
}

}  // namespace
}  // namespace agentix::providers::kubernetes
