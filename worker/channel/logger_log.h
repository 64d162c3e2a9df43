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
// findCaller / makeRecord / handle / filter / callHandlers (or its own
// __getattribute__ / __getattr__), an audit hook added since install (the
// stdlib's findCaller raises "sys._getframe", which it would see), a replaced
// currentframe / _is_internal_frame / os.path.normcase, a _srcfile other
// than logging's own file (or None: then no caller is looked up, as in the
// stdlib), exc_info, stack_info, a stacklevel below 1 or not an int, odd
// arguments, or no Python frame to start from: the stdlib's own _log runs
// instead, with the same arguments, before anything was done. Extras go
// through the class's makeRecord; a logger tree with no handler at all goes
// through its callHandlers (lastResort).
//
// Logger.debug / info / warning / error / critical / log are C too: the
// stdlib's `if self.isEnabledFor(level): self._log(level, msg, args,
// **kwargs)` with isEnabledFor's `disabled` and `_cache` read here (a level
// not cached yet asks the stdlib's isEnabledFor), and the C _log called
// directly. A class or instance with its own isEnabledFor or _log, a
// keyword naming one of the method's parameters, a non-int level for
// log(), or no Python frame to call from (the stdlib's caller is then its
// own method's frame) get the stdlib's method.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace agentix::worker {

// install_logger_log(logging) -> {name: the stdlib's method}: replaces
// logging.Logger's _log, debug, info, warning, error, critical and log with
// C ones, which fall back to the returned functions. Installing again
// returns the same and changes nothing. TypeError if one of them (or what
// the C ones stand in for) is not logging's own Python function.
PyObject* InstallLoggerLog(PyObject* module, PyObject* const* args,
                           Py_ssize_t nargs);

}  // namespace agentix::worker
