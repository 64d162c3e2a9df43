#include "bundler/module_hashes.h"

#include <filesystem>
#include <fstream>

#include <catch2/catch.hpp>

#include "bundler/archive.h"
#include "bundler/test_util.h"

namespace agentix::bundler {
namespace {

namespace fs = std::filesystem;

void Write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

TEST_CASE("Distribution names compare as PEP 503 says", "[bundler]") {
  REQUIRE(NormalizeDistName("Hello-Agentix") == "hello_agentix");
  REQUIRE(NormalizeDistName("hello.__agentix") == "hello_agentix");
}

TEST_CASE("A distribution's modules are hashed from its RECORD", "[bundler]") {
  const fs::path site = testing::FreshDir("module_hashes");
  Write(site / "hello_agentix/__init__.py", "");
  Write(site / "hello_agentix/tools.py", "def add(a, b):\n    return a + b\n");
  Write(site / "hello_agentix/data.txt", "x");
  Write(site / "other/mod.py", "other = 1\n");
  Write(site / "hello_agentix-0.1.0.dist-info/RECORD",
        "hello_agentix/__init__.py,sha256=x,0\n"
        "hello_agentix/tools.py,sha256=y,30\n"
        "hello_agentix/data.txt,,\n"
        "hello_agentix/__pycache__/tools.cpython-311.pyc,,\n"
        "../../../bin/tool.py,,\n"
        "hello_agentix-0.1.0.dist-info/RECORD,,\n");
  auto hashes = ModuleHashes(site.string(), {"hello-agentix"});
  REQUIRE(hashes.ok());
  REQUIRE(hashes->size() == 2);
  REQUIRE(hashes->at("hello_agentix.tools") ==
          "sha256:" + Sha256Hex("def add(a, b):\n    return a + b\n"));
  REQUIRE(hashes->at("hello_agentix") == "sha256:" + Sha256Hex(""));
  REQUIRE(hashes->count("other.mod") == 0);  // another distribution's

  auto missing = ModuleHashes(site.string(), {"not-installed"});
  REQUIRE(missing.status().code() == absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace agentix::bundler
