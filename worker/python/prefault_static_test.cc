// The prefault thread's libpython pages when libpython is linked into the
// executable (agentix-worker's default build): there is no libpython object
// to find by name, so the executable's own mapped file is read.
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "worker/python/prefault.h"
#include "worker/python/prefault_wait.h"
#include "worker/python/test_interpreter.h"

namespace agentix::worker {
namespace {

TEST_CASE("A static libpython: the executable's own mapped file is read") {
  // No shared libpython in this process (the premise of the case).
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    INFO(line);
    REQUIRE(line.find("/libpython") == std::string::npos);
  }
  REQUIRE(StartPrefault({.arena_mib = 0, .heap_mib = 0, .libpython = true}).ok());
  const PrefaultState state = WaitPrefaultFinished();
  REQUIRE(state.finished);
  struct stat exe {};
  REQUIRE(stat("/proc/self/exe", &exe) == 0);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  // Its segments' file parts (libpython's code is most of the binary):
  // most of the file, never more than all of it, and nothing else.
  CHECK(state.library_pages > static_cast<size_t>(exe.st_size) / page / 2);
  CHECK(state.library_pages <= static_cast<size_t>(exe.st_size) / page + 4);
  CHECK(state.pages_done == state.library_pages);
  // The interpreter still starts and runs with the pages read under it.
  testing::RunPython("assert sum(range(10)) == 45\n");
}

TEST_CASE("A second start is refused") {
  CHECK(StartPrefault({.libpython = true}).code() == absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace agentix::worker
