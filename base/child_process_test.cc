#include "base/child_process.h"

#include <signal.h>

#include <thread>

#include <catch2/catch.hpp>

#include "absl/time/clock.h"

namespace agentix::base {
namespace {

SpawnOptions Shell(const std::string& script) {
  SpawnOptions o;
  o.path = "/bin/sh";
  o.argv = {"sh", "-c", script};
  return o;
}

TEST_CASE("ChildProcess reports the exit code", "[base]") {
  auto child = ChildProcess::Spawn(Shell("exit 3"));
  REQUIRE(child.ok());
  auto exit = child->AwaitExit(absl::Seconds(10));
  REQUIRE(exit.ok());
  REQUIRE(exit->exit_code == 3);
  REQUIRE(exit->returncode() == 3);
  REQUIRE(exit->Describe() == "exit code 3");
}

TEST_CASE("ChildProcess reports a killing signal", "[base]") {
  auto child = ChildProcess::Spawn(Shell("sleep 30"));
  REQUIRE(child.ok());
  REQUIRE_FALSE(child->TryWait().has_value());
  child->Kill(SIGKILL);
  auto exit = child->AwaitExit(absl::Seconds(10));
  REQUIRE(exit.ok());
  REQUIRE(exit->returncode() == -9);
  REQUIRE(exit->Describe() == "killed by signal 9 (SIGKILL)");
}

TEST_CASE("ChildProcess times out waiting and kills on destruction",
          "[base]") {
  pid_t pid;
  {
    auto child = ChildProcess::Spawn(Shell("sleep 30"));
    REQUIRE(child.ok());
    pid = child->pid();
    auto exit = child->AwaitExit(absl::Milliseconds(50));
    REQUIRE(exit.status().code() == absl::StatusCode::kDeadlineExceeded);
  }
  REQUIRE(::kill(pid, 0) == -1);  // reaped: no such process
}

TEST_CASE("ChildProcess::Spawn fails clearly for a missing binary",
          "[base]") {
  SpawnOptions o;
  o.path = "/nonexistent/agentix-worker";
  o.argv = {"x"};
  auto child = ChildProcess::Spawn(o);
  REQUIRE(child.status().code() == absl::StatusCode::kNotFound);
  REQUIRE(child.status().message().find("/nonexistent/agentix-worker") !=
          std::string::npos);
}

TEST_CASE("A child spawned from the launcher thread survives its caller "
          "thread", "[base]") {
  // The child asks to be killed when its parent thread dies; it must still
  // be running after the thread that requested the spawn has exited.
  absl::StatusOr<ChildProcess> child =
      absl::InternalError("not started");
  std::thread([&] {
    child = ChildProcess::SpawnFromLauncherThread(Shell(
        "exec /usr/bin/setpriv --pdeathsig KILL /bin/sleep 30"));
    // Outlive the child's prctl, so that a plain Spawn from this thread
    // would get the child killed when the thread exits.
    absl::SleepFor(absl::Milliseconds(300));
  }).join();
  REQUIRE(child.ok());
  absl::SleepFor(absl::Milliseconds(200));
  REQUIRE_FALSE(child->TryWait().has_value());
}

}  // namespace
}  // namespace agentix::base
