// An owned child process started with posix_spawn (never a bare fork: the
// daemon is multi-threaded). The destructor kills and reaps it, so no code
// path leaks a zombie or an orphan.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace agentix::base {

// How a process ended.
struct ExitStatus {
  int exit_code = 0;  // valid when signal == 0
  int signal = 0;     // the terminating signal, or 0

  // The original's convention: the exit code, or minus the signal number.
  int returncode() const { return signal != 0 ? -signal : exit_code; }
  // "exit code 3" / "killed by signal 9 (SIGKILL)".
  std::string Describe() const;
};

struct SpawnOptions {
  std::string path;                    // executable, absolute or relative
  std::vector<std::string> argv;       // argv[0] included
  std::vector<std::string> env;        // "K=V" entries; the full environment
  // (parent fd, child fd) pairs dup2-ed into the child. Child fds must be
  // distinct and below RLIMIT_NOFILE; a parent fd may be any open fd (even
  // another pair's child fd). Every other fd above 2 is closed in the child,
  // O_CLOEXEC or not: what the parent holds or inherited (listening and
  // client sockets, epoll fds, log files) never reaches a child.
  std::vector<std::pair<int, int>> fd_map;
  // Reset SIGPIPE etc. to default and unblock all signals in the child.
  bool reset_signals = true;
};

class ChildProcess {
 public:
  // Starts the process. Errors: kInvalidArgument (empty path/argv, a bad
  // fd_map), kResourceExhausted (no fd left to stage fd_map),
  // kFailedPrecondition / kNotFound from posix_spawn (errno in the message).
  static absl::StatusOr<ChildProcess> Spawn(const SpawnOptions& options);
  // Like Spawn, but the fork happens on one process-lifetime launcher
  // thread. Linux delivers PR_SET_PDEATHSIG when the *thread* that forked
  // the child exits, so a child that asks for it (agentix-worker does) must
  // not be forked from a pool thread that may retire (gRPC's may).
  static absl::StatusOr<ChildProcess> SpawnFromLauncherThread(
      const SpawnOptions& options);

  // Takes ownership of `pid`, a child this process forked before it exec'd
  // its current image (sandbox/launch_main.cc starts the worker that way).
  // kInvalidArgument if `pid` is not a child of this process (waitpid would
  // say ECHILD). A child that has already exited is adopted all the same:
  // TryWait reports its status.
  static absl::StatusOr<ChildProcess> Adopt(pid_t pid);

  ChildProcess() = default;
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  // Sends SIGKILL if still running and reaps.
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !exit_.has_value(); }

  // Reaps without blocking; returns the exit status once the process ended.
  std::optional<ExitStatus> TryWait();
  // Waits up to `timeout` for exit. kDeadlineExceeded if still running.
  absl::StatusOr<ExitStatus> AwaitExit(absl::Duration timeout);
  // Sends `signal` (default SIGKILL) if the process is still running.
  void Kill(int signal = 9);
  // Gives up ownership without killing or reaping: returns the pid (whoever
  // adopts it, e.g. the image this process execs next, must reap it).
  pid_t Release() { exit_.reset(); return std::exchange(pid_, -1); }

 private:
  pid_t pid_ = -1;
  std::optional<ExitStatus> exit_;
};

}  // namespace agentix::base
