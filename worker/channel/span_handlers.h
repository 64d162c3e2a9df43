// The trace forwarder's on_span_start / on_span_end in C (_TraceForwarder,
// worker/driver/traces.py). The forwarder stores the two callables as its
// instance attributes, which agentix.trace then calls directly: no Python
// frame per span event, the forwarder's attributes read as dict lookups.
// Each does what the class's Python method does, step for step: nothing
// while disabled or while this thread forwards through the general path,
// else the forwarder's `_send_span` (send_span: the C encoding), and when
// that declines or raises an Exception the class's general path
// (_span_start_general / _span_end_general). A forwarder missing one of
// the attributes read gets its class's Python method instead.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace agentix::worker {

// span_handlers(forwarder, call_id) -> (on_span_start, on_span_end), each
// called with the span. `call_id` is the ContextVar whose value is sent.
PyObject* SpanHandlers(PyObject* module, PyObject* const* args,
                       Py_ssize_t nargs);

}  // namespace agentix::worker
