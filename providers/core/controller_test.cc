#include "providers/core/controller.h"

#include <stdlib.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "providers/core/errors.h"
#include "providers/core/testing/fake_agent.h"
#include "providers/core/testing/fake_backend.h"
#include "testing/status_matchers.h"

namespace agentix::providers {
namespace {

using testing::FakeAgent;
using testing::FakeAgentState;
using testing::FakeBackend;
using testing::FakeWorld;

std::string TempDir() {
  std::string tmpl = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") +
                     "/controller-XXXXXX";
  REQUIRE(mkdtemp(tmpl.data()) != nullptr);
  return tmpl;
}

// One controller over fakes; a second one can be made over the same
// state dir and world (a restart).
struct Harness {
  std::shared_ptr<FakeWorld> world = std::make_shared<FakeWorld>();
  std::shared_ptr<FakeAgentState> agent = std::make_shared<FakeAgentState>();
  ControllerOptions options;
  FakeBackend* backend = nullptr;  // owned by the controller
  std::unique_ptr<SandboxController> controller;

  Harness() {
    options.state_dir = TempDir();
    options.instance = "test";
    options.default_ready_timeout = absl::Seconds(5);
  }
  explicit Harness(const Harness& previous) : world(previous.world), agent(previous.agent),
                                              options(previous.options) {}

  void Start() {
    auto b = std::make_unique<FakeBackend>(world);
    backend = b.get();
    std::vector<std::unique_ptr<Backend>> backends;
    backends.push_back(std::move(b));
    auto c = SandboxController::Create(options, std::move(backends),
                                       std::make_unique<FakeAgent>(agent));
    REQUIRE_OK(c);
    controller = std::move(*c);
    REQUIRE_OK(controller->Start());
  }
};

pb::CreateSandboxRequest Req(const std::string& request_id) {
  pb::CreateSandboxRequest req;
  req.set_request_id(request_id);
  req.mutable_spec()->set_image("host");
  req.mutable_spec()->mutable_bundle()->set_path("/bundle");
  return req;
}

absl::StatusOr<CreateResult> CreateSync(SandboxController& c, const pb::CreateSandboxRequest& req,
                                        const std::string& key = "") {
  absl::Notification done;
  absl::StatusOr<CreateResult> out = absl::UnknownError("no answer");
  c.CreateSandbox(req, key, [&](absl::StatusOr<CreateResult> r) {
    out = std::move(r);
    done.Notify();
  });
  REQUIRE(done.WaitForNotificationWithTimeout(absl::Seconds(20)));
  return out;
}

absl::StatusOr<pb::Sandbox> DeleteSync(SandboxController& c, const std::string& id,
                                       bool wait = true) {
  pb::DeleteSandboxRequest req;
  req.set_id(id);
  req.set_wait(wait);
  req.mutable_grace()->set_nanos(1000000);
  absl::Notification done;
  absl::StatusOr<pb::Sandbox> out = absl::UnknownError("no answer");
  c.DeleteSandbox(req, [&](absl::StatusOr<pb::Sandbox> r) {
    out = std::move(r);
    done.Notify();
  });
  REQUIRE(done.WaitForNotificationWithTimeout(absl::Seconds(20)));
  return out;
}

pb::WaitSandboxResponse WaitSync(SandboxController& c, const std::string& id,
                                 pb::SandboxStatus::Phase until, absl::Duration timeout) {
  pb::WaitSandboxRequest req;
  req.set_id(id);
  req.set_until(until);
  req.mutable_timeout()->set_seconds(absl::ToInt64Seconds(timeout));
  req.mutable_timeout()->set_nanos(
      absl::ToInt64Nanoseconds(timeout - absl::Seconds(absl::ToInt64Seconds(timeout))));
  absl::Notification done;
  pb::WaitSandboxResponse out;
  c.WaitSandbox(req, [&](absl::StatusOr<pb::WaitSandboxResponse> r) {
    REQUIRE(r.ok());
    out = *r;
    done.Notify();
  });
  REQUIRE(done.WaitForNotificationWithTimeout(timeout + absl::Seconds(10)));
  return out;
}

TEST_CASE("Controller: create until READY, arm with a fresh token, delete to TERMINATED",
          "[controller]") {
  Harness h;
  h.Start();
  pb::CreateSandboxRequest req = Req("r1");
  (*req.mutable_labels())["team"] = "ml";
  (*req.mutable_spec()->mutable_env())["SECRET"] = "v";
  REQUIRE_OK_AND_ASSIGN(CreateResult created, CreateSync(*h.controller, req));
  const pb::Sandbox& s = created.sandbox;
  CHECK(s.status().phase() == pb::SandboxStatus::READY);
  CHECK(s.status().launch() == pb::SandboxStatus::COLD);
  CHECK(absl::StartsWith(s.id(), "sbx-"));
  CHECK(s.id().size() == 14);
  CHECK(s.labels().at("team") == "ml");
  CHECK(s.labels().at("agentix.dev/sandbox-id") == s.id());
  CHECK(s.status().endpoint().target() == "fake://" + s.id());
  CHECK(created.access_token.size() == 43);
  CHECK_FALSE(created.replayed);
  CHECK(s.spec().env().empty());  // env reaches the sandbox, not the records
  auto params = h.agent->all();
  REQUIRE(params.size() == 1);
  CHECK(params[0].token == created.access_token);
  CHECK(params[0].env.at("SECRET") == "v");
  CHECK(params[0].sandbox_id == s.id());
  REQUIRE_OK_AND_ASSIGN(pb::Credentials creds, h.controller->GetCredentials(s.id()));
  CHECK(creds.access_token() == created.access_token);
  REQUIRE_OK_AND_ASSIGN(pb::Sandbox got, h.controller->GetSandbox(s.id()));
  CHECK(got.DebugString().find(created.access_token) == std::string::npos);
  CHECK(h.world->live() == 1);

  REQUIRE_OK_AND_ASSIGN(pb::Sandbox deleted, DeleteSync(*h.controller, s.id()));
  CHECK(deleted.status().phase() == pb::SandboxStatus::TERMINATED);
  CHECK(deleted.status().exit().reason() == pb::Exit::DELETED);
  CHECK(h.world->live() == 0);
  // Deleting again returns the terminated record.
  REQUIRE_OK_AND_ASSIGN(pb::Sandbox again, DeleteSync(*h.controller, s.id()));
  CHECK(again.status().phase() == pb::SandboxStatus::TERMINATED);
  auto creds_after = h.controller->GetCredentials(s.id());
  CHECK(creds_after.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(ReasonOf(creds_after.status()) == kReasonTerminated);
  auto m = h.controller->Metrics();
  CHECK(m.create_seconds.count == 1);
  CHECK(m.delete_seconds.count == 1);
  CHECK(m.sandboxes[{"local", "TERMINATED"}] == 1);
}

}  // namespace
}  // namespace agentix::providers
