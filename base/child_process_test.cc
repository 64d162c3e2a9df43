#include "base/child_process.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <sys/resource.h>
#include <unistd.h>

#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/cpu_affinity.h"
#include "base/unique_fd.h"

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

// A child this process started without a ChildProcess (as the launcher's
// fork is, before the daemon's exec).
pid_t RawSpawn(const char* script) {
  pid_t pid = -1;
  char* argv[] = {const_cast<char*>("sh"), const_cast<char*>("-c"),
                  const_cast<char*>(script), nullptr};
  REQUIRE(::posix_spawn(&pid, "/bin/sh", nullptr, nullptr, argv, environ) == 0);
  return pid;
}

TEST_CASE("ChildProcess::Adopt owns a running child: its exit, its kill",
          "[base]") {
  const pid_t pid = RawSpawn("exec sleep 30");
  auto child = ChildProcess::Adopt(pid);
  REQUIRE(child.ok());
  REQUIRE(child->pid() == pid);
  REQUIRE(child->running());
  REQUIRE_FALSE(child->TryWait().has_value());
  child->Kill(SIGKILL);
  auto exit = child->AwaitExit(absl::Seconds(10));
  REQUIRE(exit.ok());
  REQUIRE(exit->returncode() == -9);
}

TEST_CASE("ChildProcess::Adopt takes a child that already exited", "[base]") {
  const pid_t pid = RawSpawn("exit 7");
  // Exited (a zombie) but not reaped: WNOWAIT leaves it for the adopter.
  siginfo_t info{};
  REQUIRE(::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT) == 0);
  auto child = ChildProcess::Adopt(pid);
  REQUIRE(child.ok());
  auto exit = child->AwaitExit(absl::Seconds(10));
  REQUIRE(exit.ok());
  REQUIRE(exit->Describe() == "exit code 7");
}

TEST_CASE("ChildProcess::Adopt refuses a pid that is not its child", "[base]") {
  for (pid_t pid : {::getppid(), ::getpid(), pid_t{0}, pid_t{-5}}) {
    auto child = ChildProcess::Adopt(pid);
    REQUIRE(child.status().code() == absl::StatusCode::kInvalidArgument);
  }
  auto parent = ChildProcess::Adopt(::getppid());
  REQUIRE_THAT(std::string(parent.status().message()),
               Catch::Contains("is not a child of this process"));
  // A child already reaped is no longer ours either.
  const pid_t pid = RawSpawn("exit 0");
  int wstatus = 0;
  REQUIRE(::waitpid(pid, &wstatus, 0) == pid);
  REQUIRE(ChildProcess::Adopt(pid).status().code() ==
          absl::StatusCode::kInvalidArgument);
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

// Runs `script` with its stdout on a pipe and returns what it printed.
std::string Output(SpawnOptions o) {
  int out[2];
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  UniqueFd read_end(out[0]);
  UniqueFd write_end(out[1]);
  o.fd_map.push_back({write_end.get(), 1});
  auto child = ChildProcess::Spawn(o);
  REQUIRE(child.ok());
  write_end.Reset();
  std::string text;
  char buffer[512];
  ssize_t n;
  while ((n = ::read(read_end.get(), buffer, sizeof(buffer))) > 0) {
    text.append(buffer, static_cast<size_t>(n));
  }
  auto exit = child->AwaitExit(absl::Seconds(10));
  REQUIRE(exit.ok());
  REQUIRE(exit->exit_code == 0);
  return text;
}

// Lists the fds the shell itself has open, one a line.
constexpr char kListFds[] = "/bin/ls /proc/$$/fd";

TEST_CASE("A child gets only stdio and its mapped fds, CLOEXEC or not",
          "[base]") {
  // A stray fd the parent forgot to mark CLOEXEC (or inherited), and one
  // that it did mark: neither reaches the child.
  UniqueFd stray(::open("/dev/null", O_RDONLY));
  UniqueFd marked(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  REQUIRE(stray.valid());
  REQUIRE(marked.valid());
  UniqueFd wanted(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  SpawnOptions o = Shell(kListFds);
  o.fd_map.push_back({wanted.get(), 7});
  CHECK(Output(o) == "0\n1\n2\n7\n");
}

TEST_CASE("fd_map sources may be each other's targets", "[base]") {
  // Swapping two fds clobbers one of them with naive dup2s.
  int p1[2], p2[2];
  REQUIRE(::pipe2(p1, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(p2, O_CLOEXEC) == 0);
  UniqueFd r1(p1[0]), w1(p1[1]), r2(p2[0]), w2(p2[1]);
  REQUIRE(::write(w1.get(), "one", 3) == 3);
  REQUIRE(::write(w2.get(), "two", 3) == 3);
  w1.Reset();
  w2.Reset();
  // In the child, r2's number holds pipe 1 and r1's holds pipe 2.
  SpawnOptions o = Shell(absl::StrCat("head -c3 <&", r2.get(), "; head -c3 <&",
                                      r1.get()));
  o.fd_map = {{r1.get(), r2.get()}, {r2.get(), r1.get()}};
  CHECK(Output(o) == "onetwo");
}

TEST_CASE("A child fd beyond RLIMIT_NOFILE is a clear error", "[base]") {
  struct rlimit saved {};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
  UniqueFd fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  SpawnOptions o = Shell("true");
  o.fd_map.push_back({fd.get(), 200});
  struct rlimit low = saved;
  low.rlim_cur = 64;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  auto child = ChildProcess::Spawn(o);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &saved) == 0);
  REQUIRE(child.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(child.status().message().find("RLIMIT_NOFILE 64") != std::string::npos);
}

TEST_CASE("A child spawned by a pinned thread may use every CPU the process started with",
          "[base]") {
  REQUIRE(CPU_COUNT(&StartCpus()) >= 2);  // two CPUs tell pinned from free
  const std::string everywhere = AllowedCpus(0);
  std::string direct, launched, thread_after;
  // A fresh thread, pinned, spawns both ways; the launcher thread may be
  // created by it (its first use in this process).
  std::thread([&] {
    REQUIRE(SetThreadCpus(0, CpuSetOf(0)).ok());
    auto a = ChildProcess::Spawn(Shell("sleep 30"));
    auto b = ChildProcess::SpawnFromLauncherThread(Shell("sleep 30"));
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    direct = AllowedCpus(a->pid());
    launched = AllowedCpus(b->pid());
    thread_after = AllowedCpus(0);
  }).join();
  CHECK(direct == everywhere);
  CHECK(launched == everywhere);
  CHECK(thread_after == "0");  // the spawning thread keeps its own mask
}

}  // namespace
}  // namespace agentix::base
