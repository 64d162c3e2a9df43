#include "sandbox/admin_service.h"

#include <catch2/catch.hpp>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace agentix::sandbox {
namespace {

using runtime::v1::ActivateRequest;
using runtime::v1::HostEvent;
using runtime::v1::SandboxEvent;

// Keeps every delivered event; waits for one call's terminal event.
class Sink : public CallSink {
 public:
  bool Deliver(std::vector<SandboxEventPtr> events) override {
    absl::MutexLock lock(&mu_);
    for (auto& e : events) events_.push_back(std::move(e));
    return true;
  }
  SandboxEvent AwaitTerminal(const std::string& call_id) {
    absl::MutexLock lock(&mu_);
    const SandboxEvent* found = nullptr;
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const auto& e : events_) {
        if ((e->has_result() && e->result().call_id() == call_id) ||
            (e->has_error() && e->error().call_id() == call_id)) {
          found = e.get();
          return true;
        }
      }
      return false;
    };
    mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(10));
    REQUIRE(found != nullptr);
    return *found;
  }

 private:
  absl::Mutex mu_;
  std::vector<SandboxEventPtr> events_ ABSL_GUARDED_BY(mu_);
};

SessionOptions FakeWorker() {
  SessionOptions options;
  options.worker.worker_path = "testing/fake_worker";
  options.worker.env = {"FROM_DAEMON=daemon", "SHARED=daemon"};
  options.worker.ready_timeout = absl::Seconds(5);
  return options;
}

// Runs fake::env for `name` on the manager and returns what the worker saw.
std::string WorkerEnv(SessionManager& manager, const std::string& name) {
  static int next = 0;
  const std::string id = "env-" + std::to_string(next++);
  auto sink = std::make_shared<Sink>();
  HostEvent start;
  start.mutable_start()->set_call_id(id);
  start.mutable_start()->set_callable("fake::env");
  start.mutable_start()->set_arguments(name);
  manager.HandleHostEvent(sink, start);
  SandboxEvent e = sink->AwaitTerminal(id);
  REQUIRE(e.has_result());
  return e.result().value();
}

ActivateRequest Request(const std::string& token) {
  ActivateRequest request;
  request.set_token(token);
  request.set_sandbox_id("sbx-1");
  (*request.mutable_env())["USER_VAR"] = "hello";
  (*request.mutable_env())["SHARED"] = "activate";
  (*request.mutable_labels())["team"] = "a";
  return request;
}

TEST_CASE("Activate arms the gate and gives the worker its environment",
          "[admin]") {
  SessionManager manager(FakeWorker());
  StreamActivity activity;
  auto gate = TokenGate::Armable("admin");
  SandboxAdminService admin(gate, &manager, &activity, false);
  CHECK_FALSE(admin.GetStatus().activated());
  REQUIRE(admin.Activate(Request("run")).ok());
  CHECK(gate->armed());
  CHECK(gate->IsRuntimeToken("run"));
  CHECK(admin.GetStatus().activated());
  CHECK_FALSE(admin.GetStatus().worker_running());  // lazily, on a call
  CHECK(WorkerEnv(manager, "USER_VAR") == "hello");
  CHECK(WorkerEnv(manager, "AGENTIX_SANDBOX_ID") == "sbx-1");
  CHECK(WorkerEnv(manager, "SHARED") == "activate");  // replaces the daemon's
  CHECK(WorkerEnv(manager, "FROM_DAEMON") == "daemon");
  CHECK(WorkerEnv(manager, "AGENTIX_TOKEN") == "<unset>");
  CHECK(admin.GetStatus().worker_running());
  // Same token: OK, nothing changes; another: refused.
  CHECK(admin.Activate(Request("run")).ok());
  const absl::Status other = admin.Activate(Request("other"));
  CHECK(other.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(gate->IsRuntimeToken("run"));
  CHECK_FALSE(gate->IsRuntimeToken("other"));
}

TEST_CASE("With start_worker the worker starts at activation, with the env",
          "[admin]") {
  SessionManager manager(FakeWorker());
  SandboxAdminService admin(TokenGate::Armable("admin"), &manager, nullptr,
                            true);
  CHECK_FALSE(admin.GetStatus().worker_running());
  REQUIRE(admin.Activate(Request("run")).ok());
  CHECK(admin.GetStatus().worker_running());
  CHECK(manager.Info().workers_started == 1);
  CHECK(WorkerEnv(manager, "USER_VAR") == "hello");
  CHECK(manager.Info().workers_started == 1);  // the same worker
}

TEST_CASE("A refused Activate changes nothing", "[admin]") {
  SessionManager manager(FakeWorker());
  auto gate = TokenGate::Armable("admin");
  SandboxAdminService admin(gate, &manager, nullptr, false);
  std::vector<ActivateRequest> bad;
  bad.push_back(Request(""));
  bad.push_back(Request("  "));
  bad.push_back(Request("admin"));  // the admin token is no runtime token
  bad.push_back(Request("with space"));
  for (const char* name : {"", "1X", "A=B", "A B", "AGENTIX_TOKEN",
                           "AGENTIX_SANDBOX_ID"}) {
    ActivateRequest r = Request("run");
    (*r.mutable_env())[name] = "v";
    bad.push_back(r);
  }
  ActivateRequest nul = Request("run");
  (*nul.mutable_env())["V"] = std::string("a\0b", 3);
  bad.push_back(nul);
  ActivateRequest control_id = Request("run");
  control_id.set_sandbox_id("a\nb");
  bad.push_back(control_id);
  ActivateRequest huge = Request("run");
  (*huge.mutable_env())["BIG"] = std::string(kMaxActivateEnvBytes, 'x');
  bad.push_back(huge);
  for (const auto& request : bad) {
    CHECK(admin.Activate(request).code() == absl::StatusCode::kInvalidArgument);
  }
  CHECK_FALSE(gate->armed());
  CHECK(WorkerEnv(manager, "USER_VAR") == "<unset>");
  // A daemon without --admin-token-file cannot be activated.
  SessionManager other(FakeWorker());
  SandboxAdminService fixed(TokenGate::Fixed("t"), &other, nullptr, false);
  CHECK(fixed.Activate(Request("run")).code() ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("GetStatus: idle grows while nothing runs, 0 while busy",
          "[admin]") {
  SessionManager manager(FakeWorker());
  StreamActivity activity;
  SandboxAdminService admin(TokenGate::Armable("admin"), &manager, &activity,
                            false);
  absl::SleepFor(absl::Milliseconds(60));
  const int64_t first = admin.GetStatus().idle_ms();
  CHECK(first >= 50);
  activity.Opened();
  CHECK(admin.GetStatus().idle_ms() == 0);
  CHECK(admin.GetStatus().open_streams() == 1);
  activity.Closed();
  CHECK(admin.GetStatus().idle_ms() < first);  // restarted at the close
  auto sink = std::make_shared<Sink>();
  HostEvent start;
  start.mutable_start()->set_call_id("slow");
  start.mutable_start()->set_callable("fake::sleep");
  start.mutable_start()->set_arguments("300");
  manager.HandleHostEvent(sink, start);
  absl::SleepFor(absl::Milliseconds(100));
  const auto busy = admin.GetStatus();
  CHECK(busy.calls_in_flight() == 1);
  CHECK(busy.idle_ms() == 0);
  sink->AwaitTerminal("slow");
  absl::SleepFor(absl::Milliseconds(60));
  const auto after = admin.GetStatus();
  CHECK(after.calls_in_flight() == 0);
  CHECK(after.idle_ms() >= 50);
  CHECK(after.idle_ms() < 1000);
}

}  // namespace
}  // namespace agentix::sandbox
