// The durable log's line for a plain logging.LogRecord in the default format,
// formatted and written in C: what _DurableFormatter.format and
// _DurableHandler.emit (worker/driver/durable.py) do for such a record,
// without their Python.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace agentix::worker {

// write_log_line(record, sink, context, room) -> int. For a plain LogRecord
// (log_record.h) with no exception, exception text or stack, writes
// "<asctime> [<agentix_context>] [<name>] <message>\n" (UTF-8) to `sink`: a
// map_log mapping (appended), or an fd in one write(2) (more only if the
// kernel takes part of it); sets
// record.message and record.asctime ("YYYY-MM-DD HH:MM:SS,mmm", local time)
// as logging.Formatter does, and gives `context` as the record's
// agentix_context if it has none. Returns the bytes written, or -1 having
// written nothing when the record needs the general path: any other record,
// a message that does not format or encode, or a line of `room` bytes or
// more (room < 0: no limit; the caller rotates first). Raises OSError if
// the write fails.
PyObject* WriteLogLine(PyObject* module, PyObject* const* args,
                       Py_ssize_t nargs);

// The durable log file through a mapping (mapped_log.h), for the driver:
// map_log(fd) -> mapping (a capsule; OSError if the file cannot be mapped),
// append_log(mapping, bytes), close_log(mapping) (truncates the file to
// what was appended; idempotent), mapped_log_length(mapping) -> int.
// Failures raise OSError.
PyObject* MapLog(PyObject* module, PyObject* const* args, Py_ssize_t nargs);
PyObject* AppendLog(PyObject* module, PyObject* const* args, Py_ssize_t nargs);
PyObject* CloseLog(PyObject* module, PyObject* const* args, Py_ssize_t nargs);
PyObject* MappedLogLength(PyObject* module, PyObject* const* args,
                          Py_ssize_t nargs);

}  // namespace agentix::worker
