#include "worker/python/interpreter.h"

#include <catch2/catch.hpp>

#include "worker/python/py_error.h"
#include "worker/python/test_interpreter.h"

namespace agentix::worker {
namespace {

std::string EvalToString(const char* expression) {
  PyObject* value = testing::EvalPython(expression);
  if (value == nullptr) {
    PythonError error = FetchPythonError();
    FAIL(error.type << ": " << error.message << "\n" << error.traceback);
  }
  PyObject* str = PyObject_Str(value);
  Py_DECREF(value);
  REQUIRE(str != nullptr);
  std::string out = PyUnicode_AsUTF8(str);
  Py_DECREF(str);
  return out;
}

TEST_CASE("The linked interpreter is Debian's 3.11 under /usr",
          "[interpreter]") {
  REQUIRE(LinkedPythonVersion() == "3.11");
  REQUIRE(DefaultPythonHome() == "/usr");
  testing::EnsureInterpreter();
  REQUIRE(EvalToString("__import__('sys').version_info[:2]") == "(3, 11)");
  REQUIRE(EvalToString("__import__('sys').base_prefix") == "/usr");
  REQUIRE(EvalToString("__import__('sys').executable") == "/usr/bin/python3");
  REQUIRE(EvalToString("__import__('os').__file__") ==
          "/usr/lib/python3.11/os.py");
}

// Frozen stdlib modules are used (no file read) and have the __file__ they
// have under /usr/bin/python3, whether imported during initialisation or
// after it.
TEST_CASE("Frozen stdlib modules are used, with their __file__",
          "[interpreter]") {
  testing::EnsureInterpreter();
  REQUIRE(EvalToString("__import__('sys')._stdlib_dir") ==
          "/usr/lib/python3.11");
  REQUIRE(EvalToString("__import__('os').__spec__.origin") == "frozen");
  REQUIRE(EvalToString("__import__('site').__file__") ==
          "/usr/lib/python3.11/site.py");
  REQUIRE(EvalToString("__import__('os').path.__file__") ==
          "/usr/lib/python3.11/posixpath.py");
  REQUIRE(EvalToString("__import__('codecs').__spec__.loader_state.filename") ==
          "/usr/lib/python3.11/codecs.py");
  REQUIRE(EvalToString("__import__('runpy').__file__") ==
          "/usr/lib/python3.11/runpy.py");
  // Source lines of a frozen module are found (tracebacks, inspect).
  REQUIRE(EvalToString("'def makedirs' in __import__('inspect').getsource("
                       "__import__('os'))") == "True");
}

TEST_CASE("The configuration is isolated", "[interpreter]") {
  testing::EnsureInterpreter();
  REQUIRE(EvalToString("__import__('sys').flags.isolated") == "1");
  REQUIRE(EvalToString("__import__('sys').flags.safe_path") == "True");
  REQUIRE(EvalToString("__import__('sys').flags.utf8_mode") == "1");
  REQUIRE(EvalToString("__import__('sys').argv") == "['worker-test']");
  // No cwd entry and the stdlib before Debian's dist-packages.
  REQUIRE(EvalToString("__import__('sys').path[:2]") ==
          "['/usr/lib/python3.11', '/usr/lib/python3.11/lib-dynload']");
  REQUIRE(EvalToString("'' in __import__('sys').path") == "False");
  // Signal handlers are not installed: Python owns no SIGINT handler.
  REQUIRE(EvalToString("__import__('signal').getsignal(2)") == "None");
}

}  // namespace
}  // namespace agentix::worker
