// Where the embedded CPython finds its standard library, the virtualenv and
// the user's import roots. Pure computation over the filesystem: it does not
// touch libpython, so it is unit-testable on its own and the result can be
// inspected before the interpreter exists.
//
// The layout follows CONVENTIONS.md §4.4: `home` (the stdlib prefix) and the
// search path are always explicit, so nothing depends on PATH, PYTHONHOME or
// on which python3 happens to be installed elsewhere. The venv is reached by
// pointing the interpreter's executable at `<venv>/bin/python3`, so that
// site.py reads its pyvenv.cfg exactly as a venv's own python would
// (site-packages, include-system-site-packages, .pth files).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace agentix::worker {

// What the worker was asked for (the --venv / --python-path / --python-home
// flags). Empty strings mean "not given".
struct PathOptions {
  std::string venv;                      // a `python3 -m venv` directory
  std::vector<std::string> python_path;  // extra import roots, in order
  std::string python_home;               // stdlib prefix override
};

// The interpreter's path configuration, ready for PyConfig.
struct PythonPaths {
  // Stdlib prefix: `<home>/lib/python3.11` holds os.py.
  std::string home;
  // sys.executable: `<venv>/bin/python3`, else `<home>/bin/python3`. The file
  // need not exist; site.py only looks for pyvenv.cfg beside or above it.
  std::string executable;
  // sys.path before site.py runs: the import roots, then the stdlib and
  // lib-dynload. site.py appends site-packages after these.
  std::vector<std::string> module_search_paths;
  // Absolute venv directory, or empty.
  std::string venv;
  // `<venv>/lib/python3.11/site-packages` (informational; site.py adds it).
  std::string venv_site_packages;
  // pyvenv.cfg's include-system-site-packages.
  bool system_site_packages = false;
};

// The parts of a pyvenv.cfg the worker checks.
struct PyvenvConfig {
  std::string home;     // directory of the python that created the venv
  std::string version;  // e.g. "3.11.2"
  bool include_system_site_packages = false;
};

// Parses the text of a pyvenv.cfg ("key = value" lines; unknown keys and
// malformed lines are ignored, as site.py does). Never fails.
PyvenvConfig ParsePyvenvCfg(absl::string_view text);

// Splits a --python-path value on ':' and drops empty entries.
std::vector<std::string> SplitPythonPath(absl::string_view value);

// Finds the stdlib prefix from the path of the loaded libpython (or of the
// binary, when libpython is linked statically): the symlink-resolved
// directory of `library_path` or one of its two parents whose
// `lib/python<version>/os.py` exists. Returns `fallback` when none does.
// Debian's /usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0 gives /usr; a
// relocated bundle's <root>/python/lib/libpython3.11.so gives <root>/python.
std::string FindPythonHome(const std::string& library_path,
                           absl::string_view version,
                           const std::string& fallback);

// Computes the path configuration. `default_home` is used when
// options.python_home is empty; `version` is "<major>.<minor>" of the linked
// libpython. Relative paths are made absolute against the current directory.
// Errors (all kFailedPrecondition, with a message naming the path):
//   - home has no lib/python<version>/os.py;
//   - the venv has no pyvenv.cfg, was made by another Python minor version,
//     or has no lib/python<version>/site-packages.
absl::StatusOr<PythonPaths> ComputePythonPaths(const PathOptions& options,
                                               const std::string& default_home,
                                               absl::string_view version);

}  // namespace agentix::worker
