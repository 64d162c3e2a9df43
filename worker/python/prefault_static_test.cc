// The prefault thread's libpython pages when libpython is linked into the
// executable (agentix-worker's default build): there is no libpython object
// to find by name, so the executable's own mapped file is read. And the
// executable's data and bss, faulted in before the thread starts.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>

#include "worker/python/prefault.h"
#include "worker/python/prefault_wait.h"
#include "worker/python/test_interpreter.h"

namespace agentix::worker {
namespace {

// In the executable's bss, never written before StartPrefault.
char g_untouched_bss[256 << 10];

struct Mapping {
  uint64_t size_kb = 0;
  uint64_t private_dirty_kb = 0;
  std::string header;
};

// The /proc/self/smaps entry of the mapping holding `address`.
Mapping MappingHolding(const void* address) {
  const auto at = reinterpret_cast<uintptr_t>(address);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  Mapping found;
  bool inside = false;
  while (std::getline(smaps, line)) {
    const size_t dash = line.find('-');
    const size_t space = line.find(' ');
    if (dash != std::string::npos && space != std::string::npos && dash < space &&
        line.find(':') > space) {  // a mapping's header: "begin-end perms ..."
      const uintptr_t begin = std::strtoull(line.substr(0, dash).c_str(), nullptr, 16);
      const uintptr_t end =
          std::strtoull(line.substr(dash + 1, space - dash - 1).c_str(), nullptr, 16);
      if (inside) break;
      inside = at >= begin && at < end;
      if (inside) found.header = line;
      continue;
    }
    if (!inside) continue;
    std::istringstream fields(line);
    std::string key;
    uint64_t kb = 0;
    fields >> key >> kb;
    if (key == "Size:") found.size_kb = kb;
    if (key == "Private_Dirty:") found.private_dirty_kb = kb;
  }
  return found;
}

TEST_CASE("A static libpython: the executable's own mapped file is read, its data and bss "
          "faulted in at once") {
  const Mapping before = MappingHolding(g_untouched_bss);
  INFO(before.header);
  REQUIRE(before.size_kb >= sizeof(g_untouched_bss) / 1024);
  // (the premise: most of that array's pages were never written)
  REQUIRE(before.private_dirty_kb < before.size_kb);
  // No shared libpython in this process (the premise of the case).
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    INFO(line);
    REQUIRE(line.find("/libpython") == std::string::npos);
  }
  REQUIRE(StartPrefault(
                {.arena_mib = 0, .heap_mib = 0, .libpython = true, .image_data = true})
              .ok());
  // Done before StartPrefault returned: every page of the bss's mapping is
  // the process's own, written, and no byte changed.
  const Mapping after = MappingHolding(g_untouched_bss);
  INFO(after.header);
  CHECK(after.private_dirty_kb == after.size_kb);
  for (char c : g_untouched_bss) REQUIRE(c == 0);
  const PrefaultState state = WaitPrefaultFinished();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  CHECK(state.image_data_pages >= after.size_kb * 1024 / page);
  REQUIRE(state.finished);
  struct stat exe {};
  REQUIRE(stat("/proc/self/exe", &exe) == 0);
  // Its segments' file parts (libpython's code is most of the binary):
  // most of the file, never more than all of it, and nothing else.
  CHECK(state.library_pages > static_cast<size_t>(exe.st_size) / page / 2);
  CHECK(state.library_pages <= static_cast<size_t>(exe.st_size) / page + 4);
  CHECK(state.pages_done == state.library_pages);  // the thread's: the data is not its
  // The interpreter still starts and runs with the pages read under it.
  testing::RunPython("assert sum(range(10)) == 45\n");
}

TEST_CASE("A second start is refused") {
  CHECK(StartPrefault({.libpython = true}).code() == absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace agentix::worker
