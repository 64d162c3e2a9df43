// agentix-launch: starts agentix-worker, then execs agentix-sandboxd in this
// same process, which adopts the worker (--adopt_worker). On a cold create
// the worker's boot then overlaps the daemon's exec and start-up instead of
// waiting for them; the worker is still the daemon's child (waitpid,
// PR_SET_PDEATHSIG: the thread that forked it becomes the daemon's main
// thread), spawned exactly as the daemon would (BuildWorkerCommand; the
// daemon checks its command line and environment and refuses a mismatch).
//
//   agentix-launch --worker PATH [--venv DIR] [--python-path DIRS]
//       [--worker-arg ARG]... [--payload-ring-bytes N] -- DAEMON [ARGS...]
//
// The worker options must be the daemon's (--worker, --venv, --python-path,
// --payload_ring_bytes). The worker arguments that follow from the daemon's
// flags (--python-home, --direct_calls, ...) and the direct calls' ledger
// are read from the daemon's command line with the daemon's defaults
// (SetWorkerOptionsFor, as the daemon sets its own); --worker-arg adds
// arguments before them, which the daemon then refuses. If the worker
// cannot be started the daemon is exec'd without --adopt_worker and starts
// one itself.
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/child_process.h"
#include "sandbox/adopted_worker.h"
#include "sandbox/daemon_worker_args.h"
#include "sandbox/worker_process.h"
#include "worker/ipc/payload_area.h"

namespace agentix::sandbox {
namespace {

constexpr char kUsage[] =
    "usage: agentix-launch --worker PATH [--venv DIR] [--python-path DIRS] "
    "[--worker-arg ARG]... [--payload-ring-bytes N] -- DAEMON [ARGS...]\n";

struct LaunchArgs {
  WorkerOptions worker;
  std::vector<std::string> daemon;  // daemon[0] is its path
};

absl::StatusOr<LaunchArgs> ParseArgs(int argc, char** argv) {
  LaunchArgs args;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (i + 1 >= argc) {
      return absl::InvalidArgumentError(absl::StrCat("'", arg, "' needs a value"));
    }
    const std::string value = argv[++i];
    if (arg == "--worker") {
      args.worker.worker_path = value;
    } else if (arg == "--venv") {
      args.worker.venv = value;
    } else if (arg == "--python-path") {
      args.worker.python_path = value;
    } else if (arg == "--worker-arg") {
      args.worker.extra_args.push_back(value);
    } else if (arg == "--payload-ring-bytes") {
      if (!absl::SimpleAtoi(value, &args.worker.payload_ring_bytes)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--payload-ring-bytes: not a number: '", value, "'"));
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown option '", arg, "'"));
    }
  }
  if (args.worker.worker_path.empty()) {
    return absl::InvalidArgumentError("--worker is required");
  }
  for (; i < argc; ++i) args.daemon.emplace_back(argv[i]);
  if (args.daemon.empty()) {
    return absl::InvalidArgumentError("no daemon command after '--'");
  }
  absl::StatusOr<DaemonWorkerFlags> daemon_flags = DaemonWorkerFlagsFrom(
      std::vector<std::string>(args.daemon.begin() + 1, args.daemon.end()));
  if (!daemon_flags.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the daemon's command line: ", daemon_flags.status().message()));
  }
  std::vector<std::string> launcher_args = std::move(args.worker.extra_args);
  SetWorkerOptionsFor(*daemon_flags, args.worker);
  args.worker.extra_args.insert(args.worker.extra_args.begin(),
                                launcher_args.begin(), launcher_args.end());
  // The daemon's worker environment: its own, without the runtime token.
  const std::string token_entry = "AGENTIX_TOKEN=";
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::string_view(*e).substr(0, token_entry.size()) != token_entry) {
      args.worker.env.emplace_back(*e);
    }
  }
  return args;
}

// Clears FD_CLOEXEC: the fd crosses the exec into the daemon.
absl::Status KeepAcrossExec(int fd) {
  if (::fcntl(fd, F_SETFD, 0) != 0) {
    return absl::InternalError(absl::StrCat("fcntl: ", strerror(errno)));
  }
  return absl::OkStatus();
}

// Starts the worker as WorkerProcess::Start would; returns what the daemon
// needs to adopt it. The daemon's ends of the fds stay open across exec.
absl::StatusOr<AdoptedWorker> StartWorker(const WorkerOptions& options) {
  std::unique_ptr<ipc::PayloadArea> area;
  if (options.payload_ring_bytes > 0) {
    auto created = CreateWorkerArea(options);
    // Not fatal, as in the daemon: payloads then all take the socketpair.
    if (created.ok()) {
      area = *std::move(created);
    } else {
      std::fprintf(stderr, "agentix-launch: no payload area: %s\n",
                   created.status().ToString().c_str());
    }
  }
  AdoptedWorker adopted;
  adopted.worker_id = NewWorkerId();
  // This thread becomes the daemon's main thread: the worker's
  // PR_SET_PDEATHSIG follows it, as it follows the daemon's launcher thread.
  absl::StatusOr<SpawnedWorker> spawned =
      SpawnWorker(options, adopted.worker_id, area.get(), SpawnThread::kCaller);
  if (!spawned.ok()) return spawned.status();
  int payload_fd = -1;
  if (area != nullptr) {
    // The memfd outlives the area's mapping here (exec drops the mapping).
    payload_fd = ::dup(area->fd());
    if (payload_fd < 0) {
      return absl::ResourceExhaustedError(absl::StrCat("dup: ", strerror(errno)));
    }
  }
  for (int fd : {spawned->channel.get(), spawned->stderr_read.get(), payload_fd}) {
    if (fd < 0) continue;
    absl::Status kept = KeepAcrossExec(fd);
    if (!kept.ok()) return kept;
  }
  adopted.channel_fd = spawned->channel.Release();
  adopted.stderr_fd = spawned->stderr_read.Release();
  adopted.payload_fd = payload_fd;
  adopted.pid = spawned->child.Release();
  return adopted;
}

int Main(int argc, char** argv) {
  absl::StatusOr<LaunchArgs> args = ParseArgs(argc, argv);
  if (!args.ok()) {
    std::fprintf(stderr, "agentix-launch: %s\n%s",
                 std::string(args.status().message()).c_str(), kUsage);
    return 2;
  }
  std::vector<std::string> daemon = args->daemon;
  absl::StatusOr<AdoptedWorker> adopted = StartWorker(args->worker);
  if (adopted.ok()) {
    daemon.push_back(absl::StrCat("--adopt_worker=", FormatAdoptFlag(*adopted)));
  } else {
    std::fprintf(stderr,
                 "agentix-launch: could not start the worker (%s); the daemon "
                 "starts it\n",
                 std::string(adopted.status().message()).c_str());
  }
  std::vector<char*> daemon_argv;
  for (std::string& a : daemon) daemon_argv.push_back(a.data());
  daemon_argv.push_back(nullptr);
  ::execv(daemon_argv[0], daemon_argv.data());
  const int err = errno;
  std::fprintf(stderr, "agentix-launch: exec %s: %s\n", daemon_argv[0], strerror(err));
  if (adopted.ok()) {
    // Ours again: no daemon will adopt it.
    auto orphan = base::ChildProcess::Adopt(adopted->pid);
    if (orphan.ok()) orphan->Kill();  // the destructor reaps it
  }
  return 127;
}

}  // namespace
}  // namespace agentix::sandbox

int main(int argc, char** argv) { return agentix::sandbox::Main(argc, argv); }
