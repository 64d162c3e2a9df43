#include "bundler/library_closure.h"

#include <glob.h>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "bundler/elf_file.h"

namespace agentix::bundler {
namespace {

namespace fs = std::filesystem;

constexpr const char* kDefaultDirs[] = {
    "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
    "/lib64",                "/usr/lib64",
    "/lib",                  "/usr/lib",
};

void ReadLdSoConf(const std::string& path, int depth,
                  std::vector<std::string>& dirs) {
  if (depth > 8) return;  // include loops
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view view = line;
    size_t hash = view.find('#');
    if (hash != absl::string_view::npos) view = view.substr(0, hash);
    view = absl::StripAsciiWhitespace(view);
    if (view.empty()) continue;
    if (absl::ConsumePrefix(&view, "include")) {
      std::string pattern(absl::StripAsciiWhitespace(view));
      if (!pattern.empty() && pattern.front() != '/') {
        pattern = (fs::path(path).parent_path() / pattern).string();
      }
      glob_t matches;
      if (glob(pattern.c_str(), 0, nullptr, &matches) == 0) {
        for (size_t i = 0; i < matches.gl_pathc; ++i) {
          ReadLdSoConf(matches.gl_pathv[i], depth + 1, dirs);
        }
      }
      globfree(&matches);
    } else {
      dirs.emplace_back(view);
    }
  }
}

std::string Canonical(const std::string& path) {
  std::error_code ec;
  fs::path canonical = fs::canonical(path, ec);
  return ec ? path : canonical.string();
}

// A candidate is usable when it is an ELF64 file (a 32-bit library of the
// same name in /usr/lib must not be picked).
bool Usable(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  return ReadElfDynamicInfo(path).ok();
}

std::string ExpandOrigin(const std::string& entry, const std::string& origin) {
  return absl::StrReplaceAll(entry,
                             {{"$ORIGIN", origin}, {"${ORIGIN}", origin}});
}

}  // namespace

std::vector<std::string> DefaultLibraryDirs(const std::string& ld_so_conf) {
  std::vector<std::string> candidates;
  ReadLdSoConf(ld_so_conf, 0, candidates);
  for (const char* dir : kDefaultDirs) candidates.emplace_back(dir);
  std::vector<std::string> dirs;
  std::set<std::string> seen;
  for (const auto& dir : candidates) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;
    if (seen.insert(dir).second) dirs.push_back(dir);
  }
  return dirs;
}

absl::StatusOr<LibraryClosure> ResolveLibraryClosure(
    const std::vector<std::string>& roots,
    const std::vector<std::string>& search_dirs) {
  LibraryClosure closure;
  std::map<std::string, std::string> found;  // name -> canonical source
  std::set<std::string> visited;             // canonical paths parsed
  // (file to parse, the path whose directory is its $ORIGIN)
  std::deque<std::string> queue;
  for (const auto& root : roots) {
    if (IsElfFile(root)) queue.push_back(root);
  }

  while (!queue.empty()) {
    const std::string file = queue.front();
    queue.pop_front();
    if (!visited.insert(Canonical(file)).second) continue;
    absl::StatusOr<ElfDynamicInfo> info = ReadElfDynamicInfo(file);
    if (!info.ok()) return info.status();

    if (!info->interpreter.empty()) {
      std::string interpreter = Canonical(info->interpreter);
      std::string name = fs::path(info->interpreter).filename().string();
      if (closure.interpreter.empty()) {
        closure.interpreter = interpreter;
        closure.interpreter_name = name;
      } else if (closure.interpreter_name != name) {
        return absl::FailedPreconditionError(
            absl::StrCat(file, " uses program interpreter ", info->interpreter,
                         ", others use ", closure.interpreter_name));
      }
    }

    // $ORIGIN is the directory of the file itself, after symlinks
    // (/proc/self/exe, bazel-bin's runfiles links).
    const std::string origin = fs::path(Canonical(file)).parent_path().string();
    std::vector<std::string> dirs;
    // The loader ignores DT_RPATH when DT_RUNPATH is present.
    if (info->runpath.empty()) {
      for (const auto& d : info->rpath) dirs.push_back(ExpandOrigin(d, origin));
    }
    for (const auto& d : info->runpath) dirs.push_back(ExpandOrigin(d, origin));
    dirs.insert(dirs.end(), search_dirs.begin(), search_dirs.end());

    for (const auto& name : info->needed) {
      if (found.count(name) > 0) continue;
      std::string source;
      if (name.find('/') != std::string::npos) {
        if (Usable(name)) source = name;
      } else {
        for (const auto& dir : dirs) {
          std::string candidate = absl::StrCat(dir, "/", name);
          if (Usable(candidate)) {
            source = candidate;
            break;
          }
        }
      }
      if (source.empty()) {
        return absl::NotFoundError(absl::StrCat(
            "shared library '", name, "' needed by ", file,
            " was not found in ", absl::StrJoin(dirs, ":"),
            "; install the Debian package that ships it (apt-file search ",
            name, ")"));
      }
      found[name] = Canonical(source);
      queue.push_back(source);
    }
  }

  for (const auto& [name, source] : found) {
    closure.libraries.push_back({name, source});
  }
  return closure;
}

}  // namespace agentix::bundler
