// The driver's handles on stdio capture (stdio_capture.h) and on the
// captured lines for its durable-log thread (durable_log.h).
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace agentix::worker {

struct ModuleState;

// Creates the StdioLine record type (origin, time_unix_nanos, text) and adds
// it to `module`. -1 with an error set.
int AddStdioLineType(PyObject* module, ModuleState& state);

// start_capture(worker_id, context)
PyObject* ChannelStartCapture(PyObject* self, PyObject* const* args,
                              Py_ssize_t nargs);
// stop_capture(timeout_ms): restores fds 1/2, waits (bounded) for the
// drainers and for the queued log frames to be written.
PyObject* ChannelStopCapture(PyObject* self, PyObject* arg);
// send_stdio(origin, text, call_id): one stdout (2) / stderr (3) line.
PyObject* ChannelSendStdio(PyObject* self, PyObject* const* args,
                           Py_ssize_t nargs);
// set_durable(enabled)
PyObject* ChannelSetDurable(PyObject* self, PyObject* arg);
// wait_stdio_lines(): a list of StdioLine records, None once capture ended or
// the durable log was disabled.
PyObject* ChannelWaitStdioLines(PyObject* self, PyObject* unused);

}  // namespace agentix::worker
