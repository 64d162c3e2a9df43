// agentix-bundle: `bazel run //bundler -- build PATH [--output DIR]
// [--name NAME] [--tag TAG] [--wheelhouse DIR]...` turns one Python project
// into a self-contained runtime image (docs/BUNDLE.md).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/flags.h"
#include "base/version.h"
#include "bundler/bundle_builder.h"

ABSL_FLAG(std::string, output, "",
          "output directory (default: PATH/dist/agentix-bundle); it receives "
          "nix/, manifest.json, NAME-TAG.bundle.tar and oci/");
ABSL_FLAG(std::string, name, "",
          "bundle name, or NAME:TAG (default: [project].name without an "
          "'agentix-' prefix)");
ABSL_FLAG(std::string, tag, "",
          "bundle tag (default: [project].version, else 'latest')");
ABSL_FLAG(std::string, sandboxd, "",
          "agentix-sandboxd to bundle (default: from the runfiles)");
ABSL_FLAG(std::string, worker, "",
          "agentix-worker to bundle (default: from the runfiles)");
ABSL_FLAG(std::string, launcher, "",
          "agentix-launch to bundle (default: from the runfiles; 'none': "
          "bundle none, the daemon then always starts its worker itself)");
ABSL_FLAG(bool, early_worker, false,
          "AGENTIX_EARLY_WORKER's default in bootstrap.sh: agentix-launch "
          "starts the worker before the daemon's exec (off: it did not "
          "measure better, docs/DECISIONS.md, stop 35)");
ABSL_FLAG(std::string, wire, "grpc",
          "the wire bootstrap.sh serves when AGENTIX_WIRE is unset: grpc, or "
          "socketio for the original's providers and hosts (agentix-sio-gateway "
          "on AGENTIX_BIND_HOST:AGENTIX_BIND_PORT; the project must depend on "
          "its packages, see docs/GATEWAY.md)");
ABSL_FLAG(std::string, wheel, "",
          "agentix wheel to install (default: from the runfiles)");

namespace {

namespace fs = std::filesystem;

constexpr char kUsage[] =
    "agentix-bundle build PATH [--output DIR] [--name NAME] [--tag TAG] "
    "[--wheelhouse DIR]... [--wire grpc|socketio]";
constexpr char kWheelhouseFlag[] = "--wheelhouse";

// --wheelhouse is repeatable, which absl flags are not.
std::vector<std::string> ExtractRepeated(int& argc, char** argv,
                                         const std::string& flag) {
  std::vector<std::string> values;
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == flag && i + 1 < argc) {
      values.push_back(argv[++i]);
    } else if (absl::StartsWith(arg, flag + "=")) {
      values.push_back(arg.substr(flag.size() + 1));
    } else {
      argv[out++] = argv[i];
    }
  }
  argc = out;
  return values;
}

// `bazel run` starts us in the runfiles tree; the user's relative paths are
// relative to where they typed the command.
std::string UserPath(const std::string& path) {
  if (path.empty() || fs::path(path).is_absolute()) return path;
  const char* cwd = getenv("BUILD_WORKING_DIRECTORY");
  fs::path base = cwd != nullptr && *cwd != '\0' ? fs::path(cwd)
                                                 : fs::current_path();
  return (base / path).lexically_normal().string();
}

std::string Runfile(const std::string& rel) {
  std::vector<fs::path> roots;
  if (const char* dir = getenv("RUNFILES_DIR")) roots.emplace_back(dir);
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) roots.push_back(self.string() + ".runfiles");
  roots.push_back(fs::current_path().parent_path());  // cwd = <runfiles>/agentix
  for (const auto& root : roots) {
    fs::path candidate = root / "agentix" / rel;
    if (fs::exists(candidate, ec)) return candidate.string();
  }
  return (roots.empty() ? fs::path(rel) : roots.front() / "agentix" / rel)
      .string();
}

std::string FlagOr(const std::string& value, const std::string& runfile) {
  return value.empty() ? Runfile(runfile) : UserPath(value);
}

// The one agentix-*.whl that //host/python:wheel puts in the runfiles. Found
// by pattern: its name carries the version and the platform tag
// (host/python/BUILD.bazel), which are that package's to change.
absl::StatusOr<std::string> AgentixWheel() {
  const fs::path dir = fs::path(Runfile("host/python"));
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, "agentix-") && absl::EndsWith(name, ".whl")) {
      found.push_back(entry.path().string());
    }
  }
  if (found.size() != 1) {
    return absl::NotFoundError(absl::StrCat(
        "expected one agentix-*.whl in ", dir.string(), ", found ",
        found.size(), " (build //host/python:wheel, or pass --wheel)"));
  }
  return found.front();
}

}  // namespace

int main(int argc, char** raw_argv) {
  std::vector<std::string> storage;
  std::vector<char*> normalized =
      agentix::base::NormalizeFlagNames(argc, raw_argv, storage);
  char** argv = normalized.data();
  std::vector<std::string> wheelhouses =
      ExtractRepeated(argc, argv, kWheelhouseFlag);
  agentix::base::SetFlagsUsage(
      absl::StrCat(
          kUsage,
          "\n\nTurns the Python project in PATH (the directory holding "
          "pyproject.toml) into a self-contained /nix/runtime image: the "
          "tree, a deterministic tarball and an OCI layout (docs/BUNDLE.md). "
          "Prints each stage on stderr and a 'key: value' summary on stdout."
          "\n\n  --wheelhouse DIR  a directory of wheels pip may install "
          "from; repeatable."),
      absl::StrCat("agentix-bundle ", agentix::base::kAgentixVersion));
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() != 3 || std::string(positional[1]) != "build") {
    fmt::print(stderr, "usage: {}\n", kUsage);
    return 2;
  }

  agentix::bundler::BundleOptions options;
  options.project_dir = UserPath(positional[2]);
  while (options.project_dir.size() > 1 && options.project_dir.back() == '/') {
    options.project_dir.pop_back();
  }
  options.output_dir =
      absl::GetFlag(FLAGS_output).empty()
          ? (fs::path(options.project_dir) / "dist" / "agentix-bundle").string()
          : UserPath(absl::GetFlag(FLAGS_output));
  options.name = absl::GetFlag(FLAGS_name);
  options.tag = absl::GetFlag(FLAGS_tag);
  // --name NAME:TAG, as the original's `agentix build -n`.
  const size_t colon = options.name.find(':');
  if (colon != std::string::npos) {
    if (!options.tag.empty() || colon == 0 || colon + 1 == options.name.size()) {
      fmt::print(stderr,
                 "[bundler] error: --name {} must be NAME or NAME:TAG with "
                 "both sides non-empty (and then no --tag)\n",
                 options.name);
      return 2;
    }
    options.tag = options.name.substr(colon + 1);
    options.name.resize(colon);
  }
  for (const auto& dir : wheelhouses) {
    std::error_code ec;
    if (!fs::is_directory(UserPath(dir), ec)) {
      fmt::print(stderr, "[bundler] error: --wheelhouse {} is not a directory\n",
                 UserPath(dir));
      return 2;
    }
    options.wheelhouses.push_back(UserPath(dir));
  }
  options.wire = absl::GetFlag(FLAGS_wire);
  if (options.wire != "grpc" && options.wire != "socketio") {
    fmt::print(stderr, "[bundler] error: --wire must be grpc or socketio, not '{}'\n",
               options.wire);
    return 2;
  }
  options.sandboxd =
      FlagOr(absl::GetFlag(FLAGS_sandboxd), "sandbox/agentix-sandboxd");
  options.worker = FlagOr(absl::GetFlag(FLAGS_worker), "worker/agentix-worker");
  options.launcher = absl::GetFlag(FLAGS_launcher) == "none"
                         ? ""
                         : FlagOr(absl::GetFlag(FLAGS_launcher), "sandbox/agentix-launch");
  options.early_worker = absl::GetFlag(FLAGS_early_worker);
  if (absl::GetFlag(FLAGS_wheel).empty()) {
    absl::StatusOr<std::string> wheel = AgentixWheel();
    if (!wheel.ok()) {
      fmt::print(stderr, "[bundler] error: {}\n",
                 std::string(wheel.status().message()));
      return 2;
    }
    options.agentix_wheel = *wheel;
  } else {
    options.agentix_wheel = UserPath(absl::GetFlag(FLAGS_wheel));
  }
  options.closure_helper = Runfile("bundler/dist_closure.py");

  absl::StatusOr<agentix::bundler::BundleResult> result =
      agentix::bundler::BuildBundle(options);
  if (!result.ok()) {
    fmt::print(stderr, "[bundler] error: {}\n",
               std::string(result.status().message()));
    return 1;
  }
  // stdout: machine-readable summary, one "key: value" per line.
  fmt::print("tree: {}\ntarball: {}\nsha256: {}\ndigest: {}\noci: {}\n",
             result->tree, result->tarball, result->tarball_sha256,
             result->digest, result->oci_layout);
  return 0;
}
