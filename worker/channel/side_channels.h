// Frames that ride the log queue instead of a call's reply path: log
// records, trace events and plugin-namespace events. They come from any
// thread, must stay ordered with the records around them and go out
// promptly without the caller taking the channel (log_sender.h writes them).
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace agentix::worker {

// send_log(**fields): one `log` frame carrying an agentix.runtime.v1.LogRecord
// filled by field name (proto_fields.h): keyword arguments only, named as in
// runtime.proto, less the daemon's seq and worker_id; an omitted field keeps
// proto3's default (0, "", LOG_ORIGIN_UNSPECIFIED).
PyObject* ChannelSendLog(PyObject* self, PyObject* const* args,
                         Py_ssize_t nargs, PyObject* kwnames);
// send_log_record(record, context, call_id, standard_keys, unforwarded):
// the log bridge's common case in C. For a plain logging.LogRecord (exactly
// that type, getMessage not replaced) with no attribute outside
// `standard_keys` (a frozenset: no extras), no exception still to format and
// a logger name not starting with one of `unforwarded` (a tuple of str),
// queues the `log` frame the bridge's keyword path (send_log) would, from
// the record's attributes read directly, and returns True. Otherwise, or if
// the record's message cannot be formatted, returns False having sent
// nothing: the caller takes its general path. `context` is used when the
// record has no str agentix_context.
PyObject* ChannelSendLogRecord(PyObject* self, PyObject* const* args,
                               Py_ssize_t nargs);
// send_trace(**fields): one `trace` frame carrying an
// agentix.runtime.v1.TraceEvent filled by field name the same way, less the
// daemon's seq, worker_id and OpenTelemetry byte ids (trace_id, span_id,
// parent_span_id: derived from agentix_*_id). attributes / error_data are
// {str: scalar} dicts, events a list of SpanEventRecord dicts.
PyObject* ChannelSendTrace(PyObject* self, PyObject* const* args,
                           Py_ssize_t nargs, PyObject* kwnames);
// send_span(kind, span, call_id, span_type): the trace forwarder's common
// span events in C. `kind` is 3 (span start) or 4 (span end), `span_type`
// agentix.trace's Span class. For a span of exactly that type whose ids and
// name are str (parent None or str), stamps in agentix's ISO-8601 form (or
// None), attributes a dict of str keys and plain values (exactly str, bool,
// float, bytes, or int in int64's range), and at its end no events, error
// or status description, queues the `trace` frame the forwarder's keyword
// call (send_trace) would and returns True; otherwise returns False having
// sent nothing (the forwarder's general path then coerces the values).
PyObject* ChannelSendSpan(PyObject* self, PyObject* const* args,
                          Py_ssize_t nargs);
// send_ns_event(namespace, event, data, request_id, error_type,
// error_message, status_code): one plugin-namespace event for the hosts.
PyObject* ChannelSendNamespaceEvent(PyObject* self, PyObject* const* args,
                                    Py_ssize_t nargs);

}  // namespace agentix::worker
