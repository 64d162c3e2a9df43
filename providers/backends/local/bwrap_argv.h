// The bubblewrap command line of one local sandbox (docs/PROVIDERS.md,
// "Isolation: each flag and why"): fresh user/pid/net/ipc/uts/cgroup
// namespaces, no capabilities, the seccomp filter, a mount namespace built
// from an empty tmpfs root holding read-only binds of the image's top-level
// entries, the bundle's nix/ read-only at /nix, read-only /proc and /dev,
// and size-capped tmpfs at /dev/shm, /tmp, /run and /run/agentix.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace agentix::providers::local {

inline constexpr char kSandboxRunDir[] = "/run/agentix";
inline constexpr char kSandboxSocket[] = "/run/agentix/agentix.sock";
inline constexpr char kSandboxListen[] = "unix:///run/agentix/agentix.sock";
inline constexpr char kEntryPoint[] = "/nix/runtime/bootstrap.sh";
// The socket tmpfs: it holds a socket; the sandbox must not fill memory
// through the one directory providerd looks into.
inline constexpr int64_t kSocketDirBytes = 1 << 20;

struct BwrapArgs {
  std::string bwrap;       // the binary
  std::string sandbox_id;  // also the hostname
  std::string root;        // "/" or a rootfs directory
  std::string nix_dir;     // the bundle's nix/ directory
  bool share_net = false;  // network HOST
  int seccomp_fd = -1;     // -1: no filter
  int info_fd = -1;        // bwrap writes {"child-pid": N} there
  int token_fd = -1;       // the daemon's admin token (a pipe)
  std::string token_flag = "--admin-token-file";
  int64_t tmp_bytes = 0;
  int64_t run_bytes = 0;
  int64_t shm_bytes = 0;
  std::vector<std::string> extra_args;  // before the entry point
};

// argv (argv[0] = bwrap). Lists `root`'s top-level entries: NOT_FOUND /
// FAILED_PRECONDITION when it cannot be read.
absl::StatusOr<std::vector<std::string>> BuildBwrapArgv(const BwrapArgs& args);

}  // namespace agentix::providers::local
