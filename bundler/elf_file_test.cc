#include "bundler/elf_file.h"

#include <algorithm>
#include <fstream>

#include "bundler/test_util.h"
#include "testing/status_matchers.h"

namespace agentix::bundler {
namespace {

bool Contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

TEST_CASE("ReadElfDynamicInfo reads interpreter and DT_NEEDED of this test",
          "[bundler]") {
  REQUIRE_OK_AND_ASSIGN(ElfDynamicInfo info,
                        ReadElfDynamicInfo("/proc/self/exe"));
  CHECK(info.executable);
  CHECK(info.interpreter.find("ld-linux-x86-64.so.2") != std::string::npos);
  CHECK(Contains(info.needed, "libc.so.6"));
  CHECK(Contains(info.needed, "libstdc++.so.6"));
  CHECK_FALSE(info.is_static());
}

TEST_CASE("ReadElfDynamicInfo reads the soname of a shared library",
          "[bundler]") {
  REQUIRE_OK_AND_ASSIGN(
      ElfDynamicInfo info,
      ReadElfDynamicInfo("/usr/lib/x86_64-linux-gnu/libstdc++.so.6"));
  CHECK(info.soname == "libstdc++.so.6");
  CHECK_FALSE(info.executable);
  CHECK(Contains(info.needed, "libc.so.6"));
}

TEST_CASE("a static binary has no interpreter and needs nothing", "[bundler]") {
  REQUIRE_OK_AND_ASSIGN(ElfDynamicInfo info, ReadElfDynamicInfo("/bin/busybox"));
  CHECK(info.is_static());
}

TEST_CASE("non-ELF and truncated files are rejected", "[bundler]") {
  const std::string dir = testing::FreshDir("elf_file_test");
  const std::string text = dir + "/script.sh";
  std::ofstream(text) << "#!/bin/sh\necho hi\n";
  CHECK_FALSE(IsElfFile(text));
  absl::StatusOr<ElfDynamicInfo> info = ReadElfDynamicInfo(text);
  REQUIRE(info.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(info.status().message().find("not an ELF file") != absl::string_view::npos);

  // The first 64 bytes of a real ELF file: headers point past the end.
  std::ifstream in("/proc/self/exe", std::ios::binary);
  std::string head(64, '\0');
  in.read(head.data(), head.size());
  const std::string truncated = dir + "/truncated";
  std::ofstream(truncated, std::ios::binary) << head;
  CHECK(IsElfFile(truncated));
  CHECK(ReadElfDynamicInfo(truncated).status().code() ==
        absl::StatusCode::kInvalidArgument);

  CHECK(ReadElfDynamicInfo(dir + "/missing").status().code() ==
        absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace agentix::bundler
