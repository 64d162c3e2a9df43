#include "worker/python/py_error.h"

#include <catch2/catch.hpp>

#include "worker/python/test_interpreter.h"

namespace agentix::worker {
namespace {

TEST_CASE("A raised exception becomes type, message and traceback",
          "[py_error]") {
  testing::RunPython(
      "def _fail():\n"
      "    raise KeyError('missing key')\n");
  PyObject* result = testing::EvalPython("_fail()");
  REQUIRE(result == nullptr);
  PythonError error = FetchPythonError();
  REQUIRE_FALSE(PyErr_Occurred());
  REQUIRE(error.type == "KeyError");
  REQUIRE(error.message == "'missing key'");
  REQUIRE(error.traceback.find("Traceback (most recent call last)") !=
          std::string::npos);
  REQUIRE(error.traceback.find("in _fail") != std::string::npos);
  REQUIRE(error.traceback.find("KeyError: 'missing key'") != std::string::npos);

  absl::Status status =
      PythonErrorToStatus(error, absl::StatusCode::kInvalidArgument);
  REQUIRE(status.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(status.message() == "KeyError: 'missing key'");
  auto payload = status.GetPayload(kTracebackPayloadUrl);
  REQUIRE(payload.has_value());
  REQUIRE(std::string(*payload) == error.traceback);
}

TEST_CASE("Exceptions set from C without a traceback", "[py_error]") {
  testing::EnsureInterpreter();
  PyErr_SetString(PyExc_ValueError, "from C");
  PythonError error = FetchPythonError();
  REQUIRE(error.type == "ValueError");
  REQUIRE(error.message == "from C");
  REQUIRE(error.traceback == "ValueError: from C\n");
}

TEST_CASE("BaseExceptions and dotted built-in names", "[py_error]") {
  testing::RunPython(
      "import json\n"
      "def _exit():\n"
      "    raise SystemExit(7)\n");
  REQUIRE(testing::EvalPython("_exit()") == nullptr);
  PythonError error = FetchPythonError();
  REQUIRE(error.type == "SystemExit");
  REQUIRE(error.message == "7");

  REQUIRE(testing::EvalPython("json.loads('{')") == nullptr);
  error = FetchPythonError();
  REQUIRE(error.type == "JSONDecodeError");  // tp_name json.decoder.JSONDecodeError
}

TEST_CASE("An unprintable exception degrades to a placeholder", "[py_error]") {
  testing::RunPython(
      "class Unprintable(Exception):\n"
      "    def __str__(self):\n"
      "        raise RuntimeError('no')\n"
      "def _raise_unprintable():\n"
      "    raise Unprintable()\n");
  REQUIRE(testing::EvalPython("_raise_unprintable()") == nullptr);
  PythonError error = FetchPythonError();
  REQUIRE_FALSE(PyErr_Occurred());
  REQUIRE(error.type == "Unprintable");
  REQUIRE(error.message == "<unprintable Unprintable object>");
}

TEST_CASE("No pending exception", "[py_error]") {
  testing::EnsureInterpreter();
  PythonError error = FetchPythonError();
  REQUIRE(error.type == "SystemError");
}

}  // namespace
}  // namespace agentix::worker
