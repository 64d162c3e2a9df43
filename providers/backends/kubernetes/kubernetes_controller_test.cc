// The Kubernetes backend under the real SandboxController (as providerd runs
// it) against testing/k8s/fake_apiserver.py, with a fake daemon agent (the
// fake Pods run no daemon): cold create -> READY -> delete, warm claims
// costing one API write, and a lost claim race served by the next member.
#include <stdlib.h>

#include <catch2/catch.hpp>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "providers/backends/kubernetes/fake_apiserver_process.h"
#include "providers/backends/kubernetes/kubernetes_backend.h"
#include "providers/core/controller.h"
#include "providers/core/testing/fake_agent.h"
#include "testing/status_matchers.h"

namespace agentix::providers::kubernetes {
namespace {

using json = nlohmann::json;
using testing::FakeApiServer;

struct Harness {
  std::unique_ptr<FakeApiServer> server;
  std::shared_ptr<providers::testing::FakeAgentState> agent =
      std::make_shared<providers::testing::FakeAgentState>();
  std::unique_ptr<SandboxController> controller;

  Harness() {
    auto started = FakeApiServer::Start();
    REQUIRE(started.ok());
    server = std::move(*started);
    server->Control("config", {{"auto_ready", {{"pod_ip", "127.0.0.1"}, {"delay_ms", 20}}}});
    std::string dir = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") +
                      "/k8sctl-XXXXXX";
    REQUIRE(mkdtemp(dir.data()) != nullptr);
    ControllerOptions options;
    options.state_dir = dir;
    options.instance = "pd-test";
    options.default_backend = "kubernetes";
    options.default_ready_timeout = absl::Seconds(10);
    KubernetesBackendOptions k8s;
    k8s.config = server->Config();
    k8s.instance = options.instance;
    k8s.request_timeout = absl::Seconds(5);
    auto backend = NewKubernetesBackend(k8s);
    REQUIRE(backend.ok());
    std::vector<std::unique_ptr<Backend>> backends;
    backends.push_back(std::move(*backend));
    auto c = SandboxController::Create(options, std::move(backends),
                                       std::make_unique<providers::testing::FakeAgent>(agent));
    REQUIRE_OK(c);
    controller = std::move(*c);
    REQUIRE_OK(controller->Start());
  }
  ~Harness() {
    if (controller) controller->Shutdown(true);
  }
};

pb::CreateSandboxRequest Req(const std::string& request_id) {
  pb::CreateSandboxRequest req;
  req.set_request_id(request_id);
  req.mutable_spec()->set_image("registry.example/task:1");
  req.mutable_spec()->mutable_bundle()->set_oci_reference("registry.example/agentix/bundle:1");
  req.mutable_spec()->mutable_bundle()->set_digest(
      "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef");
  return req;
}

absl::StatusOr<CreateResult> CreateSync(SandboxController& c, const pb::CreateSandboxRequest& req) {
  absl::Notification done;
  absl::StatusOr<CreateResult> out = absl::UnknownError("no answer");
  c.CreateSandbox(req, "", [&](absl::StatusOr<CreateResult> r) {
    out = std::move(r);
    done.Notify();
  });
  REQUIRE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  return out;
}

absl::StatusOr<pb::Sandbox> DeleteSync(SandboxController& c, const std::string& id) {
  pb::DeleteSandboxRequest req;
  req.set_id(id);
  req.set_wait(true);
  absl::Notification done;
  absl::StatusOr<pb::Sandbox> out = absl::UnknownError("no answer");
  c.DeleteSandbox(req, [&](absl::StatusOr<pb::Sandbox> r) {
    out = std::move(r);
    done.Notify();
  });
  REQUIRE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  return out;
}

template <typename F>
bool Eventually(F f, absl::Duration within = absl::Seconds(10)) {
  absl::Time until = absl::Now() + within;
  while (absl::Now() < until) {
    if (f()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return f();
}

pb::WarmPool PoolOf(int min_ready, int max_total) {
  pb::WarmPool pool;
  pool.set_name("p");
  *pool.mutable_template_() = Req("").spec();
  pool.set_min_ready(min_ready);
  pool.set_max_total(max_total);
  return pool;
}

std::vector<std::string> PodNames(FakeApiServer& server) {
  std::vector<std::string> names;
  for (const auto& pod : server.Control("pods")) names.push_back(pod["metadata"]["name"]);
  return names;
}

TEST_CASE("k8s under the controller: cold create until READY, then delete removes the Pod") {
  Harness h;
  REQUIRE_OK_AND_ASSIGN(CreateResult made, CreateSync(*h.controller, Req("cold")));
  CHECK(made.sandbox.status().phase() == pb::SandboxStatus::READY);
  CHECK(made.sandbox.status().endpoint().target() == "ipv4:127.0.0.1:50051");
  std::string pod = made.sandbox.status().backend_ref();
  CHECK(pod == made.sandbox.id());  // the id already reads sbx-…
  CHECK(PodNames(*h.server) == std::vector<std::string>{pod});
  REQUIRE_OK_AND_ASSIGN(pb::Sandbox gone, DeleteSync(*h.controller, made.sandbox.id()));
  CHECK(gone.status().phase() == pb::SandboxStatus::TERMINATED);
  CHECK(PodNames(*h.server).empty());
  CHECK(h.server->Control("netpols").empty());
  CHECK(h.server->Control("secrets").empty());
}

TEST_CASE("k8s under the controller: an OOM-killed Pod ends its sandbox OOM_KILLED") {
  Harness h;
  REQUIRE_OK_AND_ASSIGN(CreateResult made, CreateSync(*h.controller, Req("oom")));
  h.server->Control("fail", {{"namespace", "ns"}, {"name", made.sandbox.status().backend_ref()}});
  REQUIRE(Eventually([&] {
    auto s = h.controller->GetSandbox(made.sandbox.id());
    return s.ok() && s->status().phase() == pb::SandboxStatus::TERMINATED;
  }));
  auto s = h.controller->GetSandbox(made.sandbox.id());
  CHECK(s->status().exit().reason() == pb::Exit::OOM_KILLED);
  CHECK(s->status().exit().exit_code() == 137);
}

TEST_CASE("k8s under the controller: a warm claim is one API write (the PATCH)") {
  Harness h;
  REQUIRE_OK(h.controller->CreateWarmPool(PoolOf(2, 2)));
  REQUIRE(Eventually([&] { return h.controller->GetWarmPool("p")->status().ready() == 2; }));
  h.server->ClearRequests();
  pb::CreateSandboxRequest req = Req("warm");
  req.mutable_spec()->set_warm_pool("p");
  REQUIRE_OK_AND_ASSIGN(CreateResult warm, CreateSync(*h.controller, req));
  CHECK(warm.sandbox.status().launch() == pb::SandboxStatus::WARM);
  CHECK(warm.sandbox.status().phase() == pb::SandboxStatus::READY);
  std::string pod = warm.sandbox.status().backend_ref();
  // Writes on the claim path: everything but the pool's replenishing
  // creates (POSTs to the collections, for the next member).
  int claim_writes = 0;
  for (const auto& r : h.server->Requests()) {
    if (!r["write"].get<bool>()) continue;
    std::string path = r["path"];
    bool replenish = r["method"] == "POST";
    if (!replenish) claim_writes++;
    if (!replenish) CHECK(path == "/api/v1/namespaces/ns/pods/" + pod);
  }
  CHECK(claim_writes == 1);
  CHECK(h.server->Writes("PATCH") == 1);
  json claimed;
  for (const auto& p : h.server->Control("pods")) {
    if (p["metadata"]["name"] == pod) claimed = p;
  }
  CHECK(claimed["metadata"]["labels"]["agentix.dev/claimed"] == "true");
  CHECK(claimed["metadata"]["labels"]["agentix.dev/sandbox-id"] == warm.sandbox.id());
}

TEST_CASE("k8s under the controller: a member claimed elsewhere (409) is skipped for the next") {
  Harness h;
  REQUIRE_OK(h.controller->CreateWarmPool(PoolOf(1, 2)));
  REQUIRE(Eventually([&] { return h.controller->GetWarmPool("p")->status().ready() == 1; }));
  std::vector<std::string> first = PodNames(*h.server);
  REQUIRE(first.size() == 1);
  pb::WarmPool two = PoolOf(2, 2);
  REQUIRE_OK(h.controller->UpdateWarmPool(two));
  REQUIRE(Eventually([&] { return h.controller->GetWarmPool("p")->status().ready() == 2; }));
  // Another providerd replica claims the oldest member; our watch has not
  // seen it yet, so our PATCH carries a stale resourceVersion.
  h.server->Control("freeze");
  h.server->Control("label", {{"namespace", "ns"}, {"name", first[0]},
                              {"labels", {{"agentix.dev/claimed", "true"},
                                          {"agentix.dev/sandbox-id", "elsewhere"}}}});
  pb::CreateSandboxRequest req = Req("race");
  req.mutable_spec()->set_warm_pool("p");
  REQUIRE_OK_AND_ASSIGN(CreateResult won, CreateSync(*h.controller, req));
  h.server->Control("thaw");
  CHECK(won.sandbox.status().phase() == pb::SandboxStatus::READY);
  CHECK(won.sandbox.status().launch() == pb::SandboxStatus::WARM);
  CHECK(won.sandbox.status().backend_ref() != first[0]);
  CHECK(h.controller->Metrics().counters["pool_claim_conflicts"] == 1);
  // The member the other replica won is left alone.
  std::vector<std::string> now = PodNames(*h.server);
  CHECK(std::find(now.begin(), now.end(), first[0]) != now.end());
}

}  // namespace
}  // namespace agentix::providers::kubernetes
