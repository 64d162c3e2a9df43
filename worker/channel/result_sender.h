// A call's replies: send_result (cut into result_chunk frames over
// CHUNK_BYTES; from 256 KiB on written in place with writev, or copied into
// the shared-memory payload ring while it has room), send_item (one
// stream_item frame) and send_error. Each first catches up the captured
// stdout/stderr, so a call's output precedes its reply.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace agentix::worker {

// send_result(call_id, encoding, data): data is a contiguous buffer or a
// list of them (their concatenation).
PyObject* ChannelSendResult(PyObject* self, PyObject* const* args,
                            Py_ssize_t nargs);
// send_item(call_id, index, encoding, data): ValueError (nothing queued) if
// it would exceed the frame limit.
PyObject* ChannelSendItem(PyObject* self, PyObject* const* args,
                          Py_ssize_t nargs);
// send_error(call_id, code, type, message, traceback, cancelled
//            [, type_module, type_qualname, state])
PyObject* ChannelSendError(PyObject* self, PyObject* const* args,
                           Py_ssize_t nargs);

}  // namespace agentix::worker
