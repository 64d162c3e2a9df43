// The local backend of agentix-providerd: each sandbox is one bubblewrap
// process tree on this machine, a port of host/python/agentix/provider/
// local.py (docs/PROVIDERS.md, "LocalProvider" and "Local backend").
//
// Threads: one launcher thread forks every bwrap (bwrap's --die-with-parent
// is PR_SET_PDEATHSIG, which fires when the *thread* that forked it exits,
// so that thread lives as long as the backend), and one epoll thread drains
// every sandbox's output pipe into its sandbox.log and reaps bwrap through a
// pidfd. Per sandbox providerd holds 3 fds: the pidfd, the pipe's read end
// and the open sandbox.log.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "providers/backend.h"

namespace agentix::providers::local {

struct LocalBackendOptions {
  // The bubblewrap binary (a name is looked up on PATH).
  std::string bwrap = "bwrap";
  // Per-sandbox directories <state_dir>/<id> (state.json, sandbox.log, the
  // `run` symlink); created mode 0700. Keep it short: the socket path
  // <state_dir>/<id>/run/agentix.sock must fit sun_path (107 bytes), so
  // with 63-character ids at most 26 bytes.
  std::string state_dir = "/run/agentix-local";
  // Where the cgroup v1 controllers are mounted, and the directory made
  // under providerd's own cgroup of each: <root>/<ctl>/<own>/<parent>/<id>.
  std::string cgroup_root = "/sys/fs/cgroup";
  std::string cgroup_parent = "agentix";
  // pids.max when the spec sets none (0: no default). A default that
  // cannot be enforced is only logged.
  int64_t default_pids_max = 1024;
  // memory.limit_in_bytes when the spec sets none (0: none).
  int64_t default_memory_bytes = 0;
  // tmpfs sizes: /tmp (when the spec's scratch_bytes is 0), /run, /dev/shm.
  int64_t tmp_bytes = int64_t{1} << 30;
  int64_t run_bytes = int64_t{16} << 20;
  int64_t shm_bytes = int64_t{64} << 20;
  // Cap on sandbox.log + sandbox.log.1 (rotation at half).
  int64_t log_max_bytes = int64_t{16} << 20;
  // Install the seccomp filter (seccomp_filter.h). Off only for a kernel or
  // architecture it breaks; on an architecture without a table, Create
  // fails unless it is off.
  bool seccomp = true;
  // A limit the spec asks for that this machine cannot enforce fails
  // Validate with FAILED_PRECONDITION LIMIT_NOT_ENFORCEABLE (true), or is
  // logged and skipped (false).
  bool require_limits = true;
  // The daemon's flag for the admin token file (bootstrap.sh passes its
  // arguments on to agentix-sandboxd).
  std::string token_flag = "--admin-token-file";
  // Appended before the entry point, for what this class does not model.
  std::vector<std::string> extra_bwrap_args;
  // Output of a sandbox that exited is kept this long for its pipe to end
  // before the exit is reported anyway.
  absl::Duration drain_grace = absl::Seconds(2);
};

// Makes the state directory, reads providerd's own cgroups and starts the
// backend's two threads. INVALID_ARGUMENT for bad options.
absl::StatusOr<std::unique_ptr<Backend>> NewLocalBackend(
    LocalBackendOptions options);

}  // namespace agentix::providers::local
