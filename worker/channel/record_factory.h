// The worker's log record factory (logging.setLogRecordFactory): the record
// logging would make, tagged with the worker's agentix_context. For the
// stdlib's own LogRecord it builds the record in C, the same attributes with
// the same values in the same order as LogRecord.__init__ sets them, without
// its ~1.5 µs of Python per record (issue 25: the worker's calling thread is
// the serial stage of a log burst).
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace agentix::worker {

// set_log_record_factory(factory, context, logging): make_log_record's
// records come from `factory` (the factory logging had) and get `context` as
// their agentix_context. `logging` is the logging module, whose globals
// (logThreads, _startTime, getLevelName, ...) are read per record as
// LogRecord.__init__ reads them. Returns None.
PyObject* SetLogRecordFactory(PyObject* module, PyObject* const* args,
                              Py_ssize_t nargs);

// make_log_record(*args, **kwargs): factory(*args, **kwargs) with
// agentix_context set. When the factory is logging.LogRecord as it was
// configured (same class, __init__, __new__ and __setattr__; time.time and
// getLevelName not replaced), the call is makeRecord's nine positional
// arguments, `args` a tuple and the pathname a str, the record is built in
// C; anything else calls the factory.
PyObject* MakeLogRecord(PyObject* module, PyObject* const* args,
                        Py_ssize_t nargs, PyObject* kwnames);

}  // namespace agentix::worker
