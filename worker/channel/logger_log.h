// The stdlib's Logger._log in C, for the worker's calling thread (issue 25:
// in a log burst that thread is the serial stage, and logging's own Python
// -- _log, findCaller and its frame checks, makeRecord, handle, filter,
// callHandlers -- was ~2 µs of its ~4.4 µs per record).
//
// Installed as logging.Logger._log (a method descriptor), it does what the
// stdlib's _log does, step for step, for the common call: the caller's
// file, line and function found as findCaller finds them (stacklevel,
// logging's own frames and importlib's skipped, logging._srcfile honoured),
// the record from logging._logRecordFactory, the logger's disabled flag and
// filters, then each handler of the logger and its parents whose level the
// record meets, until one does not propagate.
//
// Declining is the safety rule: a logger class (or instance) with its own
// findCaller / makeRecord / handle / filter / callHandlers, a replaced
// currentframe / _is_internal_frame / os.path.normcase, a _srcfile other
// than logging's own file (or None: then no caller is looked up, as in the
// stdlib), exc_info, stack_info, a stacklevel below 1 or not an int, odd
// arguments, or no Python frame to start from: the stdlib's own _log runs
// instead, with the same arguments, before anything was done. Extras go
// through the class's makeRecord; a logger tree with no handler at all goes
// through its callHandlers (lastResort).
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace agentix::worker {

// install_logger_log(logging) -> the stdlib's _log function: replaces
// logging.Logger._log with the C one, which falls back to the returned
// function. Installing again returns the same function and changes
// nothing. TypeError if Logger._log is not a Python function.
PyObject* InstallLoggerLog(PyObject* module, PyObject* const* args,
                           Py_ssize_t nargs);

}  // namespace agentix::worker
