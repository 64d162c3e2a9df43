// The seccomp filter the local backend hands bubblewrap (`--seccomp FD`): a
// classic-BPF program assembled here (no libseccomp), the same rules and
// syscall tables as host/python/agentix/provider/_seccomp.py. It allows
// everything except new namespaces, mounts, the keyring, ptrace and
// cross-process memory, module/kexec loading, bpf, perf, userfaultfd, file
// handles, io_uring, host settings and TIOCSTI/TIOCLINUX (EPERM; clone3:
// ENOSYS); a foreign audit arch or an x32 syscall kills the process.
// docs/PROVIDERS.md lists the same.
#pragma once

#include <linux/filter.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/unique_fd.h"

namespace agentix::providers::local {

// "x86_64" or "aarch64" for this build; "" when there is no table.
absl::string_view SeccompMachine();

// The program for `machine` ("x86_64", "aarch64"). INVALID_ARGUMENT for an
// architecture without a syscall table.
absl::StatusOr<std::vector<sock_filter>> DenyFilter(absl::string_view machine);

// A memfd (CLOEXEC, positioned at 0) holding DenyFilter(SeccompMachine()).
absl::StatusOr<base::UniqueFd> FilterFd();

}  // namespace agentix::providers::local
