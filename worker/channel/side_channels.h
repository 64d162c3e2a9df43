// Frames that ride the log queue instead of a call's reply path: log
// records, trace events and plugin-namespace events. They come from any
// thread, must stay ordered with the records around them and go out
// promptly without the caller taking the channel (log_sender.h writes them).
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace agentix::worker {

// send_log(*, logger, level, level_name, message, time_unix_nanos, file,
// line, function, module, exception_text, origin, call_id, context, extras,
// stack_info): one `log` frame. Keyword arguments only (named_fields.h);
// an omitted one keeps ipc::LogEntry's default.
PyObject* ChannelSendLog(PyObject* self, PyObject* const* args,
                         Py_ssize_t nargs, PyObject* kwnames);
// send_trace(*, kind, trace_id, span_id, parent_id, name,
// start_time_unix_nanos, end_time_unix_nanos, attributes, events, status,
// status_description, error_message, error_data, call_id): one `trace`
// frame, keyword arguments only; kind 1..4 and status 0..2, else ValueError.
PyObject* ChannelSendTrace(PyObject* self, PyObject* const* args,
                           Py_ssize_t nargs, PyObject* kwnames);
// send_ns_event(namespace, event, data, request_id, error_type,
// error_message, status_code): one plugin-namespace event for the hosts.
PyObject* ChannelSendNamespaceEvent(PyObject* self, PyObject* const* args,
                                    Py_ssize_t nargs);

}  // namespace agentix::worker
