#include "bundler/file_tree.h"

#include <filesystem>
#include <fstream>

#include "bundler/test_util.h"
#include "testing/status_matchers.h"

namespace agentix::bundler {
namespace {

namespace fs = std::filesystem;

TEST_CASE("CopyTree keeps relative links, resolves absolute ones, filters",
          "[bundler]") {
  const std::string dir = testing::FreshDir("file_tree");
  const std::string src = dir + "/src";
  fs::create_directories(src + "/pkg/__pycache__");
  fs::create_directories(src + "/skip");
  std::ofstream(src + "/pkg/a.py") << "a = 1\n";
  std::ofstream(src + "/pkg/__pycache__/a.pyc") << "x";
  std::ofstream(src + "/skip/b.py") << "b";
  std::ofstream(dir + "/outside.cfg") << "outside";
  fs::create_symlink("pkg/a.py", src + "/relative.py");
  fs::create_symlink(dir + "/outside.cfg", src + "/absolute.cfg");
  fs::create_symlink(dir + "/missing", src + "/dangling");

  REQUIRE_OK_AND_ASSIGN(
      CopyStats stats,
      CopyTree(src, dir + "/dst", [](const std::string& rel, bool is_dir) {
        return is_dir && (rel == "skip" ||
                          fs::path(rel).filename() == "__pycache__");
      }));
  const std::string dst = dir + "/dst";
  CHECK(fs::exists(dst + "/pkg/a.py"));
  CHECK_FALSE(fs::exists(dst + "/pkg/__pycache__"));
  CHECK_FALSE(fs::exists(dst + "/skip"));
  REQUIRE(fs::is_symlink(dst + "/relative.py"));
  CHECK(fs::read_symlink(dst + "/relative.py") == "pkg/a.py");
  CHECK_FALSE(fs::is_symlink(dst + "/absolute.cfg"));
  REQUIRE_OK_AND_ASSIGN(std::string copied, ReadFile(dst + "/absolute.cfg"));
  CHECK(copied == "outside");
  CHECK_FALSE(fs::exists(fs::symlink_status(dst + "/dangling")));
  CHECK(stats.files == 2);
  CHECK(stats.symlinks == 1);
  CHECK(stats.skipped == 3);  // skip/, __pycache__/, the dangling link
}

TEST_CASE("WriteFile sets the mode; CopyFileTo makes parents writable",
          "[bundler]") {
  const std::string dir = testing::FreshDir("file_tree_io");
  REQUIRE_OK(WriteFile(dir + "/run.sh", "#!/bin/sh\n", /*executable=*/true));
  CHECK((fs::status(dir + "/run.sh").permissions() & fs::perms::owner_exec) !=
        fs::perms::none);
  fs::permissions(dir + "/run.sh", fs::perms(0555));
  REQUIRE_OK(CopyFileTo(dir + "/run.sh", dir + "/a/b/copy.sh"));
  CHECK((fs::status(dir + "/a/b/copy.sh").permissions() &
         fs::perms::owner_write) != fs::perms::none);
  REQUIRE_OK(RemoveTree(dir + "/a"));
  CHECK_FALSE(fs::exists(dir + "/a"));
  CHECK(ReadFile(dir + "/missing").status().code() ==
        absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace agentix::bundler
