#include "bundler/archive.h"

#include <archive.h>
#include <archive_entry.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"

#include "bundler/test_util.h"
#include "testing/status_matchers.h"

namespace agentix::bundler {
namespace {

namespace fs = std::filesystem;

void MakeTree(const std::string& root) {
  fs::create_directories(root + "/runtime/bin");
  fs::create_directories(root + "/runtime/lib");
  std::ofstream(root + "/runtime/bin/tool") << "#!/bin/sh\necho tool\n";
  fs::permissions(root + "/runtime/bin/tool", fs::perms(0700));
  std::ofstream(root + "/runtime/lib/data.txt") << "data";
  fs::create_symlink("tool", root + "/runtime/bin/alias");
}

// path -> (type, mode, mtime, uid, symlink target or size) of a tar.
std::map<std::string, std::string> ListTar(const std::string& path) {
  std::map<std::string, std::string> out;
  struct archive* a = archive_read_new();
  archive_read_support_format_all(a);
  REQUIRE(archive_read_open_filename(a, path.c_str(), 1 << 16) == ARCHIVE_OK);
  archive_entry* entry;
  while (archive_read_next_header(a, &entry) == ARCHIVE_OK) {
    const char* link = archive_entry_symlink(entry);
    out[archive_entry_pathname(entry)] = absl::StrCat(
        archive_entry_filetype(entry), " ", archive_entry_perm(entry), " ",
        archive_entry_mtime(entry), " ", archive_entry_uid(entry), " ",
        link != nullptr ? link : std::to_string(archive_entry_size(entry)));
  }
  archive_read_free(a);
  return out;
}

TEST_CASE("Sha256Hex matches the FIPS 180-2 test vector", "[bundler]") {
  CHECK(Sha256Hex("abc") ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_CASE("the same tree gives the same tar bytes, whatever mtimes and modes",
          "[bundler]") {
  const std::string dir = testing::FreshDir("archive_determinism");
  MakeTree(dir + "/a");
  MakeTree(dir + "/b");
  fs::last_write_time(dir + "/b/runtime/lib/data.txt",
                      fs::file_time_type::clock::now() - std::chrono::hours(5));
  fs::permissions(dir + "/b/runtime/lib/data.txt", fs::perms(0600));
  REQUIRE_OK_AND_ASSIGN(auto a, CollectTree(dir + "/a", "nix"));
  REQUIRE_OK_AND_ASSIGN(auto b, CollectTree(dir + "/b", "nix"));
  std::reverse(b.begin(), b.end());  // WriteTar sorts
  REQUIRE_OK(WriteTar(a, dir + "/a.tar"));
  REQUIRE_OK(WriteTar(b, dir + "/b.tar"));
  REQUIRE_OK_AND_ASSIGN(std::string sha_a, Sha256File(dir + "/a.tar"));
  REQUIRE_OK_AND_ASSIGN(std::string sha_b, Sha256File(dir + "/b.tar"));
  CHECK(sha_a == sha_b);
  CHECK_FALSE(fs::exists(dir + "/a.tar.partial"));

  std::map<std::string, std::string> entries = ListTar(dir + "/a.tar");
  CHECK(entries.size() == 7);  // nix, runtime, bin, lib, 3 leaves
  const std::string mtime = std::to_string(kArchiveMtime);
  CHECK(entries["nix/runtime/bin/tool"] ==
        absl::StrCat(AE_IFREG, " ", 0755, " ", mtime, " 0 20"));
  CHECK(entries["nix/runtime/lib/data.txt"] ==
        absl::StrCat(AE_IFREG, " ", 0644, " ", mtime, " 0 4"));
  CHECK(entries["nix/runtime/bin/alias"] ==
        absl::StrCat(AE_IFLNK, " ", 0777, " ", mtime, " 0 tool"));
}

TEST_CASE("inline entries and directory modes", "[bundler]") {
  const std::string dir = testing::FreshDir("archive_inline");
  TarEntry manifest;
  manifest.path = "manifest.json";
  manifest.content = "{}";
  manifest.content_is_inline = true;
  TarEntry tmp;
  tmp.path = "tmp";
  tmp.type = TarEntry::Type::kDirectory;
  tmp.directory_mode = 01777;
  REQUIRE_OK(WriteTar({manifest, tmp}, dir + "/x.tar"));
  std::map<std::string, std::string> entries = ListTar(dir + "/x.tar");
  CHECK(entries["manifest.json"].substr(entries["manifest.json"].size() - 2) ==
        " 2");
  CHECK(entries["tmp/"].find(absl::StrCat(" ", 01777, " ")) != std::string::npos);
}

TEST_CASE("TreeDigest changes with content and mode, not with mtime",
          "[bundler]") {
  const std::string dir = testing::FreshDir("archive_digest");
  MakeTree(dir + "/t");
  REQUIRE_OK_AND_ASSIGN(std::string first, TreeDigest(dir + "/t"));
  fs::last_write_time(dir + "/t/runtime/lib/data.txt",
                      fs::file_time_type::clock::now() - std::chrono::hours(1));
  REQUIRE_OK_AND_ASSIGN(std::string same, TreeDigest(dir + "/t"));
  CHECK(first == same);
  fs::permissions(dir + "/t/runtime/lib/data.txt", fs::perms(0755));
  REQUIRE_OK_AND_ASSIGN(std::string mode, TreeDigest(dir + "/t"));
  CHECK(mode != first);
  std::ofstream(dir + "/t/runtime/lib/data.txt") << "other";
  REQUIRE_OK_AND_ASSIGN(std::string content, TreeDigest(dir + "/t"));
  CHECK(content != mode);
}

TEST_CASE("CollectTree of a missing directory is kNotFound", "[bundler]") {
  CHECK(CollectTree("/nonexistent/tree", "nix").status().code() ==
        absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace agentix::bundler
