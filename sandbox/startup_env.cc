#include "sandbox/startup_env.h"

namespace agentix::sandbox {
namespace {

// Prefixes of families read at start-up: ld.so (LD_PRELOAD,
// LD_LIBRARY_PATH, LD_BIND_NOW, ...), glibc's malloc tunables, the locale
// categories (the interpreter sets LC_CTYPE once, before any user code),
// CPython's PYTHON* configuration (the worker runs isolated and ignores
// them, but a fresh process is what a spawn with them would be), and the
// driver's logging set-up (AGENTIX_LOG_LEVEL, _DIR, _FORMAT, _CONTEXT).
constexpr std::string_view kPrefixes[] = {"LD_", "MALLOC_", "LC_", "PYTHON",
                                          "AGENTIX_LOG_"};
constexpr std::string_view kNames[] = {
    "GLIBC_TUNABLES",     // glibc, at process start
    "LANG",               // locale, as LC_*
    "AGENTIX_WORKER_ID",  // the daemon's id of a worker generation
    // The worker's large-buffer pool, installed before its interpreter.
    "AGENTIX_WORKER_LARGE_BUFFERS",
    // Read by setuptools' distutils-precedence.pth, which site.py runs at
    // interpreter start (in most venvs and in Debian's dist-packages).
    "SETUPTOOLS_USE_DISTUTILS",
};

}  // namespace

bool IsStartupOnlyEnvVar(std::string_view name) {
  for (std::string_view prefix : kPrefixes) {
    if (name.substr(0, prefix.size()) == prefix) return true;
  }
  for (std::string_view exact : kNames) {
    if (name == exact) return true;
  }
  return false;
}

std::optional<std::string> FirstStartupOnlyEnvVar(
    const std::vector<std::string>& entries) {
  for (const std::string& entry : entries) {
    const std::string_view key =
        std::string_view(entry).substr(0, entry.find('='));
    if (IsStartupOnlyEnvVar(key)) return std::string(key);
  }
  return std::nullopt;
}

}  // namespace agentix::sandbox
