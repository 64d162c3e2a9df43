// Test support: starts the embedded interpreter once per test binary with the
// worker's own configuration (Debian's stdlib, no venv).
#pragma once

#include <Python.h>

#include <catch2/catch.hpp>

#include "worker/python/interpreter.h"
#include "worker/python/path_config.h"

namespace agentix::worker::testing {

// Initialises the interpreter on first use; later calls are no-ops. The
// calling (test main) thread holds the GIL afterwards.
inline void EnsureInterpreter() {
  if (Py_IsInitialized()) return;
  auto paths = ComputePythonPaths({}, DefaultPythonHome(),
                                  LinkedPythonVersion());
  REQUIRE(paths.ok());
  absl::Status status = InitializeInterpreter(*paths, "worker-test");
  INFO(status.ToString());
  REQUIRE(status.ok());
}

// Runs `source` in __main__; REQUIREs success.
inline void RunPython(const char* source) {
  EnsureInterpreter();
  const int rc = PyRun_SimpleString(source);
  REQUIRE(rc == 0);
}

// Evaluates `expression` in __main__ and returns a new reference (nullptr
// with the error set on failure).
inline PyObject* EvalPython(const char* expression) {
  EnsureInterpreter();
  PyObject* main = PyImport_AddModule("__main__");  // borrowed
  PyObject* globals = PyModule_GetDict(main);       // borrowed
  return PyRun_String(expression, Py_eval_input, globals, globals);
}

}  // namespace agentix::worker::testing
