// The shared-library closure of a set of ELF files, computed from their
// DT_NEEDED entries the way the dynamic loader would resolve them on the
// build machine (RPATH/$ORIGIN, then the ld.so.conf directories, then the
// default directories). The bundle copies exactly these files into
// nix/runtime/lib so that nothing is loaded from the task image.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace agentix::bundler {

// The directories searched for a soname: those of `ld_so_conf` (with its
// `include` globs followed), then the Debian/x86_64 defaults. Duplicates
// and directories that do not exist are dropped. Never fails: an
// unreadable config only loses its entries.
std::vector<std::string> DefaultLibraryDirs(
    const std::string& ld_so_conf = "/etc/ld.so.conf");

struct ResolvedLibrary {
  std::string name;    // the DT_NEEDED name, i.e. the file name in lib/
  std::string source;  // canonical path of the file on the build machine
};

struct LibraryClosure {
  // Every library needed directly or transitively, sorted by name, each once.
  std::vector<ResolvedLibrary> libraries;
  // Canonical path of the program interpreter named by the executables
  // (ld-linux-x86-64.so.2), or empty when none of the roots has one.
  std::string interpreter;
  std::string interpreter_name;  // its base name, e.g. ld-linux-x86-64.so.2
};

// Resolves the closure of `roots` (paths of ELF files; non-ELF files are
// skipped). `search_dirs` are tried in order after the object's own
// RPATH/RUNPATH. Errors: kNotFound naming the missing library and the file
// that needs it; kInvalidArgument for a malformed ELF file; kFailedPrecondition
// when the roots name different program interpreters.
absl::StatusOr<LibraryClosure> ResolveLibraryClosure(
    const std::vector<std::string>& roots,
    const std::vector<std::string>& search_dirs);

}  // namespace agentix::bundler
