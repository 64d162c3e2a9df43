#include "bundler/system_packages.h"

#include <algorithm>

#include "testing/status_matchers.h"

namespace agentix::bundler {
namespace {

TEST_CASE("BinaryPathsInListing keeps top-level bin entries once", "[bundler]") {
  const char* listing =
      "/.\n/usr\n/usr/bin\n/usr/bin/rg\n/usr/share/doc/rg/README\n"
      "/bin/rg\n/usr/sbin/rgd\n/usr/bin/sub/dir\n/usr/lib/x/bin/tool\n";
  CHECK(BinaryPathsInListing(listing) ==
        std::vector<std::string>{"/usr/bin/rg", "/usr/sbin/rgd"});
}

TEST_CASE("PackageExecutables of an installed package", "[bundler]") {
  REQUIRE_OK_AND_ASSIGN(std::vector<std::string> exes,
                        PackageExecutables("coreutils"));
  CHECK(std::any_of(exes.begin(), exes.end(), [](const std::string& p) {
    return p == "/bin/ls" || p == "/usr/bin/ls";
  }));
}

TEST_CASE("PackageExecutables errors say what to do", "[bundler]") {
  absl::StatusOr<std::vector<std::string>> unknown =
      PackageExecutables("agentix-no-such-package");
  REQUIRE(unknown.status().code() == absl::StatusCode::kNotFound);
  CHECK(unknown.status().message().find(
            "system package 'agentix-no-such-package' is not a Debian package "
            "known to apt") != absl::string_view::npos);

  CHECK(PackageExecutables("rm -rf").status().code() ==
        absl::StatusCode::kInvalidArgument);
  // A library package: installed, but nothing to run.
  absl::StatusOr<std::vector<std::string>> library =
      PackageExecutables("libc6");
  REQUIRE(library.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(library.status().message().find("installs no executables") !=
        absl::string_view::npos);
}

}  // namespace
}  // namespace agentix::bundler
