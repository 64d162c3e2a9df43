// Turns the pending Python exception into plain data (type name, message,
// formatted traceback) and into an absl::Status, so that no Python error
// state leaks past the C/Python edge (CONVENTIONS.md §4.7).
#pragma once

#include <string>

#include "absl/status/status.h"

namespace agentix::worker {

// A Python exception as data.
struct PythonError {
  std::string type;       // the exception class name, e.g. "ValueError"
  std::string message;    // str(exc)
  std::string traceback;  // "".join(traceback.format_exception(exc))
};

// The Status payload URL under which the traceback travels.
inline constexpr char kTracebackPayloadUrl[] =
    "type.agentix.dev/python.Traceback";

// Fetches, normalises, formats and clears the current Python exception.
// Requires the GIL. Never fails and never leaves an exception set: when no
// exception is pending, or formatting itself fails (e.g. the traceback module
// cannot be imported during a broken boot), the fields degrade to
// placeholders instead.
PythonError FetchPythonError();

// "<type>: <message>" with `code`, the traceback attached as the
// kTracebackPayloadUrl payload.
absl::Status PythonErrorToStatus(const PythonError& error,
                                 absl::StatusCode code);

}  // namespace agentix::worker
