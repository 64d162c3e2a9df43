// cgroup v1 directories of one local sandbox: one per controller (memory,
// pids, cpu), nested under providerd's own cgroup of that controller so a
// sandbox stays inside whatever accounting providerd is under (a VM slice, a
// CI job's limit): <root>/<controller>/<own>/<parent>/<sandbox id>.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace agentix::providers::local {

// The path of `controller` in /proc/<pid>/cgroup text ("4:memory:/a/b" ->
// "/a/b"); nullopt when the controller is not listed (v1 hierarchy absent).
std::optional<std::string> OwnCgroup(absl::string_view proc_self_cgroup,
                                     absl::string_view controller);

// <root>/<controller>/<own>/<parent>/<id>, without doubled slashes.
std::string SandboxCgroupPath(absl::string_view root,
                              absl::string_view controller,
                              absl::string_view own, absl::string_view parent,
                              absl::string_view sandbox_id);

// Why `controller` cannot be used under `root` ("" when it can): not
// mounted (no cgroup.procs), or its parent directory is not writable.
std::string CgroupUnusable(absl::string_view root, absl::string_view controller,
                           const std::optional<std::string>& own);

// Writes `value` to `<dir>/<file>`. NOT_FOUND when the file is absent.
absl::Status WriteCgroupFile(const std::string& dir, absl::string_view file,
                             absl::string_view value);
// The content of `<dir>/<file>`, or nullopt.
std::optional<std::string> ReadCgroupFile(const std::string& dir,
                                          absl::string_view file);
// The pids in `<dir>/cgroup.procs` (empty when it cannot be read).
std::vector<pid_t> CgroupPids(const std::string& dir);
// `oom_kill N` of memory.oom_control text (0 when absent).
long OomKills(absl::string_view oom_control);
// rmdir `dir`, retrying for up to `tries` x 10 ms while tasks leave it;
// then the parent (the shared "<parent>" directory) if it became empty.
// OK when it is gone (or was never there).
absl::Status RemoveCgroup(const std::string& dir, int tries = 100);

}  // namespace agentix::providers::local
