#include "bundler/system_packages.h"

#include <unistd.h>

#include <filesystem>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "bundler/command.h"

namespace agentix::bundler {
namespace {

namespace fs = std::filesystem;

constexpr absl::string_view kBinDirs[] = {"/usr/bin/", "/bin/", "/usr/sbin/",
                                          "/sbin/"};

bool ValidPackageName(const std::string& name) {
  if (name.empty()) return false;
  for (char c : name) {
    if (!(absl::ascii_isalnum(c) || c == '-' || c == '+' || c == '.' ||
          c == ':')) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::vector<std::string> BinaryPathsInListing(absl::string_view listing) {
  std::vector<std::string> paths;
  std::set<std::string> names;
  for (absl::string_view line : absl::StrSplit(listing, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    for (absl::string_view dir : kBinDirs) {
      if (!absl::StartsWith(line, dir)) continue;
      absl::string_view name = line.substr(dir.size());
      if (name.empty() || absl::StrContains(name, '/')) continue;
      if (names.insert(std::string(name)).second) {
        paths.emplace_back(line);
      }
    }
  }
  return paths;
}

absl::StatusOr<std::vector<std::string>> PackageExecutables(
    const std::string& package) {
  if (!ValidPackageName(package)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "system package '", package,
        "' is not a valid Debian package name; list package names (not "
        "commands) in [tool.agentix] system-packages"));
  }
  AGX_ASSIGN_OR_RETURN(
      CommandResult status,
      RunCommand({"dpkg-query", "-W", "-f=${Status}", package}));
  if (!status.ok() || !absl::StrContains(status.out, "install ok installed")) {
    AGX_ASSIGN_OR_RETURN(CommandResult known,
                         RunCommand({"apt-cache", "show", package}));
    if (!known.ok() || known.out.empty()) {
      return absl::NotFoundError(absl::StrCat(
          "system package '", package,
          "' is not a Debian package known to apt; check the name in "
          "[tool.agentix] system-packages (`apt-cache search ", package,
          "`; run `apt-get update` if the package lists are empty)"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "system package '", package,
        "' is not installed on the build machine; the bundler copies its "
        "binaries from the installed package: run `apt-get install -y ",
        package, "` (or add it to tools/setup) and build again"));
  }
  AGX_ASSIGN_OR_RETURN(CommandResult listing,
                       RunCommandOrError({"dpkg", "-L", package}));
  std::vector<std::string> executables;
  for (const std::string& path : BinaryPathsInListing(listing.out)) {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) continue;  // follows symlinks
    if (access(path.c_str(), X_OK) != 0) continue;
    executables.push_back(path);
  }
  if (executables.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "system package '", package,
        "' installs no executables in /usr/bin, /bin, /usr/sbin or /sbin; "
        "system-packages are for command-line tools (libraries are found "
        "from the binaries that need them)"));
  }
  return executables;
}

}  // namespace agentix::bundler
