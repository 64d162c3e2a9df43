#include "bundler/python_env.h"

#include <filesystem>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "bundler/archive.h"
#include "bundler/command.h"
#include "bundler/elf_file.h"

namespace agentix::bundler {
namespace {

namespace fs = std::filesystem;

constexpr char kSitePackages[] = "lib/python3.11/site-packages";

// Entries of a project directory that are build output or tooling state,
// never part of what pip should build from.
bool ExcludedFromProjectCopy(const std::string& rel, bool is_directory) {
  const std::string name = fs::path(rel).filename().string();
  static const std::set<std::string> kAnywhere = {
      ".git", ".venv", "venv", "__pycache__", ".pytest_cache", ".mypy_cache",
      ".ruff_cache", ".tox", "node_modules"};
  if (kAnywhere.count(name) > 0) return true;
  if (is_directory && absl::EndsWith(name, ".egg-info")) return true;
  const bool top_level = rel.find('/') == std::string::npos;
  return top_level && (name == "build" || name == "dist");
}

std::vector<std::string> PipEnvironment() {
  return {"PIP_CONFIG_FILE=/dev/null", "PIP_NO_INPUT=1",
          "PIP_DISABLE_PIP_VERSION_CHECK=1", "PYTHONDONTWRITEBYTECODE=1",
          "SOURCE_DATE_EPOCH=315532800"};
}

absl::Status OfflineError(const std::string& requirement,
                          const VenvOptions& options) {
  const std::string name = RequirementName(requirement);
  return absl::FailedPreconditionError(absl::StrCat(
      "dependency '", requirement,
      "' is not available offline: it is in no --wheelhouse (",
      options.wheelhouses.empty() ? "none given"
                                  : absl::StrJoin(options.wheelhouses, ", "),
      "), not a local path dependency, and not installed on the build "
      "machine. Provide it: put its wheel (and its dependencies' wheels) in a "
      "directory and pass --wheelhouse DIR (make one where the index is "
      "reachable with `pip wheel -w DIR '",
      requirement, "'`), declare a local path source ([tool.uv.sources] ",
      name, " = { path = \"...\" }), or install its Debian package "
      "(apt-get install python3-", name, ")"));
}

// Rewrites venv/bin: absolute staging paths in scripts become runtime paths
// and the python symlinks point at the bundle's interpreter.
// pip's RECORD lists each console script with the hash and size it had when
// pip wrote it, with the staging path in its first line; after RelocateBin
// those would differ between two builds of the same input (and be wrong).
// The entries of rewritten scripts get the hash and size of what is shipped.
absl::Status UpdateRecordsOfScripts(
    const std::string& venv_dir,
    const std::map<std::string, std::string>& rewritten) {
  if (rewritten.empty()) return absl::OkStatus();
  const fs::path site = fs::path(venv_dir) / kSitePackages;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(site, ec)) {
    const fs::path record = entry.path() / "RECORD";
    if (!absl::EndsWith(entry.path().filename().string(), ".dist-info") ||
        !fs::is_regular_file(record, ec)) {
      continue;
    }
    AGX_ASSIGN_OR_RETURN(std::string text, ReadFile(record.string()));
    std::string updated;
    bool changed = false;
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      if (line.empty()) continue;
      constexpr absl::string_view kBin = "../../../bin/";
      std::vector<absl::string_view> fields = absl::StrSplit(line, ',');
      auto script = fields.size() == 3 && absl::StartsWith(fields[0], kBin)
                        ? rewritten.find(std::string(fields[0].substr(kBin.size())))
                        : rewritten.end();
      if (script == rewritten.end()) {
        absl::StrAppend(&updated, line, "\n");
        continue;
      }
      std::string digest;
      const std::string hex = Sha256Hex(script->second);
      std::string raw = absl::HexStringToBytes(hex);
      absl::WebSafeBase64Escape(raw, &digest);
      absl::StrAppend(&updated, fields[0], ",sha256=", digest, ",",
                      script->second.size(), "\n");
      changed = true;
    }
    if (changed) AGX_RETURN_IF_ERROR(WriteFile(record.string(), updated));
  }
  return absl::OkStatus();
}

absl::Status RelocateBin(const std::string& venv_dir,
                         const VenvOptions& options) {
  const fs::path bin = fs::path(venv_dir) / "bin";
  std::map<std::string, std::string> rewritten;  // script name -> contents
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(bin, ec)) {
    const fs::path path = entry.path();
    const std::string name = path.filename().string();
    if (entry.is_symlink(ec)) {
      if (absl::StartsWith(name, "python")) {
        fs::remove(path, ec);
        fs::create_symlink(options.runtime_python, path, ec);
        if (ec) return absl::InternalError(absl::StrCat("symlink ", path.string()));
      }
      continue;
    }
    if (!entry.is_regular_file(ec) || IsElfFile(path.string())) continue;
    AGX_ASSIGN_OR_RETURN(std::string text, ReadFile(path.string()));
    if (!absl::StrContains(text, venv_dir)) continue;
    const bool executable =
        (entry.status().permissions() & fs::perms::owner_exec) !=
        fs::perms::none;
    const std::string relocated =
        absl::StrReplaceAll(text, {{venv_dir, options.runtime_venv}});
    AGX_RETURN_IF_ERROR(WriteFile(path.string(), relocated, executable));
    rewritten[name] = relocated;
  }
  return UpdateRecordsOfScripts(venv_dir, rewritten);
}

absl::Status WritePyvenvCfg(const std::string& venv_dir,
                            const VenvOptions& options) {
  const std::string path = (fs::path(venv_dir) / "pyvenv.cfg").string();
  AGX_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  std::string version = "3.11";
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(line, absl::MaxSplits('=', 1));
    if (absl::StripAsciiWhitespace(kv.first) == "version") {
      version = std::string(absl::StripAsciiWhitespace(kv.second));
    }
  }
  const std::string home = fs::path(options.runtime_python).parent_path();
  return WriteFile(path,
                   absl::StrCat("home = ", home,
                                "\ninclude-system-site-packages = false\n"
                                "version = ", version,
                                "\nexecutable = ", options.runtime_python,
                                "\n"));
}

// Files pip leaves that name build-machine paths or differ between builds.
absl::Status RemoveBuildArtefacts(const std::string& venv_dir) {
  std::vector<fs::path> doomed;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(venv_dir, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const std::string name = it->path().filename().string();
    if (name == "__pycache__" || name == "direct_url.json") {
      doomed.push_back(it->path());
      if (it->is_directory(ec)) it.disable_recursion_pending();
    }
  }
  for (const auto& path : doomed) {
    fs::remove_all(path, ec);
    if (path.filename() != "direct_url.json") continue;
    // RECORD lists direct_url.json with its hash: drop that line too, or the
    // RECORD would still differ with the path the project was built from.
    const fs::path record = path.parent_path() / "RECORD";
    absl::StatusOr<std::string> text = ReadFile(record.string());
    if (!text.ok()) continue;
    const std::string entry =
        (path.parent_path().filename() / "direct_url.json").string() + ",";
    std::string kept;
    for (absl::string_view line : absl::StrSplit(*text, '\n')) {
      if (line.empty() || absl::StartsWith(line, entry)) continue;
      absl::StrAppend(&kept, line, "\n");
    }
    AGX_RETURN_IF_ERROR(WriteFile(record.string(), kept));
  }
  return absl::OkStatus();
}

}  // namespace

std::string RequirementName(absl::string_view requirement) {
  requirement = absl::StripAsciiWhitespace(requirement);
  size_t end = requirement.find_first_of("<>=!~;[ (@");
  return std::string(absl::StripAsciiWhitespace(requirement.substr(0, end)));
}

bool ExcludedFromStdlib(const std::string& rel, bool is_directory) {
  const std::string name = fs::path(rel).filename().string();
  if (name == "__pycache__" || name == "EXTERNALLY-MANAGED") return true;
  if (!is_directory) return false;
  static const std::set<std::string> kDirs = {
      "test", "tests", "idle_test", "site-packages", "dist-packages"};
  if (kDirs.count(name) > 0) return true;
  return absl::StartsWith(name, "config-3.");
}

absl::StatusOr<CopyStats> StageStdlib(const std::string& stdlib,
                                      const std::string& dest) {
  std::error_code ec;
  if (!fs::exists(fs::path(stdlib) / "os.py", ec)) {
    return absl::NotFoundError(absl::StrCat(
        stdlib, " is not a Python standard library (no os.py); install "
                "libpython3.11-stdlib"));
  }
  return CopyTree(stdlib, dest, ExcludedFromStdlib);
}

std::string MissingRequirementFromPipError(const std::string& pip_stderr) {
  for (absl::string_view marker :
       {"No matching distribution found for ",
        "Could not find a version that satisfies the requirement "}) {
    size_t at = pip_stderr.find(std::string(marker));
    if (at == std::string::npos) continue;
    absl::string_view rest =
        absl::string_view(pip_stderr).substr(at + marker.size());
    size_t end = rest.find_first_of(" \n(");
    return std::string(rest.substr(0, end));
  }
  return "";
}

absl::StatusOr<VenvReport> BuildVenv(const VenvOptions& options,
                                     const std::string& venv_dir) {
  AGX_RETURN_IF_ERROR(RunCommandOrError(
                          {options.python, "-m", "venv", "--without-pip",
                           "--system-site-packages", venv_dir})
                          .status());

  // pip builds a source tree in place (build/, *.egg-info): build a copy so
  // the user's project stays untouched.
  const std::string project_copy =
      (fs::path(options.work_dir) / "project").string();
  AGX_RETURN_IF_ERROR(RemoveTree(project_copy));
  AGX_RETURN_IF_ERROR(
      CopyTree(options.project_dir, project_copy,
               [&](const std::string& rel, bool is_directory) {
                 // An --output inside the project holds this very copy.
                 const fs::path absolute =
                     (fs::path(options.project_dir) / rel).lexically_normal();
                 return ExcludedFromProjectCopy(rel, is_directory) ||
                        (!options.output_dir.empty() &&
                         absolute == fs::path(options.output_dir)
                                         .lexically_normal());
               })
          .status());

  const std::string venv_python = (fs::path(venv_dir) / "bin/python").string();
  std::vector<std::string> pip = {venv_python, "-m", "pip", "install",
                                  "--no-index", "--no-build-isolation",
                                  "--no-compile", "--no-warn-script-location"};
  for (const auto& dir : options.wheelhouses) {
    pip.push_back("--find-links");
    pip.push_back(dir);
  }
  std::vector<std::string> install = pip;
  install.push_back(project_copy);
  for (const auto& dep : options.path_dependencies) install.push_back(dep);
  AGX_ASSIGN_OR_RETURN(CommandResult result,
                       RunCommand(install, PipEnvironment()));
  if (!result.ok()) {
    std::string missing = MissingRequirementFromPipError(result.err);
    if (!missing.empty()) return OfflineError(missing, options);
    return absl::FailedPreconditionError(
        absl::StrCat("pip could not install the project ",
                     options.project_dir, ":\n", result.err));
  }
  std::vector<std::string> agentix = pip;
  agentix.push_back("--no-deps");
  // The venv sees the system site-packages while it is built: without this,
  // an agentix installed there (the Debian package's) would satisfy pip and
  // the bundle, whose venv drops the system site-packages, would lack it.
  agentix.push_back("--ignore-installed");
  agentix.push_back(options.agentix_wheel);
  AGX_RETURN_IF_ERROR(
      RunCommandOrError(agentix, PipEnvironment()).status());

  // pip accepted dependencies installed on the build machine (the venv sees
  // the system site-packages); copy those into the venv.
  const std::string site = (fs::path(venv_dir) / kSitePackages).string();
  AGX_ASSIGN_OR_RETURN(
      CommandResult closure,
      RunCommandOrError({venv_python, options.closure_helper, site,
                         options.project_name},
                        PipEnvironment()));
  nlohmann::json report =
      nlohmann::json::parse(closure.out, nullptr, /*allow_exceptions=*/false);
  if (report.is_discarded() || !report.contains("external")) {
    return absl::InternalError(
        absl::StrCat("dependency closure helper printed no JSON: ",
                     closure.out, closure.err));
  }
  if (!report["errors"].empty()) {
    std::vector<std::string> errors;
    for (const auto& e : report["errors"]) errors.push_back(e.get<std::string>());
    return absl::FailedPreconditionError(absl::StrJoin(errors, "\n"));
  }
  VenvReport venv_report;
  for (const auto& dist : report["external"]) {
    const fs::path location = dist["location"].get<std::string>();
    for (const auto& file : dist["files"]) {
      const fs::path rel = file.get<std::string>();
      if (rel.is_absolute() || absl::StartsWith(rel.string(), "..")) {
        continue;  // scripts outside site-packages: not importable code
      }
      const fs::path src = location / rel;
      std::error_code ec;
      if (fs::is_directory(src, ec)) {
        AGX_ASSIGN_OR_RETURN(
            CopyStats stats,
            CopyTree(src.string(), (fs::path(site) / rel).string(),
                     [](const std::string& r, bool) {
                       return fs::path(r).filename() == "__pycache__";
                     }));
        venv_report.files += stats.files;
      } else if (fs::exists(src, ec) && rel.filename() != "__pycache__" &&
                 rel.extension() != ".pyc") {
        AGX_RETURN_IF_ERROR(
            CopyFileTo(src.string(), (fs::path(site) / rel).string()));
        ++venv_report.files;
      }
    }
    venv_report.copied_from_system.push_back(
        absl::StrCat(dist["name"].get<std::string>(), " ",
                     dist["version"].get<std::string>()));
  }

  AGX_RETURN_IF_ERROR(WritePyvenvCfg(venv_dir, options));
  AGX_RETURN_IF_ERROR(RelocateBin(venv_dir, options));
  AGX_RETURN_IF_ERROR(RemoveBuildArtefacts(venv_dir));
  return venv_report;
}

absl::StatusOr<size_t> CompileBytecode(const std::string& python,
                                       const std::string& dir,
                                       const std::string& runtime_dir) {
  AGX_ASSIGN_OR_RETURN(
      CommandResult result,
      RunCommand({python, "-m", "compileall", "-q", "-j0",
                  "--invalidation-mode", "unchecked-hash", "-d", runtime_dir,
                  dir},
                 {"PYTHONHASHSEED=0", "SOURCE_DATE_EPOCH=315532800"}));
  if (result.exit.signal != 0) {
    return absl::InternalError(absl::StrCat("compileall ", dir, " ",
                                            result.exit.Describe()));
  }
  size_t count = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    if (it->path().extension() == ".pyc") ++count;
  }
  return count;
}

}  // namespace agentix::bundler
