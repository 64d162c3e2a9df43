// Benchmark (testing/bench/provider.py runs it): providerd-side warm-claim
// latency and API writes per warm claim of the Kubernetes backend, under the
// real SandboxController, against testing/k8s/fake_apiserver.py with
// injected per-request latency. The fake Pods run no daemon, so arming goes
// to a fake agent: what is measured is the controller plus the API server
// round trips of the claim. Prints one JSON line.
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "providers/backends/kubernetes/fake_apiserver_process.h"
#include "providers/backends/kubernetes/kubernetes_backend.h"
#include "providers/core/controller.h"
#include "providers/core/testing/fake_agent.h"

ABSL_FLAG(std::string, fake_apiserver, "testing/k8s/fake_apiserver.py",
          "path of fake_apiserver.py");
ABSL_FLAG(int, claims, 50, "sequential warm claims");
ABSL_FLAG(double, latency_ms, 2.0, "latency the fake API server adds to every request");
ABSL_FLAG(int, pool, 4, "warm pool min_ready");

namespace agentix::providers::kubernetes {
namespace {

int Run() {
  auto server = testing::FakeApiServer::Start({}, absl::GetFlag(FLAGS_fake_apiserver));
  if (!server.ok()) {
    fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return 1;
  }
  (*server)->Control("config", {{"auto_ready", {{"pod_ip", "auto"}, {"delay_ms", 5}}},
                                {"latency_ms", absl::GetFlag(FLAGS_latency_ms)}});
  char dir[] = "/tmp/k8sbench-XXXXXX";
  if (mkdtemp(dir) == nullptr) return 1;
  ControllerOptions options;
  options.state_dir = dir;
  options.instance = "pd-bench";
  options.default_backend = "kubernetes";
  options.default_ready_timeout = absl::Seconds(30);
  KubernetesBackendOptions k8s;
  k8s.config = (*server)->Config();
  k8s.instance = options.instance;
  auto backend = NewKubernetesBackend(k8s);
  if (!backend.ok()) return 1;
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(std::move(*backend));
  auto agent = std::make_shared<providers::testing::FakeAgentState>();
  auto controller = SandboxController::Create(
      options, std::move(backends), std::make_unique<providers::testing::FakeAgent>(agent));
  if (!controller.ok() || !(*controller)->Start().ok()) {
    fprintf(stderr, "controller did not start\n");
    return 1;
  }
  SandboxController& c = **controller;
  pb::WarmPool pool;
  pool.set_name("bench");
  pool.mutable_template_()->set_image("registry.example/task:1");
  pool.mutable_template_()->mutable_bundle()->set_oci_reference("registry.example/agentix/bundle:1");
  pool.mutable_template_()->mutable_bundle()->set_digest(
      "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef");
  pool.set_min_ready(absl::GetFlag(FLAGS_pool));
  pool.set_max_total(absl::GetFlag(FLAGS_pool) + 2);
  if (!c.CreateWarmPool(pool).ok()) return 1;
  auto wait_ready = [&](int n) {
    absl::Time until = absl::Now() + absl::Seconds(60);
    while (absl::Now() < until) {
      if (c.GetWarmPool("bench")->status().ready() >= n) return true;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  };
  std::vector<double> ms;
  int claim_writes = 0;
  int failures = 0;
  for (int i = 0; i < absl::GetFlag(FLAGS_claims); ++i) {
    // A full pool and no delete in flight: the window sees this claim only.
    if (!wait_ready(absl::GetFlag(FLAGS_pool))) return 1;
    (*server)->ClearRequests();
    pb::CreateSandboxRequest req;
    req.set_request_id("claim-" + std::to_string(i));
    *req.mutable_spec() = pool.template_();
    req.mutable_spec()->set_warm_pool("bench");
    absl::Notification done;
    absl::StatusOr<CreateResult> result = absl::UnknownError("");
    absl::Time start = absl::Now();
    c.CreateSandbox(req, "", [&](absl::StatusOr<CreateResult> r) {
      result = std::move(r);
      done.Notify();
    });
    done.WaitForNotification();
    absl::Duration took = absl::Now() - start;
    if (!result.ok() || result->sandbox.status().launch() != pb::SandboxStatus::WARM) {
      failures++;
      fprintf(stderr, "claim %d: %s\n", i,
              result.ok() ? result->sandbox.ShortDebugString().c_str()
                          : result.status().ToString().c_str());
      continue;
    }
    ms.push_back(absl::ToDoubleMilliseconds(took));
    // Writes of the claim: all but the pool's replenishing creates (POSTs
    // to the collections), which make the next member, not this claim.
    for (const auto& r : (*server)->Requests()) {
      if (r.value("write", false) && r.value("method", "") != "POST") claim_writes++;
    }
    pb::DeleteSandboxRequest del;
    del.set_id(result->sandbox.id());
    del.set_wait(true);
    absl::Notification deleted;
    c.DeleteSandbox(del, [&](absl::StatusOr<pb::Sandbox>) { deleted.Notify(); });
    deleted.WaitForNotification();
  }
  c.Shutdown(true);
  std::sort(ms.begin(), ms.end());
  auto pct = [&](double q) {
    if (ms.empty()) return 0.0;
    size_t i = std::min(ms.size() - 1, static_cast<size_t>(q / 100.0 * ms.size()));
    return ms[i];
  };
  nlohmann::json out = {
      {"k8s_claim_p50_ms", pct(50)},
      {"k8s_claim_p99_ms", pct(99)},
      {"k8s_api_writes_per_warm_claim",
       ms.empty() ? 0.0 : static_cast<double>(claim_writes) / ms.size()},
      {"k8s_claims", ms.size()},
      {"k8s_claim_failures", failures},
      {"k8s_injected_latency_ms", absl::GetFlag(FLAGS_latency_ms)}};
  printf("%s\n", out.dump().c_str());
  std::string rm = std::string("rm -rf ") + dir;
  (void)!system(rm.c_str());
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace agentix::providers::kubernetes

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return agentix::providers::kubernetes::Run();
}
