// The Python edge of log replay's common case, part of the _native_calls
// extension: a LogReplayer replays one Logs batch's records into the host's
// logging, as logs.RecordBatch.replay does, without a Python frame per
// record.
//
// LogReplayer(fields_type, loggers, logging_module, relative_ms, base_for,
//             fallback, is_enabled_for, make_record, handle)
//
// Called with one record, it does RecordBatch.replay's templated path when
// every condition of that path holds and it can see so before anything
// observable has run: the record is a `fields_type` (LogRecordFields) whose
// logger name is in `loggers` (logs._loggers) within the name bound, its
// level in 0..MAX_CACHED_LEVEL, no extras, a time, and the logger's class
// keeps `make_record` (the stdlib's Logger.makeRecord). Then: the logger's
// isEnabledFor (read in C while the class keeps `is_enabled_for` and its
// _cache answers), the record as `logging.LogRecord` made by
// object.__new__ with a copy of `base_for(name, level, record)`'s dict
// plus the record's own seven attributes (the same dict _from_template
// makes, in the same order), and handle / callHandlers as replay calls
// them. Anything else is handed to `fallback` (RecordBatch.replay) whole,
// before any of those steps. Exceptions from handlers propagate.
#ifndef AGENTIX_HOST_PYTHON_NATIVE_LOG_REPLAY_H_
#define AGENTIX_HOST_PYTHON_NATIVE_LOG_REPLAY_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace agentix::host {

// Readies the LogReplayer type and adds it to `module`; false with a
// Python exception set on failure. Once, at import.
bool AddLogReplayType(PyObject* module);

}  // namespace agentix::host

#endif  // AGENTIX_HOST_PYTHON_NATIVE_LOG_REPLAY_H_
