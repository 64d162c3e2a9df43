// The CPU bandwidth limit (cgroup quota) this process runs under, if any.
// Threads that burn CPU on purpose (the daemon's keep-awake spinners,
// sandbox/keep_awake.h) must not run under a quota: the time they burn is
// charged to the whole cgroup, which is then throttled, daemon and worker
// included, for the rest of the period.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace agentix::base {

// The tightest quota, in CPUs (e.g. 0.5 for 50 ms per 100 ms), over the
// cgroups of `proc_self_cgroup` (the text of /proc/self/cgroup) and their
// ancestors, read below `cgroup_root` (/sys/fs/cgroup): cgroup v2's cpu.max
// ("max 100000" = none) and cgroup v1's cpu.cfs_quota_us / cpu.cfs_period_us
// of the hierarchy that has the "cpu" controller (-1 = none). nullopt: no
// quota anywhere. Missing files are "no quota" (no cpu controller mounted);
// a file that exists but does not parse is kInvalidArgument naming it.
absl::StatusOr<std::optional<double>> CpuQuota(absl::string_view proc_self_cgroup,
                                                const std::string& cgroup_root);

// CpuQuota for this process.
absl::StatusOr<std::optional<double>> OwnCpuQuota();

}  // namespace agentix::base
