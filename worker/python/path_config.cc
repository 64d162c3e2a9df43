#include "worker/python/path_config.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace agentix::worker {
namespace {

namespace fs = std::filesystem;

bool IsFile(const fs::path& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

bool IsDirectory(const fs::path& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

// Absolute and lexically normal, without resolving symlinks: a venv reached
// through a symlink keeps the path the caller gave (as `python -m venv` does).
std::string Absolute(const std::string& path) {
  std::error_code ec;
  fs::path abs = fs::absolute(path, ec);
  if (ec) abs = path;
  std::string out = abs.lexically_normal().string();
  // "/a/b/" normalises to "/a/b/"; drop the trailing separator.
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

std::string LibDir(const std::string& prefix, absl::string_view version) {
  return absl::StrCat(prefix, "/lib/python", version);
}

// "3.11.2" -> "3.11"; anything else is returned unchanged.
std::string MajorMinor(absl::string_view version) {
  std::vector<absl::string_view> parts = absl::StrSplit(version, '.');
  if (parts.size() < 2) return std::string(version);
  return absl::StrCat(parts[0], ".", parts[1]);
}

}  // namespace

PyvenvConfig ParsePyvenvCfg(absl::string_view text) {
  PyvenvConfig config;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos) continue;
    const std::string key =
        absl::AsciiStrToLower(absl::StripAsciiWhitespace(line.substr(0, eq)));
    const absl::string_view value =
        absl::StripAsciiWhitespace(line.substr(eq + 1));
    if (key == "home") {
      config.home = std::string(value);
    } else if (key == "version" || key == "version_info") {
      config.version = std::string(value);
    } else if (key == "include-system-site-packages") {
      config.include_system_site_packages =
          absl::AsciiStrToLower(value) == "true";
    }
  }
  return config;
}

std::vector<std::string> SplitPythonPath(absl::string_view value) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(value, ':')) {
    if (!part.empty()) out.emplace_back(part);
  }
  return out;
}

std::string FindPythonHome(const std::string& library_path,
                           absl::string_view version,
                           const std::string& fallback) {
  if (library_path.empty()) return fallback;
  std::error_code ec;
  // Resolve symlinks: on a merged-/usr system the loader reports
  // /lib/x86_64-linux-gnu/..., whose parent would wrongly give "/".
  fs::path real = fs::canonical(library_path, ec);
  if (ec) return fallback;
  fs::path dir = real.parent_path();
  for (int level = 0; level < 3 && !dir.empty(); ++level) {
    if (IsFile(fs::path(LibDir(dir.string(), version)) / "os.py")) {
      return dir.string();
    }
    if (dir == dir.parent_path()) break;
    dir = dir.parent_path();
  }
  return fallback;
}

absl::StatusOr<PythonPaths> ComputePythonPaths(const PathOptions& options,
                                               const std::string& default_home,
                                               absl::string_view version) {
  PythonPaths paths;
  paths.home = Absolute(options.python_home.empty() ? default_home
                                                    : options.python_home);
  const std::string stdlib = LibDir(paths.home, version);
  if (!IsFile(fs::path(stdlib) / "os.py")) {
    return absl::FailedPreconditionError(absl::StrCat(
        "python home '", paths.home, "' has no standard library (",
        stdlib, "/os.py not found); pass --python-home"));
  }
  for (const std::string& dir : options.python_path) {
    if (!dir.empty()) paths.module_search_paths.push_back(Absolute(dir));
  }
  paths.module_search_paths.push_back(stdlib);
  paths.module_search_paths.push_back(absl::StrCat(stdlib, "/lib-dynload"));

  if (options.venv.empty()) {
    paths.executable = absl::StrCat(paths.home, "/bin/python3");
    return paths;
  }
  paths.venv = Absolute(options.venv);
  const fs::path cfg_path = fs::path(paths.venv) / "pyvenv.cfg";
  if (!IsDirectory(paths.venv) || !IsFile(cfg_path)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--venv '", paths.venv,
        "' is not a virtualenv (no pyvenv.cfg); create it with "
        "/usr/bin/python3 -m venv"));
  }
  std::ifstream in(cfg_path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read ", cfg_path.string()));
  }
  const PyvenvConfig cfg = ParsePyvenvCfg(text.str());
  if (!cfg.version.empty() && MajorMinor(cfg.version) != version) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--venv '", paths.venv, "' was made by Python ", cfg.version,
        " (home ", cfg.home, "), but the worker embeds Python ", version,
        "; recreate it with /usr/bin/python3 -m venv"));
  }
  paths.venv_site_packages =
      absl::StrCat(LibDir(paths.venv, version), "/site-packages");
  if (!IsDirectory(paths.venv_site_packages)) {
    return absl::FailedPreconditionError(
        absl::StrCat("--venv '", paths.venv, "' has no ",
                     paths.venv_site_packages));
  }
  paths.system_site_packages = cfg.include_system_site_packages;
  paths.executable = absl::StrCat(paths.venv, "/bin/python3");
  return paths;
}

}  // namespace agentix::worker
