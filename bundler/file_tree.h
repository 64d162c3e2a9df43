// Filesystem helpers for staging the bundle tree: filtered recursive copies
// that keep relative symlinks and dereference absolute ones (an absolute
// target would point into the task image at run time), and small file I/O.
#pragma once

#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace agentix::bundler {

struct CopyStats {
  size_t files = 0;
  size_t symlinks = 0;
  size_t skipped = 0;  // excluded by the filter, or dangling absolute links
  uint64_t bytes = 0;
};

// Copies `src` into `dst` (created). `exclude(relative_path, is_directory)`
// returning true skips an entry (and a directory's whole subtree). Relative
// symlinks are recreated as they are; absolute symlinks are replaced by a
// copy of their target, or skipped when it does not exist.
absl::StatusOr<CopyStats> CopyTree(
    const std::string& src, const std::string& dst,
    const std::function<bool(const std::string&, bool)>& exclude);

// Copies one file (following symlinks) to `dst`, creating parent
// directories, and makes it writable by its owner (patchelf edits it later).
absl::Status CopyFileTo(const std::string& src, const std::string& dst);

absl::StatusOr<std::string> ReadFile(const std::string& path);
absl::Status WriteFile(const std::string& path, const std::string& content,
                       bool executable = false);

// Removes `path` recursively if it exists.
absl::Status RemoveTree(const std::string& path);

}  // namespace agentix::bundler
