// The Python half of a bundle: the standard library the worker embeds
// (python/) and the project's virtualenv (venv/), installed non-editable and
// offline with the build machine's pip, then made to point into
// /nix/runtime instead of the staging directory.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bundler/file_tree.h"

namespace agentix::bundler {

// True for stdlib entries a bundle leaves out: test suites, __pycache__,
// site-/dist-packages (the venv provides those), the static-library config
// dir and Debian's EXTERNALLY-MANAGED marker. `rel` is relative to the
// stdlib root.
bool ExcludedFromStdlib(const std::string& rel, bool is_directory);

// Copies `stdlib` (e.g. /usr/lib/python3.11) to `dest` without the
// excluded entries.
absl::StatusOr<CopyStats> StageStdlib(const std::string& stdlib,
                                      const std::string& dest);

struct VenvOptions {
  std::string python = "/usr/bin/python3";  // makes the venv, runs pip
  std::string project_dir;                  // the project (not modified)
  std::string work_dir;      // scratch: the project copy pip builds from
  std::string output_dir;    // left out of that copy when inside the project
  std::vector<std::string> wheelhouses;       // --find-links dirs
  std::vector<std::string> path_dependencies;  // local projects
  std::string agentix_wheel;                  // installed with --no-deps
  std::string closure_helper;                 // dist_closure.py
  std::string project_name;                   // root of the closure walk
  // Where the venv lives at run time, and the python it uses there.
  std::string runtime_venv = "/nix/runtime/venv";
  std::string runtime_python = "/nix/runtime/python/bin/python3.11";
};

struct VenvReport {
  std::vector<std::string> copied_from_system;  // "name version"
  size_t files = 0;
};

// "msgpack[x]>=1.0; python_version>'3'" -> "msgpack".
std::string RequirementName(absl::string_view requirement);

// Offline pip output -> the requirement it could not satisfy, or "".
std::string MissingRequirementFromPipError(const std::string& pip_stderr);

// Creates the venv at `venv_dir` and installs the project, its dependency
// closure and the agentix wheel. Errors (kFailedPrecondition) name a
// dependency that is not available offline and say how to provide it
// (--wheelhouse), or carry pip's error.
absl::StatusOr<VenvReport> BuildVenv(const VenvOptions& options,
                                     const std::string& venv_dir);

// Precompiles every module under `dir` to unchecked-hash .pyc files whose
// recorded source path is `runtime_dir` (where `dir` lives at run time).
// Hash-based pycs carry no source mtime, and with a fixed hash seed and a
// fixed recorded path the bytes only depend on the sources, so the bundle
// stays deterministic; "unchecked" because a bundle is read-only: imports
// skip hashing the source. Returns the number of .pyc files. Modules that
// do not compile (test data written for Python 2) are skipped, not errors.
absl::StatusOr<size_t> CompileBytecode(const std::string& python,
                                       const std::string& dir,
                                       const std::string& runtime_dir);

}  // namespace agentix::bundler
