// The Python edge of side_wire.h, part of the _native_calls extension:
// log_records(message) and trace_events(message) turn a serialized
// LogsResponse / TracesResponse into struct sequences whose attributes are
// named as the protobuf fields the host's replay reads (logs.py, traces.py
// read either kind), or return None for a message only protobuf should judge.
#ifndef AGENTIX_HOST_PYTHON_NATIVE_SIDE_RECORDS_H_
#define AGENTIX_HOST_PYTHON_NATIVE_SIDE_RECORDS_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace agentix::host {

// log_records(message) -> (instance_id, [LogRecordFields, ...]) | None
PyObject* LogRecords(PyObject* module, PyObject* message);

// trace_events(message) -> (instance_id, [TraceEventFields, ...]) | None
PyObject* TraceEvents(PyObject* module, PyObject* message);

// span_item(event, span_type, max_id_chars, max_name_chars, max_key_chars,
// max_attributes) -> Span | None: the `span_type` (agentix.trace's Span)
// that traces.trace_item makes of a TraceEventFields of kind SPAN_START /
// SPAN_END with no span events and no error, within the limits; built in one
// call (Span.__new__, then its fields set in __init__'s order: Span is a plain
// dataclass). None for any other event (other kinds, events, an error, an id,
// name, key or attribute count beyond its limit, protobuf's TraceEvent): the
// caller then takes trace_item's path, which bounds or refuses it.
PyObject* SpanItem(PyObject* module, PyObject* const* args, Py_ssize_t nargs);

// SpanReplayer(replayer, fallback, trace_module, span_type, report,
// max_id_chars, max_name_chars, max_key_chars, max_attributes), a type:
// called with one event, it does traces.EventReplayer.replay (`replayer`'s,
// given as `fallback`) for a TraceEventFields span_item takes, in one call
// with no Python frame: while `replayer` has seen agentix.trace's current
// processor list (non-empty), does not skip the event's method and tracing
// is on, the span_item Span goes to each processor's on_span_start /
// on_span_end in order as _dispatch does (an Exception from one is passed to
// report(processor, method, error), which logs _dispatch's record, and the
// next processor is called). Any other event goes to `fallback` whole,
// before anything a processor could observe.

// iso_from_unix_nanos(nanos) -> str | None: `nanos` (an int64) since the
// epoch as agentix.trace's stamp ("YYYY-MM-DDTHH:MM:SS.ffffffZ", truncated
// to microseconds), None for 0 or less; what traces.iso_from_nanos returns.
PyObject* IsoFromUnixNanos(PyObject* module, PyObject* nanos);

// Creates the struct sequence types and SpanReplayer and adds them to `module`; false with a
// Python exception set on failure. Once, at import.
bool AddSideRecordTypes(PyObject* module);

}  // namespace agentix::host

#endif  // AGENTIX_HOST_PYTHON_NATIVE_SIDE_RECORDS_H_
