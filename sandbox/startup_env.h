// Which environment variables take effect only when a process starts: the
// ones that setting in a running worker's os.environ cannot honour (the
// dynamic loader, glibc's allocator and locale set-up, the interpreter's
// own configuration, and what the worker's driver reads once at boot).
// SandboxAdmin.Activate replaces a prestarted worker with a fresh one when
// its env names any of them (docs/PROVIDERS.md, "Arming").
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace agentix::sandbox {

// True if `name` is read only at process (or worker) start.
bool IsStartupOnlyEnvVar(std::string_view name);

// The first "K=V" entry's key that IsStartupOnlyEnvVar, or nullopt.
std::optional<std::string> FirstStartupOnlyEnvVar(
    const std::vector<std::string>& entries);

}  // namespace agentix::sandbox
