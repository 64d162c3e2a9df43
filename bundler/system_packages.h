// Declared system binaries ([tool.agentix] system-packages) come from the
// Debian packages installed on the build machine: their executables are
// copied into bin/ and their library closure into lib/.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace agentix::bundler {

// From a `dpkg -L` listing, the paths of files in /usr/bin, /bin, /usr/sbin
// or /sbin (one level, no directories), in listing order, duplicates by base
// name dropped (merged-/usr lists a binary under both /bin and /usr/bin).
std::vector<std::string> BinaryPathsInListing(absl::string_view listing);

// The executables package `package` installs, as existing paths on this
// machine. Errors (kNotFound / kFailedPrecondition) say what to do: the name
// is not a Debian package known to apt; it is known but not installed (run
// apt-get install); it installs no executables.
absl::StatusOr<std::vector<std::string>> PackageExecutables(
    const std::string& package);

}  // namespace agentix::bundler
