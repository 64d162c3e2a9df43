// SessionManager::AdoptWorker with a real (fake) worker process started the
// way agentix-launch starts it: this test process plays the launcher (it
// spawns the worker and keeps the daemon's ends of its fds) and then the
// daemon that adopts it.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/child_process.h"
#include "base/unique_fd.h"
#include "sandbox/adopted_worker.h"
#include "sandbox/fake_worker_calls.h"
#include "sandbox/recording_sink.h"
#include "sandbox/session_manager.h"
#include "sandbox/worker_process.h"
#include "worker/ipc/frame.h"
#include "worker/ipc/payload_area.h"

namespace agentix::sandbox {
namespace {

using runtime::v1::HostEvent;
using runtime::v1::SandboxEvent;

HostEvent Start(const std::string& id, const std::string& callable) {
  HostEvent e;
  e.mutable_start()->set_call_id(id);
  e.mutable_start()->set_callable(callable);
  e.mutable_start()->set_encoding(runtime::v1::ENCODING_PICKLE);
  return e;
}

// What agentix-launch does before its exec: the worker spawned with
// `options` (its command as BuildWorkerCommand makes it, or `argv` instead),
// the daemon's ends of its fds kept.
AdoptedWorker Launch(const WorkerOptions& options,
                     std::vector<std::string> argv = {}) {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  base::UniqueFd worker_end(fds[1]);
  int err[2];
  REQUIRE(::pipe2(err, O_CLOEXEC) == 0);
  base::UniqueFd err_write(err[1]);
  auto area = ipc::PayloadArea::Create(options.payload_ring_bytes);
  REQUIRE(area.ok());
  AdoptedWorker adopted;
  adopted.worker_id = NewWorkerId();
  WorkerCommand command = BuildWorkerCommand(options, adopted.worker_id, true);
  base::SpawnOptions spawn;
  spawn.path = options.worker_path;
  spawn.argv = argv.empty() ? command.argv : argv;
  spawn.env = command.env;
  spawn.fd_map = {{worker_end.get(), ipc::kWorkerChannelFd},
                  {err_write.get(), 2},
                  {(*area)->fd(), ipc::kWorkerPayloadFd}};
  auto child = base::ChildProcess::Spawn(spawn);
  REQUIRE(child.ok());
  adopted.pid = child->Release();
  adopted.channel_fd = fds[0];
  adopted.stderr_fd = err[0];
  adopted.payload_fd = ::dup((*area)->fd());
  return adopted;
}

// The soft "Max open files" limit /proc shows for `pid`.
std::string OpenFilesLimit(pid_t pid) {
  std::ifstream limits("/proc/" + std::to_string(pid) + "/limits");
  std::string line;
  while (std::getline(limits, line)) {
    if (line.rfind("Max open files", 0) == 0) {
      std::istringstream fields(line.substr(14));
      std::string soft;
      fields >> soft;
      return soft;
    }
  }
  return "";
}

TEST_CASE("An adopted worker serves calls; after its crash the next one is spawned",
          "[sandbox][adopt]") {
  SessionManager manager(FakeWorkerOptions());
  const AdoptedWorker adopted = Launch(manager.options().worker);
  const absl::Status adopt = manager.AdoptWorker(adopted);
  INFO(adopt.ToString());
  REQUIRE(adopt.ok());
  REQUIRE(manager.Info().workers_started == 1);
  // Adopted: no second worker for the prestart.
  REQUIRE(manager.StartWorker().ok());
  REQUIRE(manager.Info().workers_started == 1);

  auto sink = std::make_shared<RecordingSink>();
  manager.HandleHostEvent(sink, Start("p1", "fake::pid"));
  SandboxEvent p1 = sink->AwaitTerminal("p1");
  REQUIRE(p1.has_result());
  REQUIRE(p1.result().value() == std::to_string(adopted.pid));

  manager.HandleHostEvent(sink, Start("k", "fake::kill"));
  SandboxEvent k = sink->AwaitTerminal("k");
  REQUIRE(k.error().error().type() == "WorkerDied");
  REQUIRE(k.error().error().returncode() == -9);
  // Reaped by its adopter: no zombie left.
  REQUIRE(::kill(adopted.pid, 0) == -1);

  manager.HandleHostEvent(sink, Start("p2", "fake::pid"));
  SandboxEvent p2 = sink->AwaitTerminal("p2");
  REQUIRE(p2.has_result());
  REQUIRE(p2.result().value() != std::to_string(adopted.pid));
  REQUIRE(manager.Info().workers_started == 2);
}

TEST_CASE("An adopted worker gets the daemon's RLIMIT_NOFILE", "[sandbox][adopt]") {
  struct rlimit limit {};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &limit) == 0);
  REQUIRE(limit.rlim_cur > 200);
  SessionManager manager(FakeWorkerOptions());
  // The launcher's limit is lower than the daemon's (which raises its own).
  struct rlimit lower = {limit.rlim_cur - 100, limit.rlim_max};
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &lower) == 0);
  const AdoptedWorker adopted = Launch(manager.options().worker);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &limit) == 0);
  REQUIRE(OpenFilesLimit(adopted.pid) == std::to_string(lower.rlim_cur));
  REQUIRE(manager.AdoptWorker(adopted).ok());
  REQUIRE(OpenFilesLimit(adopted.pid) == std::to_string(limit.rlim_cur));
}

TEST_CASE("Bad adoptions are clear errors and leave no worker behind",
          "[sandbox][adopt]") {
  SessionManager manager(FakeWorkerOptions({"PLAIN=1"}));

  SECTION("the pid is not a child") {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
    ::close(fds[1]);
    int err[2];
    REQUIRE(::pipe(err) == 0);
    ::close(err[1]);
    const absl::Status s =
        manager.AdoptWorker({::getppid(), "x", fds[0], err[0], -1});
    REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE_THAT(std::string(s.message()), Catch::Contains("is not a child"));
    // Not the worker's fds then: left alone.
    REQUIRE(::fcntl(fds[0], F_GETFD) != -1);
    REQUIRE(::fcntl(err[0], F_GETFD) != -1);
    ::close(fds[0]);
    ::close(err[0]);
  }
  SECTION("the channel is not a socket") {
    AdoptedWorker adopted = Launch(manager.options().worker);
    int p[2];
    REQUIRE(::pipe(p) == 0);
    ::close(p[1]);
    ::close(adopted.channel_fd);
    adopted.channel_fd = p[0];
    const absl::Status s = manager.AdoptWorker(adopted);
    REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE_THAT(std::string(s.message()), Catch::Contains("is not a socket"));
    REQUIRE(::kill(adopted.pid, 0) == -1);  // killed and reaped
  }
  SECTION("its command line is not the daemon's") {
    WorkerOptions options = manager.options().worker;
    const AdoptedWorker adopted = Launch(options, {options.worker_path, "--surprise"});
    const absl::Status s = manager.AdoptWorker(adopted);
    REQUIRE(s.code() == absl::StatusCode::kFailedPrecondition);
    REQUIRE_THAT(std::string(s.message()),
                 Catch::Contains("command line is not the one this daemon would "
                                 "spawn: entry 1 is '--surprise'"));
    REQUIRE(::kill(adopted.pid, 0) == -1);
  }
  SECTION("its environment is not the daemon's") {
    WorkerOptions options = manager.options().worker;
    options.env = {"PLAIN=2"};
    const AdoptedWorker adopted = Launch(options);
    const absl::Status s = manager.AdoptWorker(adopted);
    REQUIRE(s.code() == absl::StatusCode::kFailedPrecondition);
    REQUIRE_THAT(std::string(s.message()),
                 Catch::Contains("environment is not the one this daemon would "
                                 "spawn: entry 0 is 'PLAIN=2', expected 'PLAIN=1'"));
    REQUIRE(::kill(adopted.pid, 0) == -1);
  }
  SECTION("its payload rings are not the daemon's size") {
    WorkerOptions options = manager.options().worker;
    options.payload_ring_bytes = 64 * 1024;
    const AdoptedWorker adopted = Launch(options);
    const absl::Status s = manager.AdoptWorker(adopted);
    REQUIRE(s.code() == absl::StatusCode::kFailedPrecondition);
    REQUIRE_THAT(std::string(s.message()),
                 Catch::Contains("payload rings hold 65536 bytes"));
    REQUIRE(::kill(adopted.pid, 0) == -1);
  }
  SECTION("the worker died before the daemon was up") {
    WorkerOptions options = manager.options().worker;
    options.env.push_back("FAKE_WORKER_BOOT=exit");  // exits with code 4 at once
    const AdoptedWorker adopted = Launch(options);
    siginfo_t info{};
    REQUIRE(::waitid(P_PID, static_cast<id_t>(adopted.pid), &info,
                     WEXITED | WNOWAIT) == 0);
    const absl::Status s = manager.AdoptWorker(adopted);
    REQUIRE(s.code() == absl::StatusCode::kFailedPrecondition);
    REQUIRE_THAT(std::string(s.message()),
                 Catch::Contains("exited before the daemon was up: exit code 4"));
    REQUIRE(::kill(adopted.pid, 0) == -1);
  }
  REQUIRE(manager.Info().workers_started == 0);
  // The manager is unchanged: a call still gets a spawned worker.
  auto sink = std::make_shared<RecordingSink>();
  manager.HandleHostEvent(sink, Start("p", "fake::pid"));
  REQUIRE(sink->AwaitTerminal("p").has_result());
  REQUIRE(manager.Info().workers_started == 1);
}

}  // namespace
}  // namespace agentix::sandbox
