// agentix-worker: runs Python callables for agentix-sandboxd over the frame
// channel on --channel-fd (docs/WORKER-PROTOCOL.md). Started only by the
// daemon; see worker.h for the lifecycle and exit codes.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/flags.h"
#include "base/version.h"
#include "base/log.h"
#include "base/malloc_tuning.h"
#include "base/mutex_tuning.h"
#include "worker/ipc/frame.h"
#include "worker/channel/channel_state.h"
#include "worker/channel/intake_baton.h"
#include "worker/python/large_buffers.h"
#include "worker/python/path_config.h"
#include "worker/python/prefault.h"
#include "worker/worker.h"

ABSL_FLAG(std::string, venv, "",
          "virtualenv (made by /usr/bin/python3 -m venv) whose site-packages "
          "the worker imports from");
ABSL_FLAG(std::string, python_path, "",
          "extra import roots, ':'-separated, placed first on sys.path");
ABSL_FLAG(std::string, python_home, "",
          "stdlib prefix (holds lib/python3.11); default: found from the "
          "loaded libpython, else /usr");
ABSL_FLAG(int, channel_fd, agentix::ipc::kWorkerChannelFd,
          "fd of the worker's end of the frame socketpair");
ABSL_FLAG(int, payload_fd, -1,
          "fd of the daemon's shared payload area (memfd), or -1 for none");
ABSL_FLAG(std::string, worker_id, "",
          "id used in logs; default $AGENTIX_WORKER_ID, else random");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");
ABSL_FLAG(bool, direct_calls, false,
          "serve Calls connections the daemon hands over (its --direct_calls "
          "passes this; docs/DIRECT-CALLS.md). Off: the intake polls the bare "
          "link and ready does not advertise direct calls");
ABSL_FLAG(bool, avoid_holder_cpu, true,
          "with --direct_calls: the intake's follower waits off the CPU the "
          "holder last offered from (no call-path CPU is published for direct "
          "calls). The daemon passes --noavoid_holder_cpu with --calls_cpu=off, "
          "which promises that nothing is pinned");
ABSL_FLAG(int64_t, intake_spin_us, 0,
          "microseconds the pool thread reading the channel polls it without "
          "sleeping before it blocks (adaptive; the daemon's "
          "--worker_intake_spin_us). 0 (default): no spinning");
ABSL_FLAG(int64_t, intake_look_slack_us,
          absl::ToInt64Microseconds(agentix::worker::IntakeBaton::kDefaultLookSlack),
          "microseconds late the intake's follower may look for a call that "
          "runs past 1 ms while short calls stream (its looks then ride its "
          "CPU's tick; exact for 10 s after it took one; the daemon's "
          "--worker_intake_look_slack_us). 0: always exact");
ABSL_FLAG(int, prefault_arena_mib, 5,
          "MiB of the interpreter's object arenas faulted in ahead of use by a "
          "second thread while the worker boots (worker/python/prefault.h); "
          "0: none. A cold first call importing asyncio uses ~4.7 MiB of "
          "arenas (docs/DECISIONS.md, stop 36)");
ABSL_FLAG(int, prefault_heap_mib, 2,
          "MiB at the top of malloc's main heap faulted in the same way; 0: "
          "none. That first call grows the heap by ~2.3 MiB");
ABSL_FLAG(bool, prefault_image_data, true,
          "fault in the worker executable's writable data and bss (the "
          "statically linked interpreter's static objects) at once before "
          "the boot writes them page by page: a cold worker's boot ~10 % "
          "shorter on this project's VMs (docs/PERFORMANCE.md, stop 48)");
ABSL_FLAG(bool, prefault_libpython, false,
          "read libpython's mapped file pages in the same way: the shared "
          "library's, or the worker's own when it links libpython statically "
          "(the default build). Off: with no idle CPU the reads compete with "
          "the boot; not measured quiet (docs/DECISIONS.md, stop 37)");

namespace {

// How long interpreter finalisation may take before the worker just exits.
constexpr int kFinalizeBudgetMs = 2000;

std::string RandomWorkerId() {
  uint32_t value = 0;
  if (getrandom(&value, sizeof(value), 0) != sizeof(value)) {
    value = static_cast<uint32_t>(getpid()) * 2654435761u;
  }
  return absl::StrFormat("%08x", value);
}

}  // namespace

int main(int argc, char** argv) {
  agentix::base::TuneMallocForLargeBuffers();
  agentix::base::DisableMutexDeadlockDetection();
  // Die with the daemon. The flag is dropped if the parent is already gone
  // when it is set, hence the re-check; a parent lost even earlier shows up
  // as EOF on the channel.
  const pid_t parent = getppid();
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) return agentix::worker::kExitChannelError;
  // Write errors on the channel must come back as EPIPE, not kill us.
  signal(SIGPIPE, SIG_IGN);

  agentix::base::SetFlagsUsage(
      "agentix-worker --channel-fd N [--venv DIR] [--python-path DIR[:DIR]] "
      "[--python-home DIR] [--payload-fd N] [--worker-id ID] [--log-level L]"
      "\n\nRuns Python callables for agentix-sandboxd over the frame "
      "socketpair --channel-fd (the daemon starts it; not run by hand).",
      absl::StrCat("agentix-worker ", agentix::base::kAgentixVersion));
  std::vector<std::string> storage;
  std::vector<char*> args = agentix::base::NormalizeFlagNames(argc, argv, storage);
  absl::ParseCommandLine(static_cast<int>(args.size()) - 1, args.data());

  // First: the thread's head start is what the boot gains.
  const absl::Status prefault = agentix::worker::StartPrefault(
      {.arena_mib = static_cast<size_t>(
           std::max(0, absl::GetFlag(FLAGS_prefault_arena_mib))),
       .heap_mib = static_cast<size_t>(
           std::max(0, absl::GetFlag(FLAGS_prefault_heap_mib))),
       .libpython = absl::GetFlag(FLAGS_prefault_libpython),
       .image_data = absl::GetFlag(FLAGS_prefault_image_data)});
  // Large buffers (1 MiB up to a 64 MiB value: a large argument's bytes)
  // from a pool whose freed slots keep their pages, whichever thread
  // allocated them; AGENTIX_WORKER_LARGE_BUFFERS=0 leaves them to malloc.
  const char* large_buffers = getenv("AGENTIX_WORKER_LARGE_BUFFERS");
  const bool pool_large_buffers =
      large_buffers == nullptr || strcmp(large_buffers, "0") != 0;
  const absl::Status pool = pool_large_buffers
                                ? agentix::worker::InstallLargeBufferPool({})
                                : absl::OkStatus();
  agentix::worker::IntakeBaton::SetSpin(absl::Microseconds(
      std::clamp<int64_t>(absl::GetFlag(FLAGS_intake_spin_us), 0, 1000000)));
  agentix::worker::IntakeBaton::SetLookSlack(absl::Microseconds(
      std::clamp<int64_t>(absl::GetFlag(FLAGS_intake_look_slack_us), 0, 1000000)));
  agentix::worker::SetServeDirectCalls(absl::GetFlag(FLAGS_direct_calls));
  if (!absl::GetFlag(FLAGS_avoid_holder_cpu)) {
    agentix::worker::IntakeBaton::SetAvoidHolderCpu(false);
  }
  agentix::worker::WorkerOptions options;
  options.paths.venv = absl::GetFlag(FLAGS_venv);
  options.paths.python_path =
      agentix::worker::SplitPythonPath(absl::GetFlag(FLAGS_python_path));
  options.paths.python_home = absl::GetFlag(FLAGS_python_home);
  options.channel_fd = absl::GetFlag(FLAGS_channel_fd);
  options.payload_fd = absl::GetFlag(FLAGS_payload_fd);
  options.worker_id = absl::GetFlag(FLAGS_worker_id);
  if (options.worker_id.empty()) {
    const char* env = getenv("AGENTIX_WORKER_ID");
    options.worker_id = env != nullptr && *env != '\0' ? env : RandomWorkerId();
  }
  // User code (and its subprocesses) can find out which worker it runs in.
  setenv("AGENTIX_WORKER_ID", options.worker_id.c_str(), 1);

  agentix::base::SetLogTag("agentix-worker[" + options.worker_id + "]");
  agentix::base::SetMinLogSeverity(
      agentix::base::ParseLogSeverity(absl::GetFlag(FLAGS_log_level)));
  if (!pool.ok()) {
    AGX_LOG(Warning, "large buffers come from malloc: {}", pool.ToString());
  }
  if (!prefault.ok()) {
    AGX_LOG(Warning, "booting without prefaulted memory: {}", prefault.ToString());
  }

  const agentix::worker::WorkerExit exit = agentix::worker::RunWorker(options);
  if (exit.finalize) {
    agentix::worker::FinalizeWorker(kFinalizeBudgetMs, exit.code);
  }
  fflush(nullptr);
  // Skip static destructors and any atexit work of a half-torn-down
  // interpreter: the process state no longer matters.
  _exit(exit.code);
}
