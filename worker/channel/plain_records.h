// A plain logging.LogRecord and a plain agentix.trace Span as the protobuf
// bytes (LogRecord, TraceEvent) their keyword sends would write, read from
// their attributes in C: the common case of the log bridge and the trace
// forwarder (send_log_record, send_span in side_channels.h). Anything that
// is not plain is declined, for the driver's general Python path.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string>

#include "worker/channel/proto_fields.h"

namespace agentix::worker {

// The settable fields of LogRecord / TraceEvent (less what the daemon owns),
// shared by the keyword sends and the plain encoders. GIL held.
MessageFields& LogRecordFields();
MessageFields& TraceEventFields();

// send_log_record's encoding (side_channels.h): 1 with the LogRecord bytes
// appended to `out`, 0 if the record is not plain (nothing appended, no
// error), -1 with an error set. GIL held.
int EncodePlainLogRecord(PyObject* record, PyObject* context,
                         PyObject* call_id, PyObject* standard_keys,
                         PyObject* unforwarded, std::string& out);

// send_span's encoding (side_channels.h), with the same results.
int EncodePlainSpan(PyObject* kind, PyObject* span, PyObject* call_id,
                    PyObject* span_type, std::string& out);

}  // namespace agentix::worker
