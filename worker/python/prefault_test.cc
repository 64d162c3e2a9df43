#include "worker/python/prefault.h"

#include <Python.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "testing/status_matchers.h"
#include "worker/python/prefault_wait.h"
#include "worker/python/test_interpreter.h"

namespace agentix::worker {
namespace {

using testing::EnsureInterpreter;
using testing::EvalPython;
using testing::RunPython;

constexpr size_t kMiB = size_t{1} << 20;

// The reserve must be in place before the interpreter's first arena, so
// every case here runs after this one start (Catch2 runs them in order).
void StartOnce() {
  static const bool started = [] {
    const absl::Status status = StartPrefault({.arena_mib = 4, .heap_mib = 2, .libpython = true});
    INFO(status.ToString());
    REQUIRE(status.ok());
    return true;
  }();
  (void)started;
  EnsureInterpreter();
}

uintptr_t AddressOf(const char* expression) {
  PyObject* value = EvalPython(expression);
  REQUIRE(value != nullptr);
  PyObject* id = PyObject_CallFunctionObjArgs(
      PyDict_GetItemString(PyEval_GetBuiltins(), "id"), value, nullptr);
  REQUIRE(id != nullptr);
  const auto address = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(id));
  Py_DECREF(id);
  Py_DECREF(value);
  return address;
}

TEST_CASE("The interpreter's objects live in the arena reserve, which the thread faults in") {
  StartOnce();
  const PrefaultState state = WaitPrefaultFinished();
  INFO("pages " << state.pages_done << ", of libpython " << state.library_pages
                << ", arenas " << state.arenas_from_reserve << " + "
                << state.arenas_mapped);
  REQUIRE(state.finished);
  REQUIRE(state.reserve_end - state.reserve_begin == 4 * kMiB);
  CHECK(state.reserve_begin % kMiB == 0);
  CHECK(state.arenas_from_reserve >= 1);
  // A small object made now comes from an arena in the reserve.
  const uintptr_t address = AddressOf("[1, 2, 3]");
  CHECK(address >= state.reserve_begin);
  CHECK(address < state.reserve_end);
  // Every page of the reserve is resident: the thread faulted them in
  // (the heap's 2 MiB too, unless malloc is not glibc's, as under ASan).
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  CHECK(state.pages_done - state.library_pages >= 4 * kMiB / page);
  CHECK(state.pages_done - state.library_pages <= 6 * kMiB / page);
  std::vector<unsigned char> resident(4 * kMiB / page);
  REQUIRE(mincore(reinterpret_cast<void*>(state.reserve_begin), 4 * kMiB,
                  resident.data()) == 0);
  size_t in = 0;
  for (unsigned char r : resident) in += r & 1;
  CHECK(in == resident.size());
}

TEST_CASE("libpython's mapped file is read, and only it") {
  StartOnce();
  const PrefaultState state = WaitPrefaultFinished();
  REQUIRE(state.finished);
  // The libpython this process mapped, from /proc/self/maps.
  std::ifstream maps("/proc/self/maps");
  std::string line;
  std::string path;
  while (std::getline(maps, line)) {
    const size_t slash = line.find('/');
    if (slash != std::string::npos && line.find("/libpython", slash) != std::string::npos) {
      path = line.substr(slash);
      break;
    }
  }
  REQUIRE(!path.empty());
  struct stat file {};
  REQUIRE(stat(path.c_str(), &file) == 0);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  // Its segments' file parts: most of the file, never more than all of it.
  CHECK(state.library_pages > static_cast<size_t>(file.st_size) / page / 2);
  CHECK(state.library_pages <= static_cast<size_t>(file.st_size) / page + 4);
}

TEST_CASE("Arenas beyond the reserve are mapped as usual, and freed ones are reused") {
  StartOnce();
  const PrefaultState before = GetPrefaultState();
  // ~24 MiB of small objects: more arenas than the reserve holds.
  RunPython(
      "big = [(i, str(i)) for i in range(250000)]\n"
      "assert big[123456] == (123456, '123456')\n");
  const PrefaultState during = GetPrefaultState();
  CHECK(during.arenas_mapped > before.arenas_mapped);
  RunPython("del big\nimport gc\ngc.collect()\n");
  // Allocating again takes the reserve's freed arenas first, and the values
  // made in them are intact.
  RunPython(
      "again = [(i, str(i)) for i in range(250000)]\n"
      "assert again[249999] == (249999, '249999')\n"
      "assert sum(x for x, _ in again) == 249999 * 250000 // 2\n"
      "del again\n");
  CHECK(GetPrefaultState().arenas_from_reserve > during.arenas_from_reserve);
}

TEST_CASE("A second start is refused") {
  StartOnce();
  CHECK(StartPrefault({.arena_mib = 1, .heap_mib = 0}).code() ==
        absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace agentix::worker
