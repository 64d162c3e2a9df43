// The two root-logger handlers' `handle` in C: the log bridge's
// (_LogBridge, worker/driver/logs.py) and the durable log's
// (_DurableHandler, worker/driver/durable.py). Each handler stores the
// callable as its instance attribute `handle`, which logging's callHandlers
// then calls directly: no Python frame per record and handler, and the
// attribute reads of the Python `handle` done as dict lookups. Each does
// what its class's Python `handle` does, step for step; whatever that one
// would do other than its fast path (filters to run, a handler state it
// does not expect) is left to it: the class's `handle` is called instead.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace agentix::worker {

// bridge_handle(handler, channel, context, call_id, standard_keys,
// unforwarded) -> handle(record): channel.send_log_record(record, context,
// call_id.get(), standard_keys, unforwarded), and handler.emit(record) when
// that declines or raises an Exception; True. `call_id` is a ContextVar.
PyObject* BridgeHandle(PyObject* module, PyObject* const* args,
                       Py_ssize_t nargs);

// durable_handle(handler) -> handle(record): under handler.lock, the
// default line by write_log_line when handler.formatter is its
// _line_formatter (room: maxBytes - _size when it _rotates), _size counted;
// handler.emit(record) for what that declines, handler.handleError(record)
// for an Exception it raised; True.
PyObject* DurableHandle(PyObject* module, PyObject* const* args,
                        Py_ssize_t nargs);

}  // namespace agentix::worker
