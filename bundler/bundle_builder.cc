#include "bundler/bundle_builder.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/status_macros.h"
#include "bundler/archive.h"
#include "bundler/bootstrap_script.h"
#include "bundler/bytecode_pack.h"
#include "bundler/command.h"
#include "bundler/elf_file.h"
#include "bundler/file_tree.h"
#include "bundler/library_closure.h"
#include "bundler/module_hashes.h"
#include "bundler/oci_layout.h"
#include "bundler/pyproject.h"
#include "bundler/python_env.h"
#include "bundler/system_packages.h"

namespace agentix::bundler {
namespace {

namespace fs = std::filesystem;

// libc dlopens this one (thread cancellation, unwinding) without a
// DT_NEEDED entry anywhere.
constexpr const char* kDlopenedLibraries[] = {"libgcc_s.so.1"};

// Prints "[bundler] <stage>: <detail>, <seconds> s" when destroyed.
class Stage {
 public:
  explicit Stage(std::string name) : name_(std::move(name)), start_(absl::Now()) {
    fmt::print(stderr, "[bundler] {} ...\n", name_);
  }
  void Done(const std::string& detail) {
    fmt::print(stderr, "[bundler] {}: {}, {:.1f} s\n", name_, detail,
               absl::ToDoubleSeconds(absl::Now() - start_));
  }

 private:
  std::string name_;
  absl::Time start_;
};

std::string Sanitize(const std::string& text) {
  std::string out;
  for (char c : text) {
    out += (absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-') ? c : '-';
  }
  return out;
}

std::vector<std::string> ElfFilesUnder(const fs::path& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return files;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    if (it->is_symlink(ec) || !it->is_regular_file(ec)) continue;
    if (IsElfFile(it->path().string())) files.push_back(it->path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

uint64_t TreeBytes(const fs::path& dir) {
  uint64_t bytes = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    if (!it->is_symlink(ec) && it->is_regular_file(ec)) {
      bytes += it->file_size(ec);
    }
  }
  return bytes;
}

std::string Megabytes(uint64_t bytes) {
  return fmt::format("{:.1f} MB", static_cast<double>(bytes) / 1e6);
}

}  // namespace

static absl::StatusOr<BundleResult> BuildBundleStages(const BundleOptions& options) {
  const absl::Time started = absl::Now();
  BundleResult result;

  // -- pyproject ------------------------------------------------------------
  Stage pyproject_stage("pyproject");
  AGX_ASSIGN_OR_RETURN(ProjectSpec spec, LoadPyproject(options.project_dir));
  const std::string name =
      options.name.empty() ? DefaultBundleName(spec) : options.name;
  const std::string tag = !options.tag.empty()       ? options.tag
                          : !spec.version.empty()    ? spec.version
                                                     : "latest";
  // Every declared system package is checked before anything is written.
  std::map<std::string, std::vector<std::string>> package_executables;
  for (const std::string& package : spec.system_packages) {
    AGX_ASSIGN_OR_RETURN(package_executables[package],
                         PackageExecutables(package));
  }
  pyproject_stage.Done(fmt::format(
      "{} {} ({} dependencies, {} system packages)", name, tag,
      spec.dependencies.size(), spec.system_packages.size()));

  // Tools first, so a missing one fails before minutes of work.
  AGX_ASSIGN_OR_RETURN(std::string patchelf, FindOnPath(options.patchelf));
  for (const std::string& input :
       {options.sandboxd, options.worker, options.launcher, options.agentix_wheel,
        options.closure_helper, options.python, options.python_executable,
        options.busybox}) {
    if (!input.empty() && access(input.c_str(), R_OK) != 0) {
      return absl::NotFoundError(absl::StrCat(
          "bundle input ", input, " is missing; run tools/setup and build "
          "with `bazel run //bundler -- build PATH`"));
    }
  }

  const fs::path out = options.output_dir;
  const fs::path tree = out / "nix";
  const fs::path root = tree / "runtime";
  const fs::path work = out / ".work";
  for (const fs::path& stale : {tree, work, out / "oci", out / "manifest.json"}) {
    AGX_RETURN_IF_ERROR(RemoveTree(stale.string()));
  }
  std::error_code ec;
  fs::create_directories(root / "bin", ec);
  fs::create_directories(root / "lib", ec);
  fs::create_directories(work, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot create ", root.string(), ": ", ec.message()));
  }

  // -- binaries ---------------------------------------------------------------
  Stage binaries_stage("binaries");
  AGX_RETURN_IF_ERROR(
      CopyFileTo(options.sandboxd, (root / "bin/agentix-sandboxd").string()));
  AGX_RETURN_IF_ERROR(
      CopyFileTo(options.worker, (root / "bin/agentix-worker").string()));
  if (!options.launcher.empty()) {
    AGX_RETURN_IF_ERROR(
        CopyFileTo(options.launcher, (root / "bin/agentix-launch").string()));
  }
  // busybox-static: bootstrap.sh's shell, needing no library at all.
  AGX_RETURN_IF_ERROR(CopyFileTo(options.busybox, (root / "bin/busybox").string()));
  fs::create_symlink("busybox", root / "bin/sh", ec);
  AGX_RETURN_IF_ERROR(CopyFileTo(options.python_executable,
                                 (root / "python/bin/python3.11").string()));
  fs::create_symlink("python3.11", root / "python/bin/python3", ec);
  size_t system_binaries = 0;
  for (const std::string& package : spec.system_packages) {
    const std::vector<std::string>& executables = package_executables[package];
    for (const std::string& exe : executables) {
      const fs::path target = root / "bin" / fs::path(exe).filename();
      if (fs::exists(target, ec)) continue;  // ours win over a package's
      AGX_RETURN_IF_ERROR(CopyFileTo(exe, target.string()));
      ++system_binaries;
    }
  }
  binaries_stage.Done(fmt::format("agentix-sandboxd, agentix-worker, busybox, "
                                  "python3.11 + {} from {} system packages",
                                  system_binaries, spec.system_packages.size()));

  // -- stdlib -----------------------------------------------------------------
  Stage stdlib_stage("stdlib");
  AGX_ASSIGN_OR_RETURN(CopyStats stdlib,
                       StageStdlib(options.stdlib,
                                   (root / "python/lib/python3.11").string()));
  stdlib_stage.Done(fmt::format("{} files, {}", stdlib.files,
                                Megabytes(stdlib.bytes)));

  // -- venv -------------------------------------------------------------------
  Stage venv_stage("venv");
  VenvOptions venv;
  venv.python = options.python;
  venv.project_dir = options.project_dir;
  venv.work_dir = work.string();
  venv.output_dir = options.output_dir;
  venv.wheelhouses = options.wheelhouses;
  venv.path_dependencies = spec.path_dependencies;
  venv.agentix_wheel = options.agentix_wheel;
  venv.closure_helper = options.closure_helper;
  venv.project_name = spec.name;
  venv.runtime_venv = options.runtime_root + "/venv";
  venv.runtime_python = options.runtime_root + "/python/bin/python3.11";
  AGX_ASSIGN_OR_RETURN(VenvReport venv_report,
                       BuildVenv(venv, (root / "venv").string()));
  venv_stage.Done(fmt::format(
      "{} + agentix; from the build machine: {}", spec.name,
      venv_report.copied_from_system.empty()
          ? "nothing"
          : absl::StrJoin(venv_report.copied_from_system, ", ")));

  // -- bytecode ---------------------------------------------------------------
  // Without .pyc files every worker start would compile the stdlib and the
  // project again (the tree is read-only at run time, nothing is cached).
  Stage bytecode_stage("bytecode");
  size_t pycs = 0;
  for (const auto& [staged, runtime] :
       std::vector<std::pair<fs::path, std::string>>{
           {root / "python/lib/python3.11",
            options.runtime_root + "/python/lib/python3.11"},
           {root / "venv/lib/python3.11/site-packages",
            options.runtime_root + "/venv/lib/python3.11/site-packages"}}) {
    AGX_ASSIGN_OR_RETURN(size_t count, CompileBytecode(options.python,
                                                       staged.string(), runtime));
    pycs += count;
  }
  // The stdlib bytecode a worker's boot and first call import, in one file
  // the worker maps (bytecode_pack.h).
  AGX_ASSIGN_OR_RETURN(
      BytecodePackReport pack,
      WriteBytecodePack(options.python,
                        (root / "python/lib/python3.11").string()));
  bytecode_stage.Done(fmt::format(
      "{} .pyc files (unchecked-hash); {} stdlib modules packed ({} KiB)",
      pycs, pack.modules, pack.bytes / 1024));

  // -- libraries ------------------------------------------------------------
  Stage libraries_stage("libraries");
  std::vector<std::string> elf_roots = ElfFilesUnder(root / "bin");
  for (const auto& dir : {root / "python", root / "venv"}) {
    for (auto& file : ElfFilesUnder(dir)) elf_roots.push_back(std::move(file));
  }
  const std::vector<std::string> search_dirs =
      DefaultLibraryDirs(options.ld_so_conf);
  for (const char* extra : kDlopenedLibraries) {
    for (const auto& dir : search_dirs) {
      const std::string candidate = absl::StrCat(dir, "/", extra);
      if (fs::exists(candidate, ec)) {
        elf_roots.push_back(candidate);
        break;
      }
    }
  }
  AGX_ASSIGN_OR_RETURN(LibraryClosure closure,
                       ResolveLibraryClosure(elf_roots, search_dirs));
  if (closure.interpreter.empty()) {
    return absl::FailedPreconditionError(
        "no bundled executable names a program interpreter; cannot pick the "
        "dynamic loader to bundle");
  }
  uint64_t library_bytes = 0;
  auto add_library = [&](const std::string& source,
                         const std::string& file_name) -> absl::Status {
    const fs::path target = root / "lib" / file_name;
    if (fs::exists(target, ec)) return absl::OkStatus();
    AGX_RETURN_IF_ERROR(CopyFileTo(source, target.string()));
    library_bytes += fs::file_size(target, ec);
    return absl::OkStatus();
  };
  for (const ResolvedLibrary& library : closure.libraries) {
    AGX_RETURN_IF_ERROR(add_library(
        library.source, fs::path(library.name).filename().string()));
  }
  for (const char* extra : kDlopenedLibraries) {
    for (const auto& dir : search_dirs) {
      const std::string candidate = absl::StrCat(dir, "/", extra);
      if (fs::exists(candidate, ec)) {
        AGX_RETURN_IF_ERROR(add_library(candidate, extra));
        break;
      }
    }
  }
  AGX_RETURN_IF_ERROR(add_library(closure.interpreter, closure.interpreter_name));
  libraries_stage.Done(fmt::format("{} libraries + {}, {}",
                                   closure.libraries.size(),
                                   closure.interpreter_name,
                                   Megabytes(library_bytes)));

  // -- patch ----------------------------------------------------------------
  // Executables get the bundle's loader and DT_RPATH (not RUNPATH: RPATH of
  // the executable also applies to libraries that extension modules dlopen).
  // Libraries and extension modules that carry their own search path get
  // ours instead, so none of them reaches into the task image.
  Stage patch_stage("patch");
  const std::string lib_dir = options.runtime_root + "/lib";
  const std::string loader = lib_dir + "/" + closure.interpreter_name;
  size_t patched = 0;
  std::vector<std::string> to_patch = ElfFilesUnder(root);
  for (const std::string& file : to_patch) {
    AGX_ASSIGN_OR_RETURN(ElfDynamicInfo info, ReadElfDynamicInfo(file));
    if (fs::path(file).filename() == closure.interpreter_name) continue;
    std::vector<std::string> argv = {patchelf};
    if (!info.interpreter.empty()) {
      argv.insert(argv.end(), {"--set-interpreter", loader, "--force-rpath",
                               "--set-rpath", lib_dir});
    } else if (!info.rpath.empty() || !info.runpath.empty()) {
      argv.insert(argv.end(), {"--force-rpath", "--set-rpath", lib_dir});
    } else {
      continue;
    }
    argv.push_back(file);
    fs::permissions(file, fs::perms::owner_write, fs::perm_options::add, ec);
    AGX_RETURN_IF_ERROR(RunCommandOrError(argv).status());
    ++patched;
  }
  patch_stage.Done(fmt::format("{} ELF files point at {}", patched, loader));

  // -- bootstrap, digest, manifest ------------------------------------------
  Stage manifest_stage("manifest");
  AGX_RETURN_IF_ERROR(WriteFile((root / "bootstrap.sh").string(),
                                BootstrapScript(options.runtime_root, options.wire,
                                                options.early_worker),
                                /*executable=*/true));
  AGX_ASSIGN_OR_RETURN(std::string tree_digest, TreeDigest(tree.string()));
  result.digest = "sha256:" + tree_digest;
  nlohmann::json manifest = {
      {"schema_version", 1},
      {"format", "agentix-bundle"},
      {"name", name},
      {"tag", tag},
      {"platform", "linux/amd64"},
      {"python", "3.11"},
      {"digest", result.digest},
      {"entrypoint", options.runtime_root + "/bootstrap.sh"},
      {"runtime_env", {{"PATH", RuntimePath(options.runtime_root)}}},
      {"system_packages", spec.system_packages},
  };
  // The project's own modules (and its local path dependencies'), so the
  // host can tell when its copy of a module differs from the bundle's.
  std::vector<std::string> own_dists = {spec.name};
  for (const std::string& dep : spec.path_dependencies) {
    absl::StatusOr<ProjectSpec> dep_spec = LoadPyproject(dep);
    if (dep_spec.ok() && !dep_spec->name.empty()) own_dists.push_back(dep_spec->name);
  }
  AGX_ASSIGN_OR_RETURN(
      auto module_hashes,
      ModuleHashes((root / "venv/lib/python3.11/site-packages").string(),
                   own_dists));
  manifest["modules"] = module_hashes;
  const std::string manifest_text = manifest.dump(2) + "\n";
  AGX_RETURN_IF_ERROR(WriteFile((out / "manifest.json").string(), manifest_text));
  result.tree_bytes = TreeBytes(tree);
  manifest_stage.Done(fmt::format("{}, tree {}, {} module hashes",
                                  result.digest, Megabytes(result.tree_bytes),
                                  module_hashes.size()));

  // -- tarball ----------------------------------------------------------------
  Stage tar_stage("tarball");
  AGX_ASSIGN_OR_RETURN(std::vector<TarEntry> entries,
                       CollectTree(tree.string(), "nix"));
  std::vector<TarEntry> layer_entries = entries;
  TarEntry manifest_entry;
  manifest_entry.path = "manifest.json";
  manifest_entry.content = manifest_text;
  manifest_entry.content_is_inline = true;
  entries.push_back(manifest_entry);
  result.tarball =
      (out / absl::StrCat(Sanitize(name), "-", Sanitize(tag), ".bundle.tar"))
          .string();
  AGX_RETURN_IF_ERROR(WriteTar(entries, result.tarball));
  AGX_ASSIGN_OR_RETURN(result.tarball_sha256, Sha256File(result.tarball));
  tar_stage.Done(fmt::format("{} ({} entries), sha256 {}", result.tarball,
                             entries.size(), result.tarball_sha256));

  // -- OCI layout -------------------------------------------------------------
  // The layer is nix/ plus the mount points a container needs (/tmp for
  // the worker's logs, /run/agentix for a bind-mounted socket dir).
  Stage oci_stage("oci");
  for (const auto& [path, mode] :
       std::vector<std::pair<std::string, int>>{
           {"tmp", 01777}, {"run", 0755}, {"run/agentix", 0755}}) {
    TarEntry dir;
    dir.path = path;
    dir.type = TarEntry::Type::kDirectory;
    dir.directory_mode = mode;
    layer_entries.push_back(dir);
  }
  const std::string layer = (work / "layer.tar").string();
  AGX_RETURN_IF_ERROR(WriteTar(layer_entries, layer));
  OciImageOptions oci;
  oci.ref_name = tag;
  oci.entrypoint = {options.runtime_root + "/bootstrap.sh"};
  oci.env = {"PATH=" + RuntimePath(options.runtime_root)};
  oci.labels = {{"dev.agentix.bundle.name", name},
                {"dev.agentix.bundle.digest", result.digest}};
  result.oci_layout = (out / "oci").string();
  AGX_ASSIGN_OR_RETURN(OciImage image,
                       WriteOciLayout(layer, oci, result.oci_layout));
  result.oci_manifest_digest = image.manifest_digest;
  oci_stage.Done(fmt::format("{}:{} manifest {}", result.oci_layout, tag,
                             image.manifest_digest));

  AGX_RETURN_IF_ERROR(RemoveTree(work.string()));
  result.tree = tree.string();
  fmt::print(stderr, "[bundler] done in {:.1f} s\n",
             absl::ToDoubleSeconds(absl::Now() - started));
  return result;
}

absl::StatusOr<BundleResult> BuildBundle(const BundleOptions& options) {
  absl::StatusOr<BundleResult> result = BuildBundleStages(options);
  if (!result.ok()) {
    // No half-built tree may be mistaken for a bundle.
    const fs::path out = options.output_dir;
    for (const fs::path& partial : {out / "nix", out / ".work", out / "oci"}) {
      (void)RemoveTree(partial.string());
    }
    std::error_code ec;
    if (fs::is_directory(out, ec) && fs::is_empty(out, ec)) fs::remove(out, ec);
  }
  return result;
}

}  // namespace agentix::bundler
