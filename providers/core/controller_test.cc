#include "providers/core/controller.h"

#include <fstream>
#include <iterator>
#include <stdlib.h>

#include <atomic>
#include <mutex>
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
using testing::FakeConfig;
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

// Records an event stream (the watch tests).
class Events : public WatchObserver {
 public:
  bool OnEvent(const pb::SandboxEvent& event) override {
    absl::MutexLock lock(&mu_);
    events_.push_back(event);
    return true;
  }
  std::vector<pb::SandboxEvent> Take() {
    absl::MutexLock lock(&mu_);
    return std::move(events_);
  }
  size_t size() {
    absl::MutexLock lock(&mu_);
    return events_.size();
  }

 private:
  absl::Mutex mu_;
  std::vector<pb::SandboxEvent> events_;
};

template <typename F>
bool Eventually(F f, absl::Duration timeout = absl::Seconds(10)) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (f()) return true;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return f();
}

int CountSandboxes(SandboxController& c) {
  pb::ListSandboxesRequest req;
  req.set_include_terminated(true);
  req.set_page_size(1000);
  auto resp = c.ListSandboxes(req);
  REQUIRE(resp.ok());
  return resp->sandboxes_size();
}

TEST_CASE("Controller: 1,000 concurrent creates over 100 request ids make exactly 100 "
          "sandboxes; the rest are replays of them",
          "[controller][idempotency]") {
  Harness h;
  FakeConfig config;
  config.launch_latency = absl::Milliseconds(5);
  h.world->set_config(config);
  h.Start();
  constexpr int kThreads = 20, kPerThread = 50, kIds = 100;
  absl::Mutex mu;
  std::map<std::string, std::set<std::pair<std::string, std::string>>> seen;  // rid -> {id, token}
  std::atomic<int> replayed{0}, fresh{0}, failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        std::string rid = "req-" + std::to_string((t * kPerThread + i * 7) % kIds);
        auto r = CreateSync(*h.controller, Req(rid));
        if (!r.ok()) {
          failed++;
          continue;
        }
        (r->replayed ? replayed : fresh)++;
        absl::MutexLock lock(&mu);
        seen[rid].insert({r->sandbox.id(), r->access_token});
        if (r->sandbox.status().phase() != pb::SandboxStatus::READY) failed++;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failed == 0);
  CHECK(fresh == kIds);
  CHECK(replayed == kThreads * kPerThread - kIds);
  CHECK(seen.size() == static_cast<size_t>(kIds));
  std::set<std::string> ids;
  for (auto& [rid, answers] : seen) {
    INFO(rid);
    CHECK(answers.size() == 1);  // one sandbox and one token per request id
    ids.insert(answers.begin()->first);
  }
  CHECK(ids.size() == static_cast<size_t>(kIds));
  CHECK(h.world->launches() == kIds);
  CHECK(h.world->live() == kIds);
  CHECK(CountSandboxes(*h.controller) == kIds);
  CHECK(h.controller->Metrics().counters["replays"] == static_cast<uint64_t>(replayed));
}

TEST_CASE("Controller: a request id reused with another payload is REQUEST_ID_REUSED and "
          "changes nothing; the metadata key is an alias",
          "[controller][idempotency]") {
  Harness h;
  h.Start();
  REQUIRE_OK_AND_ASSIGN(CreateResult first, CreateSync(*h.controller, Req("r1")));
  pb::CreateSandboxRequest other = Req("r1");
  other.mutable_spec()->mutable_resources()->set_pids(100);
  pb::ListSandboxesResponse before = *h.controller->ListSandboxes({});
  auto reused = CreateSync(*h.controller, other);
  CHECK(reused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ReasonOf(reused.status()) == kReasonRequestIdReused);
  pb::ListSandboxesResponse after = *h.controller->ListSandboxes({});
  CHECK(after.resource_version() == before.resource_version());
  CHECK(after.sandboxes_size() == 1);
  CHECK(h.world->launches() == 1);
  // `wait` and `ready_timeout` are not part of the payload.
  pb::CreateSandboxRequest same = Req("r1");
  same.set_wait(pb::CreateSandboxRequest::RETURN_PENDING);
  same.mutable_ready_timeout()->set_seconds(7);
  REQUIRE_OK_AND_ASSIGN(CreateResult replay, CreateSync(*h.controller, same));
  CHECK(replay.replayed);
  CHECK(replay.sandbox.id() == first.sandbox.id());
  CHECK(replay.access_token == first.access_token);
  // x-idempotency-key: the request's own request_id is empty.
  pb::CreateSandboxRequest aliased = Req("");
  REQUIRE_OK_AND_ASSIGN(CreateResult a1, CreateSync(*h.controller, aliased, "key-1"));
  REQUIRE_OK_AND_ASSIGN(CreateResult a2, CreateSync(*h.controller, aliased, "key-1"));
  CHECK(a2.replayed);
  CHECK(a1.sandbox.id() == a2.sandbox.id());
  CHECK(a1.sandbox.request_id() == "key-1");
}

TEST_CASE("Controller: a replay while the sandbox is starting waits for READY",
          "[controller][idempotency]") {
  Harness h;
  FakeConfig config;
  config.launch_latency = absl::Milliseconds(100);
  config.ready_after = absl::Milliseconds(100);
  h.world->set_config(config);
  h.Start();
  pb::CreateSandboxRequest pending = Req("slow");
  pending.set_wait(pb::CreateSandboxRequest::RETURN_PENDING);
  REQUIRE_OK_AND_ASSIGN(CreateResult first, CreateSync(*h.controller, pending));
  CHECK(first.sandbox.status().phase() == pb::SandboxStatus::PENDING);
  CHECK_FALSE(first.access_token.empty());
  REQUIRE_OK_AND_ASSIGN(CreateResult replay, CreateSync(*h.controller, Req("slow")));
  CHECK(replay.replayed);
  CHECK(replay.sandbox.status().phase() == pb::SandboxStatus::READY);
  CHECK(replay.access_token == first.access_token);
  auto waited = WaitSync(*h.controller, first.sandbox.id(), pb::SandboxStatus::READY,
                         absl::Seconds(1));
  CHECK(waited.reached());
}

// Cold start: until the daemon's socket exists, the readiness wait looks
// every 2 ms (a stat for the local backend), not on the health check's
// back-off (2, 4, 8, 16, then 20 ms), so CreateSandbox answers within ~2 ms
// of the daemon listening. Counted, not timed: the back-off allows at most
// 19 looks in 300 ms, whatever the machine's load; 2 ms polls make ~150
// (40 leaves room for sleeps overshooting ~4x on a loaded machine).
TEST_CASE("Controller: the readiness wait looks for the endpoint every few ms "
          "while it is not there",
          "[controller]") {
  Harness h;
  FakeConfig config;
  config.ready_after = absl::Milliseconds(300);
  h.world->set_config(config);
  h.Start();
  const absl::Time start = absl::Now();
  REQUIRE_OK_AND_ASSIGN(CreateResult created, CreateSync(*h.controller, Req("fast")));
  CHECK(created.sandbox.status().phase() == pb::SandboxStatus::READY);
  CHECK(absl::Now() - start >= absl::Milliseconds(300));
  CHECK(h.world->resolves() >= 40);
}

TEST_CASE("Controller: every bad input gets its code and reason and changes nothing",
          "[controller][errors]") {
  Harness h;
  h.options.max_lifetime = absl::Hours(1);
  h.Start();
  REQUIRE_OK_AND_ASSIGN(CreateResult existing, CreateSync(*h.controller, [] {
    auto r = Req("existing");
    r.set_sandbox_id("mine");
    return r;
  }()));
  pb::WarmPool pool;
  pool.set_name("p");
  pool.mutable_template_()->set_image("host");
  pool.mutable_template_()->mutable_bundle()->set_path("/bundle");
  pool.mutable_template_()->mutable_resources()->set_memory_bytes(1 << 30);
  REQUIRE_OK(h.controller->CreateWarmPool(pool));  // min_ready 0: never fills
  auto snapshot = [&] {
    pb::ListSandboxesRequest req;
    req.set_include_terminated(true);
    auto resp = h.controller->ListSandboxes(req);
    REQUIRE(resp.ok());
    return std::make_tuple(resp->resource_version(), resp->sandboxes_size(),
                           h.world->launches(), h.controller->ListWarmPools().size());
  };
  auto before = snapshot();

  struct Case {
    std::string name;
    pb::CreateSandboxRequest request;
    absl::StatusCode code;
    std::string reason;
    std::string message_part;
  };
  std::vector<Case> cases;
  auto add = [&](std::string name, std::function<void(pb::CreateSandboxRequest&)> edit,
                 absl::StatusCode code, std::string reason, std::string part = "") {
    pb::CreateSandboxRequest r = Req("bad-" + name);
    edit(r);
    cases.push_back({name, r, code, reason, part});
  };
  add("no-request-id", [](auto& r) { r.clear_request_id(); },
      absl::StatusCode::kInvalidArgument, kReasonInvalidSpec, "request_id");
  add("no-image", [](auto& r) { r.mutable_spec()->clear_image(); r.mutable_spec()->clear_bundle(); },
      absl::StatusCode::kInvalidArgument, kReasonInvalidSpec, "image");
  add("ttl", [](auto& r) { r.mutable_spec()->mutable_ttl()->set_seconds(7200); },
      absl::StatusCode::kInvalidArgument, kReasonTtlTooLong, "max_lifetime");
  add("neg-ttl", [](auto& r) { r.mutable_spec()->mutable_ttl()->set_seconds(-1); },
      absl::StatusCode::kInvalidArgument, kReasonInvalidSpec, "ttl");
  add("reserved", [](auto& r) { (*r.mutable_labels())["agentix.dev/pool"] = "x"; },
      absl::StatusCode::kInvalidArgument, kReasonInvalidSpec, "reserved");
  add("label", [](auto& r) { (*r.mutable_labels())["team"] = "not ok"; },
      absl::StatusCode::kInvalidArgument, kReasonInvalidSpec, "team");
  add("sandbox-id", [](auto& r) { r.set_sandbox_id("Bad_Id"); },
      absl::StatusCode::kInvalidArgument, kReasonInvalidSpec, "sandbox_id");
  add("taken", [](auto& r) { r.set_sandbox_id("mine"); },
      absl::StatusCode::kAlreadyExists, kReasonSandboxIdTaken, "mine");
  add("backend", [](auto& r) { r.mutable_spec()->set_backend("nope"); },
      absl::StatusCode::kInvalidArgument, kReasonInvalidSpec, "nope");
  add("validate", [](auto& r) { r.mutable_spec()->set_image("invalid-image"); },
      absl::StatusCode::kInvalidArgument, "", "invalid-image");
  add("gpu", [](auto& r) { r.mutable_spec()->mutable_resources()->set_gpus(1); },
      absl::StatusCode::kFailedPrecondition, "", "GPU");
  add("pool-unknown", [](auto& r) { r.mutable_spec()->set_warm_pool("nopool"); },
      absl::StatusCode::kNotFound, kReasonPoolNotFound, "nopool");
  add("pool-mismatch", [](auto& r) { r.mutable_spec()->set_warm_pool("p"); },
      absl::StatusCode::kFailedPrecondition, kReasonPoolMismatch, "resources");
  add("pool-empty", [](auto& r) {
        r.mutable_spec()->set_warm_pool("p");
        r.mutable_spec()->mutable_resources()->set_memory_bytes(1 << 30);
        r.set_on_pool_miss(pb::CreateSandboxRequest::FAIL);
      },
      absl::StatusCode::kResourceExhausted, kReasonPoolMiss, "p");
  add("reused", [](auto& r) {
        r.set_request_id("existing");
        (*r.mutable_labels())["x"] = "y";
      },
      absl::StatusCode::kInvalidArgument, kReasonRequestIdReused, "existing");
  for (const Case& c : cases) {
    INFO(c.name);
    auto r = CreateSync(*h.controller, c.request);
    REQUIRE_FALSE(r.ok());
    INFO(r.status().ToString());
    CHECK(r.status().code() == c.code);
    if (!c.reason.empty()) CHECK(ReasonOf(r.status()) == c.reason);
    CHECK(std::string(r.status().message()).find(c.message_part) != std::string::npos);
    if (c.name == "pool-empty") CHECK(RetryAfterOf(r.status()).has_value());
    CHECK(snapshot() == before);
  }
  // A request refused for bad input can be sent again, fixed, under its id.
  REQUIRE_OK(CreateSync(*h.controller, Req("bad-label")));
  before = snapshot();

  // Unknown ids everywhere.
  auto not_found = [](const absl::Status& s) {
    return s.code() == absl::StatusCode::kNotFound && ReasonOf(s) == kReasonSandboxNotFound;
  };
  CHECK(not_found(h.controller->GetSandbox("nope").status()));
  CHECK(not_found(h.controller->GetCredentials("nope").status()));
  pb::ExtendSandboxRequest extend;
  extend.set_id("nope");
  extend.mutable_ttl()->set_seconds(10);
  CHECK(not_found(h.controller->ExtendSandbox(extend).status()));
  CHECK(not_found(DeleteSync(*h.controller, "nope").status()));
  pb::DeleteSandboxRequest missing;
  missing.set_id("nope");
  missing.set_allow_missing(true);
  absl::Notification deleted;
  h.controller->DeleteSandbox(missing, [&](absl::StatusOr<pb::Sandbox> r) {
    CHECK(r.ok());
    deleted.Notify();
  });
  deleted.WaitForNotification();
  pb::WaitSandboxRequest wait;
  wait.set_id("nope");
  absl::Notification waited;
  h.controller->WaitSandbox(wait, [&](absl::StatusOr<pb::WaitSandboxResponse> r) {
    CHECK(not_found(r.status()));
    waited.Notify();
  });
  waited.WaitForNotification();
  pb::StreamSandboxLogsRequest logs;
  logs.set_id("nope");
  CHECK(not_found(h.controller->StreamLogs(logs, nullptr)));
  // Extend: ttl above the maximum; not positive.
  extend.set_id("mine");
  extend.mutable_ttl()->set_seconds(7200);
  CHECK(ReasonOf(h.controller->ExtendSandbox(extend).status()) == kReasonTtlTooLong);
  extend.mutable_ttl()->set_seconds(0);
  CHECK(h.controller->ExtendSandbox(extend).status().code() ==
        absl::StatusCode::kInvalidArgument);
  // Selectors.
  pb::ListSandboxesRequest list;
  list.set_label_selector("team in (a");
  auto listed = h.controller->ListSandboxes(list);
  CHECK(ReasonOf(listed.status()) == kReasonInvalidSelector);
  Events events;
  pb::WatchSandboxesRequest watch;
  watch.set_label_selector("=x");
  auto watched = h.controller->Watch(watch, &events);
  CHECK(watched.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ReasonOf(watched.status()) == kReasonInvalidSelector);
  // Pools.
  CHECK(ReasonOf(h.controller->CreateWarmPool(pool).status()) == kReasonPoolExists);
  CHECK(ReasonOf(h.controller->GetWarmPool("nopool").status()) == kReasonPoolNotFound);
  CHECK(ReasonOf(h.controller->DeleteWarmPool("nopool", false)) == kReasonPoolNotFound);
  CHECK(h.controller->DeleteWarmPool("nopool", true).ok());
  pb::WarmPool bad_pool = pool;
  bad_pool.set_name("q");
  bad_pool.set_min_ready(5);
  bad_pool.set_max_total(2);
  CHECK(ReasonOf(h.controller->CreateWarmPool(bad_pool).status()) == kReasonInvalidSpec);
  (*bad_pool.mutable_labels())["agentix.dev/x"] = "y";
  bad_pool.set_max_total(5);
  CHECK(ReasonOf(h.controller->CreateWarmPool(bad_pool).status()) == kReasonInvalidSpec);
  // An update is checked the same way, and the pool stays as it was.
  REQUIRE_OK_AND_ASSIGN(pb::WarmPool pool_before, h.controller->GetWarmPool("p"));
  pb::WarmPool bad_update = pool;
  bad_update.set_min_ready(5);
  bad_update.set_max_total(2);
  CHECK(ReasonOf(h.controller->UpdateWarmPool(bad_update).status()) == kReasonInvalidSpec);
  bad_update = pool;
  bad_update.mutable_template_()->set_backend("no-such-backend");
  CHECK(ReasonOf(h.controller->UpdateWarmPool(bad_update).status()) == kReasonInvalidSpec);
  bad_update = pool;
  bad_update.set_name("nopool");
  CHECK(ReasonOf(h.controller->UpdateWarmPool(bad_update).status()) == kReasonPoolNotFound);
  REQUIRE_OK_AND_ASSIGN(pb::WarmPool pool_after, h.controller->GetWarmPool("p"));
  CHECK(pool_after.SerializeAsString() == pool_before.SerializeAsString());
  CHECK(snapshot() == before);
  REQUIRE_OK_AND_ASSIGN(pb::Sandbox still, h.controller->GetSandbox("mine"));
  CHECK(still.status().phase() == pb::SandboxStatus::READY);
}

TEST_CASE("Controller: failed starts end TERMINATED with the reason and the output tail, "
          "and leave nothing behind",
          "[controller][start]") {
  Harness h;
  h.options.default_ready_timeout = absl::Milliseconds(300);
  h.Start();
  struct Case {
    std::string name;
    std::function<void(FakeConfig&)> config;
    std::function<void()> agent;
    absl::StatusCode code;
    std::string reason;
    pb::Exit::Reason exit;
    std::string tail;
  };
  std::vector<Case> cases = {
      {"launch", [](FakeConfig& c) { c.fail_launches = 1; }, [] {},
       absl::StatusCode::kFailedPrecondition, kReasonStartFailed, pb::Exit::START_FAILED,
       "boom"},
      {"exit", [](FakeConfig& c) { c.exit_before_ready = true; }, [] {},
       absl::StatusCode::kFailedPrecondition, kReasonStartFailed, pb::Exit::START_FAILED,
       "fatal"},
      {"oom", [](FakeConfig& c) { c.oom_before_ready = true; }, [] {},
       absl::StatusCode::kFailedPrecondition, kReasonStartFailed, pb::Exit::OOM_KILLED,
       "fatal"},
      {"timeout", [](FakeConfig& c) { c.ready_after = absl::Seconds(30); }, [] {},
       absl::StatusCode::kDeadlineExceeded, kReasonReadyTimeout, pb::Exit::READY_TIMEOUT,
       "bootstrap"},
      {"token-rule", [](FakeConfig&) {},
       [&] {
         absl::MutexLock lock(&h.agent->mu);
         h.agent->refuse_token_rule = true;
       },
       absl::StatusCode::kFailedPrecondition, kReasonStartFailed, pb::Exit::START_FAILED,
       "bootstrap"},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    FakeConfig config;
    c.config(config);
    h.world->set_config(config);
    c.agent();
    absl::Time start = absl::Now();
    auto r = CreateSync(*h.controller, Req("fail-" + c.name));
    REQUIRE_FALSE(r.ok());
    INFO(r.status().ToString());
    CHECK(r.status().code() == c.code);
    CHECK(ReasonOf(r.status()) == c.reason);
    CHECK(absl::Now() - start < absl::Seconds(3));
    pb::ListSandboxesRequest list;
    list.set_label_selector("");
    list.set_include_terminated(true);
    pb::Sandbox record;
    auto listed = h.controller->ListSandboxes(list);
    REQUIRE(listed.ok());
    for (auto& s : listed->sandboxes()) {
      if (s.request_id() == "fail-" + c.name) record = s;
    }
    CHECK(record.status().phase() == pb::SandboxStatus::TERMINATED);
    CHECK(record.status().exit().reason() == c.exit);
    CHECK(record.status().exit().log_tail().find(c.tail) != std::string::npos);
    CHECK(h.world->live() == 0);
    CHECK_FALSE(h.agent->IsActivated(record.id()));
    // READY can no longer be reached; the wait says so at once.
    absl::Time wait_start = absl::Now();
    auto never = WaitSync(*h.controller, record.id(), pb::SandboxStatus::READY,
                          absl::Seconds(10));
    CHECK_FALSE(never.reached());
    CHECK(absl::Now() - wait_start < absl::Seconds(1));
    // A replay answers the same error.
    auto replay = CreateSync(*h.controller, Req("fail-" + c.name));
    CHECK(replay.status().code() == c.code);
    absl::MutexLock lock(&h.agent->mu);
    h.agent->refuse_token_rule = false;
  }
  CHECK(h.controller->Metrics().counters["start_failures"] == cases.size());
}

TEST_CASE("Controller: backend exits end READY sandboxes COMPLETED or OOM_KILLED with the tail",
          "[controller][events]") {
  Harness h;
  h.Start();
  REQUIRE_OK_AND_ASSIGN(CreateResult a, CreateSync(*h.controller, Req("a")));
  REQUIRE_OK_AND_ASSIGN(CreateResult b, CreateSync(*h.controller, Req("b")));
  REQUIRE(h.backend->Exit(a.sandbox.id(), 0, false));
  REQUIRE(h.backend->Exit(b.sandbox.id(), 137, true));
  auto wa = WaitSync(*h.controller, a.sandbox.id(), pb::SandboxStatus::TERMINATED,
                     absl::Seconds(5));
  auto wb = WaitSync(*h.controller, b.sandbox.id(), pb::SandboxStatus::TERMINATED,
                     absl::Seconds(5));
  CHECK(wa.reached());
  CHECK(wa.sandbox().status().exit().reason() == pb::Exit::COMPLETED);
  CHECK(wa.sandbox().status().exit().log_tail().find("exited with 0") != std::string::npos);
  CHECK(wb.sandbox().status().exit().reason() == pb::Exit::OOM_KILLED);
  CHECK(wb.sandbox().status().exit().exit_code() == 137);
  CHECK(h.world->live() == 0);
  // READY was passed: reached.
  auto passed = WaitSync(*h.controller, a.sandbox.id(), pb::SandboxStatus::READY,
                         absl::Seconds(1));
  CHECK(passed.reached());
}

TEST_CASE("Controller: TTL ends a sandbox TTL_EXPIRED within 1 s; Extend moves it",
          "[controller][ttl]") {
  Harness h;
  h.options.default_delete_grace = absl::ZeroDuration();
  h.Start();
  pb::CreateSandboxRequest short_ttl = Req("ttl");
  short_ttl.mutable_spec()->mutable_ttl()->set_nanos(300 * 1000000);
  REQUIRE_OK_AND_ASSIGN(CreateResult a, CreateSync(*h.controller, short_ttl));
  pb::CreateSandboxRequest extended = Req("ttl2");
  extended.mutable_spec()->mutable_ttl()->set_nanos(300 * 1000000);
  REQUIRE_OK_AND_ASSIGN(CreateResult b, CreateSync(*h.controller, extended));
  pb::ExtendSandboxRequest extend;
  extend.set_id(b.sandbox.id());
  extend.mutable_ttl()->set_seconds(60);
  REQUIRE_OK_AND_ASSIGN(pb::Sandbox ext, h.controller->ExtendSandbox(extend));
  CHECK(ext.status().expire_time().seconds() > a.sandbox.status().expire_time().seconds() + 50);
  // The backend is told the new expiry too (Kubernetes: the Pod's annotation).
  auto told = [&] {
    absl::MutexLock lock(&h.world->mu);
    auto it = h.world->sandboxes.find(ext.status().backend_ref());
    return it != h.world->sandboxes.end() &&
           absl::ToUnixSeconds(it->second.extended_to) == ext.status().expire_time().seconds();
  };
  CHECK(Eventually(told));
  auto w = WaitSync(*h.controller, a.sandbox.id(), pb::SandboxStatus::TERMINATED,
                    absl::Seconds(3));
  REQUIRE(w.reached());
  const pb::SandboxStatus& st = w.sandbox().status();
  CHECK(st.exit().reason() == pb::Exit::TTL_EXPIRED);
  absl::Duration late = absl::Seconds(st.end_time().seconds() - st.expire_time().seconds()) +
                        absl::Nanoseconds(st.end_time().nanos() - st.expire_time().nanos());
  CHECK(late >= absl::ZeroDuration());
  CHECK(late < absl::Seconds(1));
  REQUIRE_OK_AND_ASSIGN(pb::Sandbox still, h.controller->GetSandbox(b.sandbox.id()));
  CHECK(still.status().phase() == pb::SandboxStatus::READY);
  CHECK(h.controller->Metrics().counters["reaped_ttl"] == 1);
  // Extend on a terminated sandbox.
  extend.set_id(a.sandbox.id());
  auto refused = h.controller->ExtendSandbox(extend);
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(ReasonOf(refused.status()) == kReasonTerminated);
}

TEST_CASE("Controller: idle_timeout ends an idle sandbox IDLE_TIMEOUT, not a busy one",
          "[controller][idle]") {
  Harness h;
  h.options.default_delete_grace = absl::ZeroDuration();
  h.Start();
  pb::CreateSandboxRequest req = Req("idle");
  req.mutable_spec()->mutable_idle_timeout()->set_nanos(200 * 1000000);
  REQUIRE_OK_AND_ASSIGN(CreateResult idle, CreateSync(*h.controller, req));
  pb::CreateSandboxRequest busy_req = Req("busy");
  busy_req.mutable_spec()->mutable_idle_timeout()->set_nanos(200 * 1000000);
  REQUIRE_OK_AND_ASSIGN(CreateResult busy, CreateSync(*h.controller, busy_req));
  {
    absl::MutexLock lock(&h.agent->mu);
    h.agent->busy["fake://" + busy.sandbox.id()] = 1;
  }
  auto w = WaitSync(*h.controller, idle.sandbox.id(), pb::SandboxStatus::TERMINATED,
                    absl::Seconds(3));
  REQUIRE(w.reached());
  CHECK(w.sandbox().status().exit().reason() == pb::Exit::IDLE_TIMEOUT);
  REQUIRE_OK_AND_ASSIGN(pb::Sandbox b, h.controller->GetSandbox(busy.sandbox.id()));
  CHECK(b.status().phase() == pb::SandboxStatus::READY);
}

TEST_CASE("Controller: delete while starting ends it DELETED and destroys what was launched",
          "[controller][delete]") {
  Harness h;
  FakeConfig config;
  config.ready_after = absl::Seconds(30);
  h.world->set_config(config);
  h.Start();
  absl::Notification done;
  absl::StatusOr<CreateResult> result = absl::UnknownError("");
  h.controller->CreateSandbox(Req("del"), "", [&](absl::StatusOr<CreateResult> r) {
    result = r;
    done.Notify();
  });
  std::string id;
  REQUIRE(Eventually([&] {
    auto list = h.controller->ListSandboxes({});
    if (list->sandboxes_size() != 1 || h.world->live() != 1) return false;
    id = list->sandboxes(0).id();
    return true;
  }));
  REQUIRE_OK_AND_ASSIGN(pb::Sandbox deleted, DeleteSync(*h.controller, id));
  CHECK(deleted.status().phase() == pb::SandboxStatus::TERMINATED);
  CHECK(deleted.status().exit().reason() == pb::Exit::DELETED);
  REQUIRE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  CHECK(result.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(ReasonOf(result.status()) == kReasonTerminated);
  CHECK(h.world->live() == 0);
}

TEST_CASE("Controller: retention ends with a DELETED watch event and the record gone",
          "[controller][watch]") {
  Harness h;
  h.options.retention = absl::Milliseconds(200);
  h.Start();
  REQUIRE_OK_AND_ASSIGN(CreateResult a, CreateSync(*h.controller, Req("ret")));
  Events events;
  pb::WatchSandboxesRequest watch;
  REQUIRE_OK_AND_ASSIGN(auto handle, h.controller->Watch(watch, &events));
  REQUIRE_OK(DeleteSync(*h.controller, a.sandbox.id()));
  REQUIRE(Eventually([&] { return !h.controller->GetSandbox(a.sandbox.id()).ok(); },
                     absl::Seconds(3)));
  REQUIRE(Eventually([&] { return events.size() >= 3; }));
  auto got = events.Take();
  CHECK(got.back().type() == pb::SandboxEvent::DELETED);
  CHECK(got.back().sandbox().id() == a.sandbox.id());
  CHECK(got.back().sandbox().status().phase() == pb::SandboxStatus::TERMINATED);
}

TEST_CASE("Controller: watch resumes without a gap across 100 re-subscriptions during "
          "1,000 transitions",
          "[controller][watch]") {
  Harness h;
  h.Start();
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    REQUIRE_OK_AND_ASSIGN(CreateResult r, CreateSync(*h.controller, Req("w" + std::to_string(i))));
    ids.push_back(r.sandbox.id());
  }
  REQUIRE_OK_AND_ASSIGN(pb::ListSandboxesResponse list, h.controller->ListSandboxes({}));
  int64_t start_rv = list.resource_version();
  std::string epoch = list.epoch();
  std::atomic<bool> writing{true};
  std::thread writer([&] {
    for (int i = 0; i < 1000; ++i) {
      pb::ExtendSandboxRequest extend;
      extend.set_id(ids[i % ids.size()]);
      extend.mutable_ttl()->set_seconds(100 + i);
      REQUIRE(h.controller->ExtendSandbox(extend).ok());
      if (i % 10 == 0) absl::SleepFor(absl::Microseconds(200));
    }
    writing = false;
  });
  std::set<int64_t> seen;
  int64_t last = start_rv;
  int resubscriptions = 0;
  for (; resubscriptions < 100 || writing; ++resubscriptions) {
    Events events;
    pb::WatchSandboxesRequest watch;
    watch.set_resource_version(last);
    watch.set_epoch(epoch);
    auto handle = h.controller->Watch(watch, &events);
    REQUIRE_OK(handle);
    absl::SleepFor(absl::Microseconds(300));
    handle->reset();  // no event after this
    for (const auto& e : events.Take()) {
      CHECK(e.epoch() == epoch);
      CHECK(e.resource_version() > last);  // in order, after where we resumed
      last = e.resource_version();
      seen.insert(last);
    }
    if (resubscriptions > 10000) break;
  }
  writer.join();
  {  // drain what is left
    Events events;
    pb::WatchSandboxesRequest watch;
    watch.set_resource_version(last);
    watch.set_epoch(epoch);
    REQUIRE_OK_AND_ASSIGN(auto handle, h.controller->Watch(watch, &events));
    REQUIRE(Eventually([&] { return events.size() >= static_cast<size_t>(start_rv + 1000 - last); }));
    handle.reset();
    for (const auto& e : events.Take()) seen.insert(e.resource_version());
  }
  CHECK(resubscriptions >= 100);
  REQUIRE(seen.size() == 1000);
  CHECK(*seen.begin() == start_rv + 1);
  CHECK(*seen.rbegin() == start_rv + 1000);
}

TEST_CASE("Controller: watch from a too old version or another epoch is OUT_OF_RANGE",
          "[controller][watch]") {
  Harness h;
  h.options.watch_history = 10;
  h.Start();
  REQUIRE_OK_AND_ASSIGN(CreateResult a, CreateSync(*h.controller, Req("a")));
  for (int i = 0; i < 30; ++i) {
    pb::ExtendSandboxRequest extend;
    extend.set_id(a.sandbox.id());
    extend.mutable_ttl()->set_seconds(100 + i);
    REQUIRE_OK(h.controller->ExtendSandbox(extend));
  }
  REQUIRE_OK_AND_ASSIGN(pb::ListSandboxesResponse list, h.controller->ListSandboxes({}));
  Events events;
  pb::WatchSandboxesRequest watch;
  watch.set_resource_version(1);
  watch.set_epoch(list.epoch());
  auto old = h.controller->Watch(watch, &events);
  CHECK(old.status().code() == absl::StatusCode::kOutOfRange);
  CHECK(ReasonOf(old.status()) == kReasonWatchExpired);
  watch.set_resource_version(list.resource_version());
  watch.set_epoch("another");
  auto other = h.controller->Watch(watch, &events);
  CHECK(other.status().code() == absl::StatusCode::kOutOfRange);
  watch.set_epoch(list.epoch());
  CHECK(h.controller->Watch(watch, &events).ok());
  // send_initial: the current state first.
  Events initial;
  pb::WatchSandboxesRequest from_now;
  from_now.set_send_initial(true);
  REQUIRE_OK_AND_ASSIGN(auto handle, h.controller->Watch(from_now, &initial));
  REQUIRE(Eventually([&] { return initial.size() == 1; }));
  auto got = initial.Take();
  CHECK(got[0].type() == pb::SandboxEvent::ADDED);
  CHECK(got[0].sandbox().id() == a.sandbox.id());
  CHECK(h.controller->Metrics().counters["watch_relists"] == 2);
}

TEST_CASE("Controller: a restart replays the journal: records, request ids and pools come "
          "back, live ones are BACKEND_LOST, orphans are destroyed, a torn tail is dropped",
          "[controller][restart]") {
  Harness h;
  h.Start();
  REQUIRE_OK_AND_ASSIGN(CreateResult live, CreateSync(*h.controller, Req("live")));
  REQUIRE_OK_AND_ASSIGN(CreateResult done, CreateSync(*h.controller, Req("done")));
  REQUIRE_OK(DeleteSync(*h.controller, done.sandbox.id()));
  pb::WarmPool pool;
  pool.set_name("p");
  *pool.mutable_template_() = Req("").spec();
  pool.mutable_template_()->set_image("other");
  pool.set_min_ready(2);
  REQUIRE_OK(h.controller->CreateWarmPool(pool));
  REQUIRE(Eventually([&] { return h.controller->GetWarmPool("p")->status().ready() == 2; }));
  std::string epoch = h.controller->ListSandboxes({})->epoch();
  h.controller->Shutdown(false);  // like kill -9: sandboxes stay; pool members go
  h.controller.reset();
  std::string orphan = h.world->AddOrphan("test");
  std::string foreign = h.world->AddOrphan("someone-else");
  {  // a torn record at the end (kill -9 mid-write)
    FILE* f = fopen((h.options.state_dir + "/journal").c_str(), "ab");
    REQUIRE(f);
    fwrite("\x40\x00\x00\x00\x12\x34\x56\x78\x01\x02\x03\x04", 1, 12, f);
    fclose(f);
  }
  CHECK(h.world->live() == 3);  // live + orphan + foreign

  Harness second(h);
  absl::Time start = absl::Now();
  second.Start();
  CHECK(absl::Now() - start < absl::Seconds(3));
  REQUIRE_OK_AND_ASSIGN(pb::Sandbox lost, second.controller->GetSandbox(live.sandbox.id()));
  CHECK(lost.status().phase() == pb::SandboxStatus::TERMINATED);
  CHECK(lost.status().exit().reason() == pb::Exit::BACKEND_LOST);
  REQUIRE_OK_AND_ASSIGN(pb::Sandbox kept, second.controller->GetSandbox(done.sandbox.id()));
  CHECK(kept.status().exit().reason() == pb::Exit::DELETED);
  // Destroyed: the lost sandbox and our orphan; not another instance's.
  auto destroyed = h.world->destroyed();
  CHECK(std::count(destroyed.begin(), destroyed.end(), orphan) == 1);
  CHECK(std::count(destroyed.begin(), destroyed.end(), foreign) == 0);
  CHECK(std::count(destroyed.begin(), destroyed.end(), live.sandbox.status().backend_ref()) == 1);
  // Request ids: same payload replays, another is refused.
  REQUIRE_OK_AND_ASSIGN(CreateResult replay, CreateSync(*second.controller, Req("live")));
  CHECK(replay.replayed);
  CHECK(replay.sandbox.id() == live.sandbox.id());
  CHECK(replay.access_token == live.access_token);
  pb::CreateSandboxRequest changed = Req("live");
  changed.mutable_spec()->set_image("x");
  CHECK(ReasonOf(CreateSync(*second.controller, changed).status()) == kReasonRequestIdReused);
  // The pool is back and refills.
  REQUIRE(Eventually([&] {
    auto p = second.controller->GetWarmPool("p");
    return p.ok() && p->status().ready() == 2;
  }));
  // A new epoch: watching from the old one is OUT_OF_RANGE.
  Events events;
  pb::WatchSandboxesRequest watch;
  watch.set_resource_version(1);
  watch.set_epoch(epoch);
  CHECK(second.controller->Watch(watch, &events).status().code() ==
        absl::StatusCode::kOutOfRange);
  CHECK(second.controller->Metrics().counters["backend_lost"] == 1);

  // A third start reads the compacted journal the same way.
  second.controller.reset();
  Harness third(h);
  third.Start();
  REQUIRE_OK_AND_ASSIGN(pb::Sandbox again, third.controller->GetSandbox(live.sandbox.id()));
  CHECK(again.status().exit().reason() == pb::Exit::BACKEND_LOST);
  CHECK(third.controller->Metrics().counters["backend_lost"] == 0);
}

TEST_CASE("Controller: after a restart, READY sandboxes that survived it (containers) and "
          "still answer are adopted again: same id, token and expiry; the dead and orphans "
          "are destroyed",
          "[controller][restart]") {
  Harness h;
  FakeConfig survive;
  survive.survive_restart = true;
  h.world->set_config(survive);
  h.Start();
  pb::CreateSandboxRequest short_lived = Req("short");
  short_lived.mutable_spec()->mutable_ttl()->set_seconds(3);
  REQUIRE_OK_AND_ASSIGN(CreateResult alive, CreateSync(*h.controller, Req("alive")));
  REQUIRE_OK_AND_ASSIGN(CreateResult expiring, CreateSync(*h.controller, short_lived));
  REQUIRE_OK_AND_ASSIGN(CreateResult dead, CreateSync(*h.controller, Req("dead")));
  REQUIRE_OK_AND_ASSIGN(CreateResult later_exit, CreateSync(*h.controller, Req("later")));
  h.controller->Shutdown(false);  // like kill -9: the sandboxes stay
  h.controller.reset();
  {  // one died while providerd was down (no event reached anyone)
    absl::MutexLock lock(&h.world->mu);
    for (auto& [ref, sb] : h.world->sandboxes) {
      if (sb.spec.sandbox_id == dead.sandbox.id()) {
        sb.observed.state = Observed::State::kExited;
        sb.observed.exit_code = 1;
      }
    }
  }
  std::string orphan = h.world->AddOrphan("test");

  Harness second(h);
  absl::Time start = absl::Now();
  second.Start();
  CHECK(absl::Now() - start < absl::Seconds(3));
  REQUIRE_OK_AND_ASSIGN(pb::Sandbox kept, second.controller->GetSandbox(alive.sandbox.id()));
  CHECK(kept.status().phase() == pb::SandboxStatus::READY);
  CHECK(kept.status().backend_ref() == alive.sandbox.status().backend_ref());
  CHECK(kept.status().endpoint().target() == alive.sandbox.status().endpoint().target());
  CHECK(kept.status().expire_time().seconds() == alive.sandbox.status().expire_time().seconds());
  REQUIRE_OK_AND_ASSIGN(pb::Credentials creds,
                        second.controller->GetCredentials(alive.sandbox.id()));
  CHECK(creds.access_token() == alive.access_token);
  // The request id still answers with the same sandbox and token.
  REQUIRE_OK_AND_ASSIGN(CreateResult replay, CreateSync(*second.controller, Req("alive")));
  CHECK(replay.replayed);
  CHECK(replay.access_token == alive.access_token);
  CHECK(replay.sandbox.status().phase() == pb::SandboxStatus::READY);
  REQUIRE_OK_AND_ASSIGN(pb::Sandbox lost, second.controller->GetSandbox(dead.sandbox.id()));
  CHECK(lost.status().phase() == pb::SandboxStatus::TERMINATED);
  CHECK(lost.status().exit().reason() == pb::Exit::BACKEND_LOST);
  auto destroyed = h.world->destroyed();
  CHECK(std::count(destroyed.begin(), destroyed.end(), orphan) == 1);
  CHECK(std::count(destroyed.begin(), destroyed.end(), dead.sandbox.status().backend_ref()) == 1);
  CHECK(std::count(destroyed.begin(), destroyed.end(), alive.sandbox.status().backend_ref()) == 0);
  CHECK(second.controller->Metrics().counters["readopted"] == 3);
  // Its backend's events reach it again...
  REQUIRE(second.backend->Exit(later_exit.sandbox.id(), 7, false));
  pb::WaitSandboxResponse ended = WaitSync(*second.controller, later_exit.sandbox.id(),
                                           pb::SandboxStatus::TERMINATED, absl::Seconds(5));
  CHECK(ended.sandbox().status().exit().exit_code() == 7);
  // ...its expiry is scheduled again...
  pb::WaitSandboxResponse expired = WaitSync(*second.controller, expiring.sandbox.id(),
                                             pb::SandboxStatus::TERMINATED, absl::Seconds(8));
  CHECK(expired.sandbox().status().exit().reason() == pb::Exit::TTL_EXPIRED);
  // ...and a delete destroys it.
  REQUIRE_OK(DeleteSync(*second.controller, alive.sandbox.id()));
  CHECK(h.world->live() == 0);
}

TEST_CASE("Controller: a create a restart interrupted goes on: its request id answers READY "
          "(replayed, same id and token, armed with its env), not a lost sandbox",
          "[controller][restart]") {
  Harness h;
  FakeConfig slow;
  slow.ready_after = absl::Seconds(30);  // never ready before the "kill"
  h.world->set_config(slow);
  h.Start();
  pb::CreateSandboxRequest req = Req("interrupted");
  (*req.mutable_spec()->mutable_env())["MODE"] = "eval";
  req.set_wait(pb::CreateSandboxRequest::RETURN_PENDING);
  REQUIRE_OK_AND_ASSIGN(CreateResult first, CreateSync(*h.controller, req));
  REQUIRE(Eventually([&] {
    auto sb = h.controller->GetSandbox(first.sandbox.id());
    return sb.ok() && !sb->status().backend_ref().empty();
  }));
  std::string old_ref = h.controller->GetSandbox(first.sandbox.id())->status().backend_ref();
  // kill -9: the journal stays as it is now (a graceful Shutdown would
  // record the start as ended), and what was launched is left behind.
  const std::string journal = h.options.state_dir + "/journal";
  std::string saved;
  {
    std::ifstream in(journal, std::ios::binary);
    saved.assign(std::istreambuf_iterator<char>(in), {});
  }
  h.controller->Shutdown(false);
  h.controller.reset();
  {
    std::ofstream out(journal, std::ios::binary | std::ios::trunc);
    out << saved;
  }

  h.world->set_config(FakeConfig{});
  Harness second(h);
  second.Start();
  req.set_wait(pb::CreateSandboxRequest::WAIT_READY);
  REQUIRE_OK_AND_ASSIGN(CreateResult replay, CreateSync(*second.controller, req));
  CHECK(replay.replayed);
  CHECK(replay.sandbox.id() == first.sandbox.id());
  CHECK(replay.access_token == first.access_token);
  CHECK(replay.sandbox.status().phase() == pb::SandboxStatus::READY);
  CHECK(replay.sandbox.status().backend_ref() != old_ref);
  CHECK(replay.sandbox.spec().env().empty());  // env never shows in records
  bool armed_with_env = false;
  for (const ActivateParams& p : h.agent->all()) {
    if (p.sandbox_id == first.sandbox.id() && p.env.count("MODE") &&
        p.env.at("MODE") == "eval" && p.token == first.access_token) {
      armed_with_env = true;
    }
  }
  CHECK(armed_with_env);
  auto destroyed = h.world->destroyed();
  CHECK(std::count(destroyed.begin(), destroyed.end(), old_ref) == 1);
  CHECK(second.controller->Metrics().counters["creates_resumed"] == 1);
  CHECK(second.controller->Metrics().counters["backend_lost"] == 0);
}

pb::WarmPool PoolOf(const std::string& name, int min_ready, int max_total) {
  pb::WarmPool pool;
  pool.set_name(name);
  *pool.mutable_template_() = Req("").spec();
  pool.set_min_ready(min_ready);
  pool.set_max_total(max_total);
  return pool;
}

TEST_CASE("Pools: a claim pops a ready member, arms it with the request's env and token, "
          "and returns WARM; members are never listed or reused",
          "[controller][pool]") {
  Harness h;
  h.Start();
  REQUIRE_OK(h.controller->CreateWarmPool(PoolOf("p", 2, 2)));
  REQUIRE(Eventually([&] { return h.controller->GetWarmPool("p")->status().ready() == 2; }));
  CHECK(CountSandboxes(*h.controller) == 0);  // members are not sandboxes yet
  CHECK(h.agent->all().empty());              // nor armed
  pb::CreateSandboxRequest req = Req("warm");
  req.mutable_spec()->set_warm_pool("p");
  (*req.mutable_spec()->mutable_env())["K"] = "v";
  (*req.mutable_labels())["team"] = "ml";
  req.mutable_spec()->mutable_ttl()->set_seconds(60);  // not in the key
  REQUIRE_OK_AND_ASSIGN(CreateResult warm, CreateSync(*h.controller, req));
  CHECK(warm.sandbox.status().launch() == pb::SandboxStatus::WARM);
  CHECK(warm.sandbox.status().phase() == pb::SandboxStatus::READY);
  CHECK(warm.sandbox.pool() == "p");
  CHECK(warm.sandbox.labels().at("agentix.dev/pool") == "p");
  CHECK(warm.sandbox.labels().at("team") == "ml");
  auto params = h.agent->all();
  REQUIRE(params.size() == 1);
  CHECK(params[0].env.at("K") == "v");
  CHECK(params[0].token == warm.access_token);
  CHECK(params[0].sandbox_id == warm.sandbox.id());
  // Without naming the pool, an exact key match is served from it too.
  REQUIRE_OK_AND_ASSIGN(CreateResult matched, CreateSync(*h.controller, Req("match")));
  CHECK(matched.sandbox.status().launch() == pb::SandboxStatus::WARM);
  CHECK(matched.sandbox.status().endpoint().target() !=
        warm.sandbox.status().endpoint().target());
  // The pool refills with new members; a deleted sandbox's member never returns.
  REQUIRE_OK(DeleteSync(*h.controller, warm.sandbox.id()));
  REQUIRE(Eventually([&] { return h.controller->GetWarmPool("p")->status().ready() == 2; }));
  auto status = h.controller->GetWarmPool("p")->status();
  CHECK(status.claimed() == 2);
  CHECK(status.total() == 2);
  CHECK(h.world->launches() == 4);
  auto m = h.controller->Metrics();
  CHECK(m.acquire_seconds.count == 2);
  CHECK(m.counters["pool_claims"] == 2);
  CHECK(m.pools["p"].ready() == 2);
  // DeleteWarmPool destroys the unclaimed members, not the claimed sandbox.
  REQUIRE_OK(h.controller->DeleteWarmPool("p", false));
  REQUIRE(Eventually([&] { return h.world->live() == 1; }));
  REQUIRE_OK_AND_ASSIGN(pb::Sandbox still, h.controller->GetSandbox(matched.sandbox.id()));
  CHECK(still.status().phase() == pb::SandboxStatus::READY);
}

TEST_CASE("Pools: a member is ready only once its prestarted worker has booted; claims never "
          "get one still booting",
          "[controller][pool]") {
  Harness h;
  {
    absl::MutexLock lock(&h.agent->mu);
    h.agent->workers_booting = true;
  }
  h.Start();
  REQUIRE_OK(h.controller->CreateWarmPool(PoolOf("p", 2, 2)));
  // Up and passing CheckReady, but booting: creating, not ready.
  absl::SleepFor(absl::Milliseconds(300));
  {
    absl::MutexLock lock(&h.agent->mu);
    CHECK(h.agent->status_calls >= 2);  // polled, not given up
  }
  auto status = h.controller->GetWarmPool("p")->status();
  CHECK(status.ready() == 0);
  CHECK(status.creating() == 2);
  pb::CreateSandboxRequest miss = Req("miss");
  miss.mutable_spec()->set_warm_pool("p");
  miss.set_on_pool_miss(pb::CreateSandboxRequest::FAIL);
  auto refused = CreateSync(*h.controller, miss);
  CHECK(refused.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(ReasonOf(refused.status()) == kReasonPoolMiss);
  {
    absl::MutexLock lock(&h.agent->mu);
    h.agent->workers_booting = false;
  }
  REQUIRE(Eventually([&] { return h.controller->GetWarmPool("p")->status().ready() == 2; }));
  pb::CreateSandboxRequest hit = Req("hit");
  hit.mutable_spec()->set_warm_pool("p");
  hit.set_on_pool_miss(pb::CreateSandboxRequest::FAIL);
  REQUIRE_OK_AND_ASSIGN(CreateResult warm, CreateSync(*h.controller, hit));
  CHECK(warm.sandbox.status().launch() == pb::SandboxStatus::WARM);
  absl::MutexLock lock(&h.agent->mu);
  CHECK(h.agent->activations == 1);
  CHECK(h.agent->activated_while_booting == 0);
}

TEST_CASE("Pools: refills wait until claims stop coming (pool_refill_delay), but not while a "
          "claim waits for a member",
          "[controller][pool]") {
  Harness h;
  h.options.pool_refill_delay = absl::Milliseconds(400);
  h.Start();
  REQUIRE_OK(h.controller->CreateWarmPool(PoolOf("p", 3, 3)));
  REQUIRE(Eventually([&] { return h.controller->GetWarmPool("p")->status().ready() == 3; }));
  CHECK(h.world->launches() == 3);
  pb::CreateSandboxRequest req = Req("a");
  req.mutable_spec()->set_warm_pool("p");
  const absl::Time claimed = absl::Now();
  REQUIRE_OK_AND_ASSIGN(CreateResult a, CreateSync(*h.controller, req));
  CHECK(a.sandbox.status().launch() == pb::SandboxStatus::WARM);
  absl::SleepFor(absl::Milliseconds(150));
  req.set_request_id("b");
  REQUIRE_OK_AND_ASSIGN(CreateResult b, CreateSync(*h.controller, req));
  CHECK(b.sandbox.status().launch() == pb::SandboxStatus::WARM);
  // Held: 400 ms after the last claim (b), not before.
  absl::SleepFor(absl::Milliseconds(300) - (absl::Now() - claimed - absl::Milliseconds(150)));
  CHECK(h.world->launches() == 3);
  REQUIRE(Eventually([&] { return h.world->launches() == 5; }, absl::Seconds(5)));
  CHECK(absl::Now() - claimed >= absl::Milliseconds(500));
  REQUIRE(Eventually([&] { return h.controller->GetWarmPool("p")->status().ready() == 3; }));

  // A claim that waits for a member starts the refill at once.
  h.options.pool_refill_delay = absl::Seconds(30);
  Harness slow(h);
  slow.options.state_dir = TempDir();
  slow.world = std::make_shared<FakeWorld>();
  slow.Start();
  REQUIRE_OK(slow.controller->CreateWarmPool(PoolOf("q", 1, 1)));
  REQUIRE(Eventually([&] { return slow.controller->GetWarmPool("q")->status().ready() == 1; }));
  pb::CreateSandboxRequest first = Req("first");
  first.mutable_spec()->set_warm_pool("q");
  REQUIRE_OK_AND_ASSIGN(CreateResult f, CreateSync(*slow.controller, first));
  CHECK(f.sandbox.status().launch() == pb::SandboxStatus::WARM);
  pb::CreateSandboxRequest waiting = Req("waiting");
  waiting.mutable_spec()->set_warm_pool("q");
  waiting.set_on_pool_miss(pb::CreateSandboxRequest::WAIT_FOR_MEMBER);
  const absl::Time start = absl::Now();
  REQUIRE_OK_AND_ASSIGN(CreateResult w, CreateSync(*slow.controller, waiting));
  CHECK(w.sandbox.status().launch() == pb::SandboxStatus::WARM);
  CHECK(absl::Now() - start < absl::Seconds(5));
}

TEST_CASE("Pools: misses start cold (counted), wait for a member, or fail", "[controller][pool]") {
  Harness h;
  FakeConfig config;
  config.ready_after = absl::Milliseconds(150);
  h.world->set_config(config);
  h.Start();
  REQUIRE_OK(h.controller->CreateWarmPool(PoolOf("p", 1, 1)));
  pb::CreateSandboxRequest cold = Req("cold");
  cold.mutable_spec()->set_warm_pool("p");
  REQUIRE_OK_AND_ASSIGN(CreateResult c, CreateSync(*h.controller, cold));
  CHECK(c.sandbox.status().launch() == pb::SandboxStatus::COLD);
  CHECK(h.controller->GetWarmPool("p")->status().cold_fallbacks() == 1);
  REQUIRE(Eventually([&] { return h.controller->GetWarmPool("p")->status().ready() == 1; }));
  // Claim the member, then wait for the next one.
  pb::CreateSandboxRequest first = Req("first");
  first.mutable_spec()->set_warm_pool("p");
  REQUIRE_OK_AND_ASSIGN(CreateResult f, CreateSync(*h.controller, first));
  CHECK(f.sandbox.status().launch() == pb::SandboxStatus::WARM);
  pb::CreateSandboxRequest waiting = Req("waiting");
  waiting.mutable_spec()->set_warm_pool("p");
  waiting.set_on_pool_miss(pb::CreateSandboxRequest::WAIT_FOR_MEMBER);
  REQUIRE_OK_AND_ASSIGN(CreateResult w, CreateSync(*h.controller, waiting));
  CHECK(w.sandbox.status().launch() == pb::SandboxStatus::WARM);
  CHECK(h.controller->GetWarmPool("p")->status().cold_fallbacks() == 1);
  // Lowering max_total trims unclaimed members at once.
  REQUIRE(Eventually([&] { return h.world->live_with_label("agentix.dev/pool", "p") == 3; }));
  REQUIRE_OK(h.controller->UpdateWarmPool(PoolOf("p", 0, 0)));
  REQUIRE(Eventually([&] { return h.world->live_with_label("agentix.dev/pool", "p") == 2; }));
  CHECK(h.controller->GetWarmPool("p")->status().total() == 0);
  // WAIT_FOR_MEMBER ends READY_TIMEOUT when none comes in time.
  pb::CreateSandboxRequest starved = Req("starved");
  starved.mutable_spec()->set_warm_pool("p");
  starved.set_on_pool_miss(pb::CreateSandboxRequest::WAIT_FOR_MEMBER);
  starved.mutable_ready_timeout()->set_nanos(200 * 1000000);
  auto s = CreateSync(*h.controller, starved);
  CHECK(s.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(ReasonOf(s.status()) == kReasonReadyTimeout);
}

TEST_CASE("Pools: a burst of 200 claims never takes a pool above max_total and it refills "
          "to min_ready",
          "[controller][pool]") {
  Harness h;
  FakeConfig config;
  config.launch_latency = absl::Milliseconds(2);
  h.world->set_config(config);
  h.Start();
  pb::WarmPool pool = PoolOf("burst", 20, 30);
  pool.set_max_creating(8);
  REQUIRE_OK(h.controller->CreateWarmPool(pool));
  REQUIRE(Eventually([&] { return h.controller->GetWarmPool("burst")->status().ready() == 20; }));
  std::atomic<bool> sampling{true};
  std::atomic<int> max_total{0}, max_creating{0}, samples{0};
  std::thread sampler([&] {
    while (sampling) {
      auto st = h.controller->GetWarmPool("burst")->status();
      max_total = std::max<int>(max_total, st.total());
      max_creating = std::max<int>(max_creating, st.creating());
      samples++;
      absl::SleepFor(absl::Microseconds(200));
    }
  });
  std::atomic<int> warm{0}, cold{0}, failed{0};
  std::vector<std::thread> threads;
  std::mutex ids_mu;
  std::set<std::string> ids;
  for (int t = 0; t < 20; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        pb::CreateSandboxRequest req = Req("b-" + std::to_string(t) + "-" + std::to_string(i));
        req.mutable_spec()->set_warm_pool("burst");
        auto r = CreateSync(*h.controller, req);
        if (!r.ok()) {
          failed++;
          continue;
        }
        (r->sandbox.status().launch() == pb::SandboxStatus::WARM ? warm : cold)++;
        std::lock_guard<std::mutex> lock(ids_mu);
        ids.insert(r->sandbox.status().endpoint().target());
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failed == 0);
  CHECK(warm + cold == 200);
  CHECK(warm >= 20);
  CHECK(ids.size() == 200);  // no member served twice
  REQUIRE(Eventually([&] { return h.controller->GetWarmPool("burst")->status().ready() == 20; }));
  sampling = false;
  sampler.join();
  CHECK(samples > 10);
  CHECK(max_total <= 30);
  CHECK(max_creating <= 8);
  auto st = h.controller->GetWarmPool("burst")->status();
  CHECK(st.claimed() == warm);
  CHECK(st.cold_fallbacks() == cold);
  CHECK(st.total() == 20);
  // Unclaimed members in the backend: exactly the 20 ready ones.
  CHECK(h.world->live() == 200 + 20);
  auto m = h.controller->Metrics();
  fprintf(stderr, "burst: %d warm (mean acquire %.2f ms), %d cold (mean create %.2f ms)\n",
          warm.load(), 1000 * m.acquire_seconds.sum_seconds / std::max<uint64_t>(1, m.acquire_seconds.count),
          cold.load(), 1000 * m.create_seconds.sum_seconds / std::max<uint64_t>(1, m.create_seconds.count));
}

TEST_CASE("Pools: consecutive failed starts mark the pool degraded, back off, keep the "
          "error, and recover",
          "[controller][pool]") {
  Harness h;
  FakeConfig config;
  config.fail_launches = 3;
  h.world->set_config(config);
  h.Start();
  pb::WarmPool pool = PoolOf("flaky", 1, 1);
  REQUIRE_OK(h.controller->CreateWarmPool(pool));
  REQUIRE(Eventually([&] { return h.controller->GetWarmPool("flaky")->status().degraded(); }));
  auto st = h.controller->GetWarmPool("flaky")->status();
  CHECK(st.failure_streak() == 3);
  CHECK(st.last_error().find("boom") != std::string::npos);
  CHECK(st.ready() == 0);
  absl::SleepFor(absl::Milliseconds(300));
  CHECK(h.world->launches() == 3);  // backing off, not hammering
  // After the back-off (1 s) the next start succeeds and clears the state.
  REQUIRE(Eventually([&] { return h.controller->GetWarmPool("flaky")->status().ready() == 1; },
                     absl::Seconds(5)));
  st = h.controller->GetWarmPool("flaky")->status();
  CHECK_FALSE(st.degraded());
  CHECK(st.failure_streak() == 0);
}

TEST_CASE("Pools: UpdateWarmPool RECREATE replaces unclaimed members; ON_REPLENISH rolls "
          "them; member_max_age recycles",
          "[controller][pool]") {
  Harness h;
  h.Start();
  REQUIRE_OK(h.controller->CreateWarmPool(PoolOf("p", 3, 3)));
  REQUIRE(Eventually([&] { return h.controller->GetWarmPool("p")->status().ready() == 3; }));
  // Only sizes changed: the members stay.
  REQUIRE_OK_AND_ASSIGN(pb::WarmPool same, h.controller->UpdateWarmPool(PoolOf("p", 3, 4)));
  CHECK(same.status().observed_generation() == 1);
  CHECK(h.world->launches() == 3);
  pb::WarmPool changed = PoolOf("p", 3, 3);
  changed.mutable_template_()->mutable_resources()->set_pids(64);
  REQUIRE_OK_AND_ASSIGN(pb::WarmPool updated, h.controller->UpdateWarmPool(changed));
  CHECK(updated.status().observed_generation() == 2);
  REQUIRE(Eventually([&] {
    return h.controller->GetWarmPool("p")->status().ready() == 3 && h.world->live() == 3;
  }));
  CHECK(h.world->launches() == 6);
  CHECK(h.world->live_with_label("agentix.dev/pool", "p") == 3);
  {
    absl::MutexLock lock(&h.world->mu);
    for (auto& [ref, s] : h.world->sandboxes) CHECK(s.spec.spec.resources().pids() == 64);
  }
  // A request for the old spec no longer matches; the new one does.
  REQUIRE_OK_AND_ASSIGN(CreateResult old_spec, CreateSync(*h.controller, Req("old")));
  CHECK(old_spec.sandbox.status().launch() == pb::SandboxStatus::COLD);
  pb::CreateSandboxRequest new_spec = Req("new");
  new_spec.mutable_spec()->mutable_resources()->set_pids(64);
  REQUIRE_OK_AND_ASSIGN(CreateResult n, CreateSync(*h.controller, new_spec));
  CHECK(n.sandbox.status().launch() == pb::SandboxStatus::WARM);

  // ON_REPLENISH: stale members are rolled one at a time, never above max_total.
  pb::WarmPool rolled = changed;
  rolled.mutable_template_()->mutable_resources()->set_pids(128);
  rolled.set_update_strategy(pb::WarmPool::ON_REPLENISH);
  REQUIRE(Eventually([&] { return h.controller->GetWarmPool("p")->status().ready() == 3; }));
  REQUIRE_OK(h.controller->UpdateWarmPool(rolled));
  REQUIRE(Eventually([&] {
    absl::MutexLock lock(&h.world->mu);
    int fresh = 0;
    for (auto& [ref, s] : h.world->sandboxes) {
      if (s.spec.spec.resources().pids() == 128) ++fresh;
    }
    return fresh == 3;
  }));
  REQUIRE(Eventually([&] { return h.world->live_with_label("agentix.dev/pool", "p") == 3 + 1; }));

  // member_max_age: members are replaced as they age.
  pb::WarmPool aging = PoolOf("aging", 1, 1);
  aging.mutable_template_()->set_image("aging");
  aging.mutable_member_max_age()->set_nanos(200 * 1000000);
  REQUIRE_OK(h.controller->CreateWarmPool(aging));
  int before = h.world->launches();
  REQUIRE(Eventually([&] { return h.world->launches() >= before + 3; }, absl::Seconds(5)));
  CHECK(h.world->live_with_label("agentix.dev/pool", "aging") <= 1);
  CHECK(h.controller->Metrics().counters["pool_recycled"] >= 2);
}

TEST_CASE("Controller: Shutdown refuses new creates and answers waiters", "[controller]") {
  Harness h;
  FakeConfig config;
  config.ready_after = absl::Seconds(30);
  h.world->set_config(config);
  h.Start();
  absl::Notification done;
  absl::StatusOr<CreateResult> result = absl::UnknownError("");
  h.controller->CreateSandbox(Req("s"), "", [&](absl::StatusOr<CreateResult> r) {
    result = r;
    done.Notify();
  });
  REQUIRE(Eventually([&] { return h.world->live() == 1; }));
  absl::Time start = absl::Now();
  h.controller->Shutdown(true);
  CHECK(absl::Now() - start < absl::Seconds(2));
  REQUIRE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  CHECK_FALSE(result.ok());
  CHECK(h.world->live() == 0);
  auto refused = CreateSync(*h.controller, Req("after"));
  CHECK(refused.status().code() == absl::StatusCode::kUnavailable);
  CHECK(ReasonOf(refused.status()) == kReasonShuttingDown);
}

TEST_CASE("Controller: the journal is compacted while running, so it stays bounded",
          "[controller][journal]") {
  Harness h;
  h.Start();
  REQUIRE_OK_AND_ASSIGN(CreateResult a, CreateSync(*h.controller, Req("busy")));
  auto size = [&] {
    FILE* f = fopen((h.options.state_dir + "/journal").c_str(), "rb");
    REQUIRE(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    return n;
  };
  long max_size = 0;
  for (int i = 0; i < 30000; ++i) {
    pb::ExtendSandboxRequest extend;
    extend.set_id(a.sandbox.id());
    extend.mutable_ttl()->set_seconds(100 + i);
    REQUIRE(h.controller->ExtendSandbox(extend).ok());
    if (i % 1000 == 0) max_size = std::max(max_size, size());
  }
  // One record is ~0.3 KB: without compaction this would be ~9 MB.
  CHECK(max_size < 4 * 1024 * 1024);
  // And what is left still replays.
  h.controller.reset();
  Harness second(h);
  second.Start();
  REQUIRE_OK_AND_ASSIGN(pb::Sandbox back, second.controller->GetSandbox(a.sandbox.id()));
  CHECK(back.status().exit().reason() == pb::Exit::BACKEND_LOST);
}

TEST_CASE("Controller: max_sandboxes refuses creates with QUOTA_EXCEEDED and a retry delay",
          "[controller][errors]") {
  Harness h;
  h.options.max_sandboxes = 2;
  h.Start();
  REQUIRE_OK_AND_ASSIGN(CreateResult a, CreateSync(*h.controller, Req("q1")));
  REQUIRE_OK(CreateSync(*h.controller, Req("q2")));
  auto refused = CreateSync(*h.controller, Req("q3"));
  CHECK(refused.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(ReasonOf(refused.status()) == kReasonQuota);
  CHECK(RetryAfterOf(refused.status()).has_value());
  CHECK(h.world->launches() == 2);
  REQUIRE_OK(DeleteSync(*h.controller, a.sandbox.id()));
  // The same request id succeeds once there is room: the refusal kept nothing.
  REQUIRE_OK_AND_ASSIGN(CreateResult later, CreateSync(*h.controller, Req("q3")));
  CHECK_FALSE(later.replayed);
}

TEST_CASE("Pools: a member that dies while waiting is dropped and replaced, never claimed",
          "[controller][pool]") {
  Harness h;
  h.Start();
  REQUIRE_OK(h.controller->CreateWarmPool(PoolOf("p", 1, 1)));
  REQUIRE(Eventually([&] { return h.controller->GetWarmPool("p")->status().ready() == 1; }));
  std::string member;
  {
    absl::MutexLock lock(&h.world->mu);
    REQUIRE(h.world->sandboxes.size() == 1);
    member = h.world->sandboxes.begin()->second.spec.sandbox_id;
  }
  REQUIRE(h.backend->Exit(member, 1, false));
  REQUIRE(Eventually([&] {
    return h.world->launches() == 2 && h.controller->GetWarmPool("p")->status().ready() == 1;
  }));
  REQUIRE_OK_AND_ASSIGN(CreateResult warm, CreateSync(*h.controller, Req("w")));
  CHECK(warm.sandbox.status().launch() == pb::SandboxStatus::WARM);
  CHECK(warm.sandbox.status().endpoint().target() != "fake://" + member);
}

TEST_CASE("Controller: deletes are not queued behind a burst of slow starts",
          "[controller][delete]") {
  Harness h;
  h.Start();
  REQUIRE_OK_AND_ASSIGN(CreateResult ready, CreateSync(*h.controller, Req("ready")));
  FakeConfig slow;
  slow.ready_after = absl::Seconds(2);
  h.world->set_config(slow);
  std::atomic<int> answered{0};
  for (int i = 0; i < 40; ++i) {  // more than there are start threads
    h.controller->CreateSandbox(Req("slow-" + std::to_string(i)), "",
                                [&](absl::StatusOr<CreateResult>) { answered++; });
  }
  REQUIRE(Eventually([&] { return h.world->live() >= 17; }));
  absl::Time start = absl::Now();
  REQUIRE_OK_AND_ASSIGN(pb::Sandbox deleted, DeleteSync(*h.controller, ready.sandbox.id()));
  CHECK(deleted.status().phase() == pb::SandboxStatus::TERMINATED);
  CHECK(absl::Now() - start < absl::Milliseconds(500));
  CHECK(answered == 0);
  h.controller->Shutdown(true);
  CHECK(answered == 40);
}

}  // namespace
}  // namespace agentix::providers
