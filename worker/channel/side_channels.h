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
