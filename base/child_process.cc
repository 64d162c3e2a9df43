#include "base/child_process.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <pthread.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/cpu_affinity.h"
#include "base/unique_fd.h"

namespace agentix::base {

std::string ExitStatus::Describe() const {
  if (signal != 0) {
    const char* name = sigabbrev_np(signal);
    return absl::StrCat("killed by signal ", signal,
                        name ? absl::StrCat(" (SIG", name, ")") : "");
  }
  return absl::StrCat("exit code ", exit_code);
}

namespace {

ExitStatus FromWaitStatus(int wstatus) {
  ExitStatus status;
  if (WIFSIGNALED(wstatus)) {
    status.signal = WTERMSIG(wstatus);
  } else if (WIFEXITED(wstatus)) {
    status.exit_code = WEXITSTATUS(wstatus);
  }
  return status;
}

}  // namespace

absl::StatusOr<ChildProcess> ChildProcess::Spawn(const SpawnOptions& options) {
  if (options.path.empty() || options.argv.empty()) {
    return absl::InvalidArgumentError("spawn: empty path or argv");
  }
  // argv/envp are built before posix_spawn so nothing allocates in the child.
  std::vector<char*> argv;
  for (const auto& a : options.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : options.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  // The fds the child gets. A source that is itself a low fd (at most the
  // highest target) could be overwritten by an earlier dup2 before its own
  // turn, so it is first staged above every target.
  int max_target = 2;
  std::set<int> targets;
  for (const auto& [from, to] : options.fd_map) {
    if (from < 0 || to < 0 || !targets.insert(to).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("spawn: bad fd_map entry ", from, " -> ", to));
    }
    max_target = std::max(max_target, to);
  }
  struct rlimit nofile {};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 &&
      nofile.rlim_cur != RLIM_INFINITY &&
      static_cast<rlim_t>(max_target) >= nofile.rlim_cur) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spawn ", options.path, ": the child's fd ", max_target,
        " is not below the open-file limit (RLIMIT_NOFILE ", nofile.rlim_cur,
        ")"));
  }
  std::vector<UniqueFd> staged;
  std::vector<std::pair<int, int>> fd_map = options.fd_map;
  for (auto& [from, to] : fd_map) {
    if (from > max_target) continue;
    const int high = ::fcntl(from, F_DUPFD_CLOEXEC, max_target + 1);
    if (high < 0) {
      const int err = errno;
      std::string message = absl::StrCat("spawn: cannot stage fd ", from,
                                         " for the child: ", strerror(err));
      if (err == EBADF) return absl::InvalidArgumentError(message);
      return absl::ResourceExhaustedError(message);
    }
    staged.emplace_back(high);
    from = high;
  }

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  int action_rc = 0;
  for (const auto& [from, to] : fd_map) {
    // dup2 clears FD_CLOEXEC on the copy (sources are all distinct from
    // their targets here), so exactly these fds survive exec.
    if (action_rc == 0) {
      action_rc = posix_spawn_file_actions_adddup2(&actions, from, to);
    }
  }
  // Everything else goes, whether or not its owner remembered O_CLOEXEC:
  // the gaps below the highest target, then all above it (close_range).
  for (int fd = 3; fd < max_target && action_rc == 0; ++fd) {
    if (targets.count(fd) == 0) {
      action_rc = posix_spawn_file_actions_addclose(&actions, fd);
    }
  }
  if (action_rc == 0) {
    action_rc =
        posix_spawn_file_actions_addclosefrom_np(&actions, max_target + 1);
  }
  if (action_rc != 0) {
    posix_spawn_file_actions_destroy(&actions);
    // EBADF: a target at or above RLIMIT_NOFILE.
    return absl::InvalidArgumentError(absl::StrCat(
        "spawn ", options.path, ": cannot map fds up to ", max_target, ": ",
        strerror(action_rc)));
  }
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  short flags = 0;
  if (options.reset_signals) {
    sigset_t all, none;
    sigfillset(&all);
    sigemptyset(&none);
    posix_spawnattr_setsigdefault(&attr, &all);
    posix_spawnattr_setsigmask(&attr, &none);
    flags |= POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK;
  }
  posix_spawnattr_setflags(&attr, flags);

  pid_t pid = -1;
  // The child starts with this thread's mask: not a pinned one's.
  const ThreadCpusForChild child_cpus;
  int rc = posix_spawn(&pid, options.path.c_str(), &actions, &attr, argv.data(),
                       envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    std::string message =
        absl::StrCat("spawn ", options.path, ": ", strerror(rc));
    if (rc == ENOENT) return absl::NotFoundError(message);
    return absl::FailedPreconditionError(message);
  }
  ChildProcess child;
  child.pid_ = pid;
  return child;
}

namespace {

// Runs tasks on one thread that lives until the process exits.
class LauncherThread {
 public:
  static LauncherThread& Get() {
    static LauncherThread* launcher = new LauncherThread();  // never deleted
    return *launcher;
  }

  void Run(std::function<void()> task) {
    absl::Notification done;
    {
      absl::MutexLock lock(&mu_);
      tasks_.push_back([&] {
        task();
        done.Notify();
      });
    }
    done.WaitForNotification();
  }

 private:
  LauncherThread() {
    std::thread([this] {
      pthread_setname_np(pthread_self(), "agx-launcher");
      while (true) {
        std::function<void()> task;
        {
          absl::MutexLock lock(&mu_);
          mu_.Await(absl::Condition(
              +[](std::deque<std::function<void()>>* q) { return !q->empty(); },
              &tasks_));
          task = std::move(tasks_.front());
          tasks_.pop_front();
        }
        task();
      }
    }).detach();
  }

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<ChildProcess> ChildProcess::SpawnFromLauncherThread(
    const SpawnOptions& options) {
  absl::StatusOr<ChildProcess> result =
      absl::InternalError("launcher thread did not run");
  LauncherThread::Get().Run([&] { result = Spawn(options); });
  return result;
}

absl::StatusOr<ChildProcess> ChildProcess::Adopt(pid_t pid) {
  if (pid <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("adopt: bad pid ", pid));
  }
  // WNOWAIT: a child that already exited stays a zombie for TryWait to reap.
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(pid), &info,
               WEXITED | WNOHANG | WNOWAIT) != 0) {
    const int err = errno;
    return absl::InvalidArgumentError(absl::StrCat(
        "adopt: pid ", pid, " is not a child of this process (",
        strerror(err), ")"));
  }
  ChildProcess child;
  child.pid_ = pid;
  return child;
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)), exit_(std::move(other.exit_)) {}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    if (running()) {
      Kill();
      (void)AwaitExit(absl::InfiniteDuration());
    }
    pid_ = std::exchange(other.pid_, -1);
    exit_ = std::move(other.exit_);
  }
  return *this;
}

ChildProcess::~ChildProcess() {
  if (running()) {
    Kill();
    (void)AwaitExit(absl::InfiniteDuration());
  }
}

std::optional<ExitStatus> ChildProcess::TryWait() {
  if (pid_ <= 0 || exit_.has_value()) return exit_;
  int wstatus = 0;
  pid_t r = ::waitpid(pid_, &wstatus, WNOHANG);
  if (r == pid_) exit_ = FromWaitStatus(wstatus);
  if (r < 0 && errno == ECHILD) exit_ = ExitStatus{};  // reaped elsewhere
  return exit_;
}

absl::StatusOr<ExitStatus> ChildProcess::AwaitExit(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = absl::Microseconds(200);
  while (true) {
    if (auto status = TryWait()) return *status;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("process ", pid_, " still running"));
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(20));
  }
}

void ChildProcess::Kill(int signal) {
  if (running()) ::kill(pid_, signal);
}

}  // namespace agentix::base
