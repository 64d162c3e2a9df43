// Reads what the dynamic loader reads from an ELF64 file: its program
// interpreter (PT_INTERP), the libraries it needs (DT_NEEDED), its soname and
// its search paths (DT_RPATH / DT_RUNPATH). Enough to compute a shared-library
// closure without running the binary (ldd would run the build machine's
// loader, and cannot look at a file meant for another root).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace agentix::bundler {

struct ElfDynamicInfo {
  bool executable = false;       // ET_EXEC, or ET_DYN with a PT_INTERP
  std::string interpreter;       // PT_INTERP, e.g. /lib64/ld-linux-x86-64.so.2
  std::string soname;            // DT_SONAME, or empty
  std::vector<std::string> needed;   // DT_NEEDED in file order
  std::vector<std::string> rpath;    // DT_RPATH entries, ':'-split
  std::vector<std::string> runpath;  // DT_RUNPATH entries, ':'-split
  bool is_static() const { return interpreter.empty() && needed.empty(); }
};

// True when `path` is a regular file starting with the ELF magic. Never
// fails: unreadable files are "not ELF".
bool IsElfFile(const std::string& path);

// Parses `path`. Errors: kInvalidArgument for a file that is not a
// little-endian ELF64 or whose headers point outside the file, kNotFound /
// kPermissionDenied when it cannot be read.
absl::StatusOr<ElfDynamicInfo> ReadElfDynamicInfo(const std::string& path);

}  // namespace agentix::bundler
