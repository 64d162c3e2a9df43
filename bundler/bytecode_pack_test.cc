#include "bundler/bytecode_pack.h"

#include <filesystem>
#include <fstream>

#include <catch2/catch.hpp>

#include "bundler/command.h"
#include "bundler/test_util.h"

namespace agentix::bundler {
namespace {

namespace fs = std::filesystem;

// A staged stdlib of three real stdlib modules, compiled as the bundler
// compiles the bundle's: json (a package: checks out), textwrap (its source
// edited after compiling: stale) and queue (timestamp bytecode).
fs::path StageSmallStdlib() {
  const fs::path dir =
      fs::path(testing::FreshDir("bytecode_pack")) / "lib/python3.11";
  fs::create_directories(dir);
  fs::copy("/usr/lib/python3.11/json", dir / "json",
           fs::copy_options::recursive);
  fs::copy("/usr/lib/python3.11/textwrap.py", dir / "textwrap.py");
  fs::copy("/usr/lib/python3.11/queue.py", dir / "queue.py");
  auto hashed = RunCommandOrError(
      {"/usr/bin/python3", "-m", "compileall", "-q", "--invalidation-mode",
       "unchecked-hash", (dir / "json").string(),
       (dir / "textwrap.py").string()});
  REQUIRE(hashed.ok());
  auto timestamped = RunCommandOrError(
      {"/usr/bin/python3", "-m", "compileall", "-q", (dir / "queue.py").string()});
  REQUIRE(timestamped.ok());
  std::ofstream(dir / "textwrap.py", std::ios::app) << "\nEDITED = 1\n";
  return dir;
}

TEST_CASE("The pack holds the staged modules whose bytecode checks out",
          "[bundler]") {
  const fs::path dir = StageSmallStdlib();
  auto report = WriteBytecodePack("/usr/bin/python3", dir.string());
  REQUIRE(report.ok());
  const fs::path pack = dir / "__pycache__" / kBytecodePackName;
  REQUIRE(fs::exists(pack));
  REQUIRE(report->bytes == fs::file_size(pack));
  // json, json.decoder, json.encoder, json.scanner; not textwrap (stale),
  // not queue (timestamp bytecode), nothing absent from the staged tree.
  REQUIRE(report->modules == 4);
  // Read back as the worker reads it: each entry unmarshals to the code of
  // its staged .pyc.
  auto check = RunCommandOrError(
      {"/usr/bin/python3", "-I", "-c",
       "import importlib.util, marshal, sys\n"
       "d, p = sys.argv[1], sys.argv[2]\n"
       "data = open(p, 'rb').read()\n"
       "assert data[:8] == b'AGXPYC1\\n'\n"
       "n = int.from_bytes(data[8:16], 'little')\n"
       "magic, index = marshal.loads(data[16:16 + n])\n"
       "assert magic == importlib.util.MAGIC_NUMBER\n"
       "for name, (off, size, rel, pkg) in sorted(index.items()):\n"
       "    pyc = open(importlib.util.cache_from_source(d + '/' + rel), 'rb').read()\n"
       "    assert data[off:off + size] == pyc[16:], name\n"
       "    assert pkg == rel.endswith('/__init__.py'), name\n"
       "    print(name, rel, pkg)\n",
       dir.string(), pack.string()});
  REQUIRE(check.ok());
  REQUIRE(check->out ==
          "json json/__init__.py True\n"
          "json.decoder json/decoder.py False\n"
          "json.encoder json/encoder.py False\n"
          "json.scanner json/scanner.py False\n");
}

TEST_CASE("The same staged stdlib gives the same pack", "[bundler]") {
  const fs::path dir = StageSmallStdlib();
  REQUIRE(WriteBytecodePack("/usr/bin/python3", dir.string()).ok());
  const fs::path pack = dir / "__pycache__" / kBytecodePackName;
  std::ifstream first_in(pack, std::ios::binary);
  const std::string first((std::istreambuf_iterator<char>(first_in)), {});
  REQUIRE(WriteBytecodePack("/usr/bin/python3", dir.string()).ok());
  std::ifstream second_in(pack, std::ios::binary);
  const std::string second((std::istreambuf_iterator<char>(second_in)), {});
  REQUIRE(first == second);
}

TEST_CASE("A python that cannot run the helper is an error", "[bundler]") {
  const fs::path dir = testing::FreshDir("bytecode_pack_none");
  REQUIRE_FALSE(WriteBytecodePack("/bin/false", dir.string()).ok());
}

}  // namespace
}  // namespace agentix::bundler
