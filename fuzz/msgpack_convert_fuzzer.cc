// libFuzzer target for the msgpack <-> Python conversion of the worker
// (worker/python/msgpack_convert.h), inside an embedded interpreter started
// once with the worker's own isolated PyConfig (InitializeInterpreter).
//
// Checks, for every input:
// - MsgpackToPython either returns an object with no Python error set, or
//   nullptr with an error set (never a crash, never both);
// - an accepted value re-encodes, and its encoding is a fixed point:
//   encode(decode(encode(v))) == encode(v);
// - no Python object leaks: the whole check runs twice and the second run
//   must not end with more pymalloc blocks allocated than it started with
//   (the first run warms CPython's free lists). LeakSanitizer cannot see these
//   (pymalloc serves small objects from its own mmap'ed arenas), and it is
//   off for this target because the embedded interpreter is never finalised
//   (CPython leaks its runtime state at exit by design).
#include <Python.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "worker/python/interpreter.h"
#include "worker/python/msgpack_convert.h"
#include "worker/python/path_config.h"

namespace {

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "msgpack_convert_fuzzer: %s\n", what);
  if (PyErr_Occurred()) PyErr_Print();
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  using namespace agentix::worker;
  auto paths = ComputePythonPaths({}, DefaultPythonHome(),
                                  LinkedPythonVersion());
  if (!paths.ok()) {
    std::fprintf(stderr, "python paths: %s\n",
                 paths.status().ToString().c_str());
    std::abort();
  }
  absl::Status status = InitializeInterpreter(*paths, "msgpack-fuzzer");
  if (!status.ok()) {
    std::fprintf(stderr, "interpreter: %s\n", status.ToString().c_str());
    std::abort();
  }
  // This thread keeps the GIL for the whole run.
  return 0;
}

// sys.getallocatedblocks(); exported by libpython, declared only in its
// internal headers (pycore_pymem.h).
extern "C" Py_ssize_t _Py_GetAllocatedBlocks(void);

extern "C" const char* __asan_default_options() {
  return "detect_leaks=0";
}

namespace {

void CheckOnce(const uint8_t* data, size_t size) {
  using agentix::worker::MsgpackToPython;
  using agentix::worker::PythonToMsgpack;
  PyObject* value =
      MsgpackToPython(reinterpret_cast<const char*>(data), size);
  if (value == nullptr) {
    if (!PyErr_Occurred()) Fail("decode failed without a Python error");
    PyErr_Clear();
    return;
  }
  if (PyErr_Occurred()) Fail("decode succeeded with a Python error set");

  std::string first;
  if (!PythonToMsgpack(value, first)) {
    Py_DECREF(value);
    Fail("a decoded value does not re-encode");
  }
  PyObject* again = MsgpackToPython(first.data(), first.size());
  if (again == nullptr) {
    Py_DECREF(value);
    Fail("our own encoding does not decode");
  }
  std::string second;
  const bool ok = PythonToMsgpack(again, second);
  Py_DECREF(again);
  Py_DECREF(value);
  if (!ok) Fail("second re-encoding failed");
  if (first != second) Fail("encoding is not a fixed point");
}

}  // namespace

// CPython and its datetime module fill caches the first times an aware
// datetime is made and subtracted (seen as 1-2 blocks on the 2nd run of the
// first timestamp input); warm them once so the leak check sees only leaks.
void WarmDatetime() {
  static bool warmed = false;
  if (warmed) return;
  warmed = true;
  const uint8_t timestamps[][15] = {
      {0xd6, 0xff, 0x00, 0x00, 0x00, 0x01},
      {0xd7, 0xff, 0x01, 0x00, 0x00, 0x8f, 0xff, 0xff, 0xff, 0xff},
      {0xc7, 0x0c, 0xff, 0x00, 0x00, 0x00, 0x01, 0xff, 0xff, 0xff, 0xff, 0xff,
       0xff, 0xff, 0x00},
  };
  const size_t sizes[] = {6, 10, 15};
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 3; ++i) CheckOnce(timestamps[i], sizes[i]);
  }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  WarmDatetime();
  CheckOnce(data, size);
  const Py_ssize_t before = _Py_GetAllocatedBlocks();
  CheckOnce(data, size);
  const Py_ssize_t after = _Py_GetAllocatedBlocks();
  // Fewer blocks is fine: a cyclic-GC pass triggered by the run may free
  // unrelated garbage (seen after ~10^6 deeply nested inputs).
  if (after > before) {
    std::fprintf(stderr, "msgpack_convert_fuzzer: %zd -> %zd blocks\n",
                 before, after);
    Fail("Python objects leaked (allocated blocks grew)");
  }
  return 0;
}
