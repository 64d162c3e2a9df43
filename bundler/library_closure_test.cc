#include "bundler/library_closure.h"

#include <filesystem>
#include <fstream>
#include <set>

#include "bundler/test_util.h"
#include "testing/status_matchers.h"

namespace agentix::bundler {
namespace {

TEST_CASE("the closure of this test binary has libc, libstdc++ and the loader",
          "[bundler]") {
  REQUIRE_OK_AND_ASSIGN(
      LibraryClosure closure,
      ResolveLibraryClosure({"/proc/self/exe"}, DefaultLibraryDirs()));
  std::set<std::string> names;
  for (const auto& lib : closure.libraries) {
    names.insert(lib.name);
    CHECK(std::filesystem::path(lib.source).is_absolute());
  }
  CHECK(names.count("libc.so.6") == 1);
  CHECK(names.count("libstdc++.so.6") == 1);
  CHECK(names.count("libm.so.6") == 1);  // needed by libstdc++, transitively
  CHECK(closure.interpreter_name == "ld-linux-x86-64.so.2");
  CHECK(std::filesystem::exists(closure.interpreter));
}

TEST_CASE("a library found nowhere is an error naming it and its user",
          "[bundler]") {
  absl::StatusOr<LibraryClosure> closure =
      ResolveLibraryClosure({"/proc/self/exe"}, {"/nonexistent"});
  REQUIRE(closure.status().code() == absl::StatusCode::kNotFound);
  CHECK(closure.status().message().find("needed by /proc/self/exe") !=
        absl::string_view::npos);
}

TEST_CASE("non-ELF roots are skipped", "[bundler]") {
  const std::string dir = testing::FreshDir("closure_non_elf");
  std::ofstream(dir + "/notes.txt") << "text";
  REQUIRE_OK_AND_ASSIGN(LibraryClosure closure,
                        ResolveLibraryClosure({dir + "/notes.txt"}, {}));
  CHECK(closure.libraries.empty());
  CHECK(closure.interpreter.empty());
}

TEST_CASE("DefaultLibraryDirs follows ld.so.conf includes, then defaults",
          "[bundler]") {
  const std::string dir = testing::FreshDir("ld_so_conf");
  std::filesystem::create_directories(dir + "/conf.d");
  std::filesystem::create_directories(dir + "/libs-a");
  std::filesystem::create_directories(dir + "/libs-b");
  std::ofstream(dir + "/ld.so.conf")
      << "# comment\n" << dir << "/libs-a\ninclude " << dir
      << "/conf.d/*.conf\n" << dir << "/does-not-exist\n";
  std::ofstream(dir + "/conf.d/b.conf") << dir << "/libs-b  # trailing\n";
  std::vector<std::string> dirs = DefaultLibraryDirs(dir + "/ld.so.conf");
  REQUIRE(dirs.size() >= 3);
  CHECK(dirs[0] == dir + "/libs-a");
  CHECK(dirs[1] == dir + "/libs-b");
  CHECK(std::find(dirs.begin(), dirs.end(), "/usr/lib/x86_64-linux-gnu") !=
        dirs.end());
  CHECK(std::find(dirs.begin(), dirs.end(), dir + "/does-not-exist") ==
        dirs.end());
}

}  // namespace
}  // namespace agentix::bundler
