// A logging.LogRecord read from C: the log bridge's frame (side_channels.h)
// and the durable log's line (durable_line.h) take a plain record's
// attributes from its __dict__ and format its message without calling back
// into logging.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace agentix::worker {

// 1 if `record` is exactly a logging.LogRecord whose class still has the
// stdlib's getMessage: its attributes are then the values in its __dict__
// and its message is PlainMessage's. 0 if not (a subclass, a replaced
// getMessage); -1 with an error set. GIL held.
int IsPlainLogRecord(PyObject* record);

// LogRecord.getMessage() from a plain record's `msg` and `args`: str(msg),
// %-formatted with args if they are true. New reference, or nullptr with an
// error set (whatever str() or % raised). The last message made from a str
// and a tuple of str / int / float is kept and given again for the same
// objects (the bridge and the durable log format each record in turn).
PyObject* PlainMessage(PyObject* msg, PyObject* args);

}  // namespace agentix::worker
