#include "sandbox/admin_service.h"

#include <catch2/catch.hpp>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "sandbox/recording_sink.h"

namespace agentix::sandbox {
namespace {

using runtime::v1::ActivateRequest;
using runtime::v1::HostEvent;
using runtime::v1::SandboxEvent;

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
  auto sink = std::make_shared<RecordingSink>();
  HostEvent start;
  start.mutable_start()->set_call_id(id);
  start.mutable_start()->set_callable("fake::env");
  start.mutable_start()->set_encoding(runtime::v1::ENCODING_PICKLE);
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

// Runs fake::pid on the manager: the pid of the worker that ran the call.
int64_t CallPid(SessionManager& manager) {
  static int next = 0;
  const std::string id = "pid-" + std::to_string(next++);
  auto sink = std::make_shared<RecordingSink>();
  HostEvent start;
  start.mutable_start()->set_call_id(id);
  start.mutable_start()->set_callable("fake::pid");
  start.mutable_start()->set_encoding(runtime::v1::ENCODING_PICKLE);
  manager.HandleHostEvent(sink, start);
  SandboxEvent e = sink->AwaitTerminal(id);
  REQUIRE(e.has_result());
  return std::stoll(e.result().value());
}

TEST_CASE("A prestarted worker gets Activate's env in place: same process",
          "[admin]") {
  SessionManager manager(FakeWorker());
  REQUIRE(manager.StartWorker().ok());  // as agentix-sandboxd --prestart-worker
  SandboxAdminService admin(TokenGate::Armable("admin"), &manager, nullptr,
                            true);
  const int64_t pid = manager.Info().worker_pid;
  REQUIRE(pid != 0);
  CHECK(admin.GetStatus().worker_running());  // before activation
  REQUIRE(admin.Activate(Request("run")).ok());
  CHECK(manager.Info().worker_pid == pid);
  CHECK(WorkerEnv(manager, "USER_VAR") == "hello");
  CHECK(WorkerEnv(manager, "AGENTIX_SANDBOX_ID") == "sbx-1");
  CHECK(WorkerEnv(manager, "SHARED") == "activate");  // replaces the daemon's
  CHECK(WorkerEnv(manager, "FROM_DAEMON") == "daemon");
  CHECK(WorkerEnv(manager, "AGENTIX_TOKEN") == "<unset>");
  CHECK(CallPid(manager) == pid);
  CHECK(manager.Info().workers_started == 1);  // no respawn
  // A worker started later (this one died) gets the full env at spawn.
  HostEvent exit;
  exit.mutable_start()->set_call_id("exit");
  exit.mutable_start()->set_callable("fake::exit");
  exit.mutable_start()->set_encoding(runtime::v1::ENCODING_PICKLE);
  exit.mutable_start()->set_arguments("0");
  auto sink = std::make_shared<RecordingSink>();
  manager.HandleHostEvent(sink, exit);
  CHECK(sink->AwaitTerminal("exit").has_error());
  CHECK(WorkerEnv(manager, "USER_VAR") == "hello");
  CHECK(WorkerEnv(manager, "AGENTIX_SANDBOX_ID") == "sbx-1");
  CHECK(WorkerEnv(manager, "SHARED") == "activate");
  CHECK(manager.Info().workers_started == 2);
}

TEST_CASE("A start-up-only env var replaces the prestarted worker",
          "[admin]") {
  for (const char* name : {"LD_PRELOAD", "PYTHONPATH", "LC_ALL",
                           "AGENTIX_LOG_LEVEL"}) {
    CAPTURE(name);
    SessionManager manager(FakeWorker());
    REQUIRE(manager.StartWorker().ok());
    SandboxAdminService admin(TokenGate::Armable("admin"), &manager, nullptr,
                              true);
    const int64_t pid = manager.Info().worker_pid;
    ActivateRequest request = Request("run");
    // An empty LD_PRELOAD keeps the loader quiet; it is the key that counts.
    (*request.mutable_env())[name] =
        std::string(name) == "AGENTIX_LOG_LEVEL" ? "debug" : "";
    REQUIRE(admin.Activate(request).ok());
    const int64_t fresh = manager.Info().worker_pid;
    CHECK(fresh != 0);
    CHECK(fresh != pid);
    CHECK(manager.Info().workers_started == 2);
    CHECK(CallPid(manager) == fresh);
    CHECK(WorkerEnv(manager, name) != "<unset>");
    CHECK(WorkerEnv(manager, "USER_VAR") == "hello");
    CHECK(WorkerEnv(manager, "SHARED") == "activate");
    CHECK(manager.Info().workers_started == 2);
  }
}

TEST_CASE("A worker that cannot apply the env, or does not answer, is replaced",
          "[admin]") {
  for (const char* mode : {"refuse", "ignore"}) {
    CAPTURE(mode);
    SessionOptions options = FakeWorker();
    options.worker.env.push_back(std::string("FAKE_WORKER_SET_ENV=") + mode);
    SessionManager manager(options);
    REQUIRE(manager.StartWorker().ok());
    SandboxAdminService admin(TokenGate::Armable("admin"), &manager, nullptr,
                              true, absl::Milliseconds(300));
    const int64_t pid = manager.Info().worker_pid;
    const absl::Time start = absl::Now();
    REQUIRE(admin.Activate(Request("run")).ok());
    CHECK(absl::Now() - start < absl::Seconds(5));
    // The first call, sent at once, waits for the replacement: it never
    // runs in the worker that has not applied the env.
    CHECK(WorkerEnv(manager, "USER_VAR") == "hello");
    CHECK(manager.Info().worker_pid != pid);
    CHECK(WorkerEnv(manager, "AGENTIX_SANDBOX_ID") == "sbx-1");
    CHECK(manager.Info().workers_started == 2);
  }
}

TEST_CASE("Activate does not wait for the worker's env_set; the first call "
          "does, and sees the env",
          "[admin]") {
  SessionOptions options = FakeWorker();
  options.worker.env.push_back("FAKE_WORKER_SET_ENV=slow");  // answers 400 ms late
  SessionManager manager(options);
  REQUIRE(manager.StartWorker().ok());
  for (int i = 0; i < 500 && manager.Info().worker_booting; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  REQUIRE_FALSE(manager.Info().worker_booting);
  SandboxAdminService admin(TokenGate::Armable("admin"), &manager, nullptr,
                            true, absl::Seconds(10));
  const int64_t pid = manager.Info().worker_pid;
  const absl::Time start = absl::Now();
  REQUIRE(admin.Activate(Request("run")).ok());
  CHECK(absl::Now() - start < absl::Milliseconds(300));
  // Sent before the answer: queued behind it, then run in the same worker.
  CHECK(WorkerEnv(manager, "USER_VAR") == "hello");
  CHECK(absl::Now() - start >= absl::Milliseconds(350));
  CHECK(manager.Info().worker_pid == pid);
  CHECK(manager.Info().workers_started == 1);
}

TEST_CASE("GetStatus says worker_booting until the prestarted worker is ready",
          "[admin]") {
  SessionOptions options = FakeWorker();
  options.worker.env.push_back("FAKE_WORKER_BOOT=hang");
  options.worker.ready_timeout = absl::Milliseconds(500);
  SessionManager manager(options);
  SandboxAdminService admin(TokenGate::Armable("admin"), &manager, nullptr,
                            true);
  CHECK_FALSE(admin.GetStatus().worker_booting());  // none runs
  REQUIRE(manager.StartWorker().ok());
  CHECK(admin.GetStatus().worker_running());
  CHECK(admin.GetStatus().worker_booting());
  // Killed at its ready timeout: nothing boots any more.
  for (int i = 0; i < 300 && admin.GetStatus().worker_booting(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  CHECK_FALSE(admin.GetStatus().worker_booting());

  SessionManager healthy(FakeWorker());
  SandboxAdminService healthy_admin(TokenGate::Armable("admin"), &healthy,
                                    nullptr, true);
  REQUIRE(healthy.StartWorker().ok());
  for (int i = 0; i < 500 && healthy_admin.GetStatus().worker_booting(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  CHECK_FALSE(healthy_admin.GetStatus().worker_booting());
  CHECK(healthy_admin.GetStatus().worker_running());
}

TEST_CASE("A prestarted worker that failed to boot: Activate succeeds, the "
          "call reports the boot error",
          "[admin]") {
  SessionOptions options = FakeWorker();
  options.worker.env.push_back("FAKE_WORKER_BOOT=fail");
  SessionManager manager(options);
  REQUIRE(manager.StartWorker().ok());
  // Activate while it boots or after it failed: either way OK.
  SandboxAdminService admin(TokenGate::Armable("admin"), &manager, nullptr,
                            true);
  REQUIRE(admin.Activate(Request("run")).ok());
  HostEvent start;
  start.mutable_start()->set_call_id("first");
  start.mutable_start()->set_callable("fake::pid");
  start.mutable_start()->set_encoding(runtime::v1::ENCODING_PICKLE);
  auto sink = std::make_shared<RecordingSink>();
  manager.HandleHostEvent(sink, start);
  SandboxEvent e = sink->AwaitTerminal("first");
  REQUIRE(e.has_error());
  CHECK(e.error().error().type() == "WorkerBootError");
  CHECK_THAT(e.error().error().message(), Catch::Contains("broken_venv"));
}

TEST_CASE("ApplyWorkerEnv is refused while a call runs", "[admin]") {
  SessionManager manager(FakeWorker());
  HostEvent hang;
  hang.mutable_start()->set_call_id("hang");
  hang.mutable_start()->set_callable("fake::hang");
  hang.mutable_start()->set_encoding(runtime::v1::ENCODING_PICKLE);
  auto sink = std::make_shared<RecordingSink>();
  manager.HandleHostEvent(sink, hang);
  const absl::Status status =
      manager.ApplyWorkerEnv({"LATE=1"}, absl::Seconds(1));
  CHECK(status.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(WorkerEnv(manager, "LATE") == "<unset>");
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
  auto sink = std::make_shared<RecordingSink>();
  HostEvent start;
  start.mutable_start()->set_call_id("slow");
  start.mutable_start()->set_callable("fake::sleep");
  start.mutable_start()->set_encoding(runtime::v1::ENCODING_PICKLE);
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
