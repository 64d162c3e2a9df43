// The daemon's buffers for the Logs and Traces streams: SeqBuffers of
// LogRecord and TraceEvent, filled from the worker's `log` and `trace`
// frames. Lost log records are reported by a WARNING record in the log
// buffer itself; lost trace events by a WARNING record in the log buffer.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agentix/runtime/v1/runtime.pb.h"
#include "sandbox/seq_buffer.h"
#include "sandbox/side_record.h"

namespace agentix::sandbox {

// The buffers hold records as the worker sent them (side_record.h): the
// daemon checks the bytes, sets the fields it owns, and the Logs / Traces
// streams write them without decoding and re-encoding every field.
class LogBuffer : public SeqBuffer<LogRecordWire> {
 public:
  using SeqBuffer::SeqBuffer;
  using SeqBuffer::Append;
  // Appends records the daemon made itself (warnings), as Append does.
  uint64_t Append(std::vector<runtime::v1::LogRecord> records);
};
using LogRecordPtr = LogBuffer::RecordPtr;
using LogSubscriber = LogBuffer::Subscriber;
using TraceBuffer = SeqBuffer<TraceEventWire>;
using TraceEventPtr = TraceBuffer::RecordPtr;
using TraceSubscriber = TraceBuffer::Subscriber;

// What the daemon keeps of a worker's `log` frame (ipc::Frame::record, a
// serialized LogRecord): the bytes as they came when they are a well-formed
// LogRecord (every string field valid UTF-8) that fits the wire limit,
// else what ToLogRecord makes of them (cut to fit, or the WARNING record).
// seq is left for the buffer; worker_id is `worker_id`; `*call_id` (not
// null) gets the record's call_id. Bytes the daemon keeps as they came
// become the record's body without a copy (pass them moved).
LogRecordWire ToWireLogRecord(std::string bytes,
                                    const std::string& worker_id,
                                    std::string* call_id);
// The same for a `trace` frame (a serialized TraceEvent), with the
// OpenTelemetry byte ids derived from the agentix ids; nullopt where
// ToTraceEvent gives nullopt (bytes that do not parse).
std::optional<TraceEventWire> ToWireTraceEvent(
    std::string bytes, const std::string& worker_id, std::string* call_id);

// A full record (event) as the buffer keeps it, and back (tests, warnings).
LogRecordWire WireOf(const runtime::v1::LogRecord& record);
runtime::v1::LogRecord FullOf(const LogRecordWire& record);
TraceEventWire WireOf(const runtime::v1::TraceEvent& event);
runtime::v1::TraceEvent FullOf(const TraceEventWire& event);

// The record a worker's `log` frame carries (ipc::Frame::record, a
// serialized LogRecord), from worker `worker_id`. Bytes that do not parse
// become a WARNING record saying so (origin RUNTIME).
runtime::v1::LogRecord ToLogRecord(const std::string& bytes,
                                   const std::string& worker_id);
// The event a worker's `trace` frame carries (ipc::Frame::record, a
// serialized TraceEvent), from worker `worker_id`, with the daemon's fields
// set (seq cleared for the buffer; the OpenTelemetry byte ids derived from
// the agentix ids). nullopt if the bytes do not parse.
std::optional<runtime::v1::TraceEvent> ToTraceEvent(
    const std::string& bytes, const std::string& worker_id);

// Bound one record (event) to kMaxWireItemBytes so it fits a default
// client's 4 MiB message: long texts are cut with a note, and what cannot
// be cut (msgpack extras; attributes of a trace event) is dropped.
void FitLogRecord(runtime::v1::LogRecord& record);
void FitTraceEvent(runtime::v1::TraceEvent& event);

// A WARNING record from the daemon itself (origin RUNTIME), stamped now.
runtime::v1::LogRecord RuntimeWarning(std::string logger, std::string message);

// The WARNING record that reports `dropped` lost `what` ("log records");
// `at_most`: "at most `dropped`" (an upper bound).
runtime::v1::LogRecord DropWarning(uint64_t dropped, bool at_most,
                                   size_t capacity, const std::string& what);

// A log buffer that reports its own overflow.
std::unique_ptr<LogBuffer> MakeLogBuffer(size_t capacity);
// A trace buffer that reports overflow into `logs` (which must outlive it).
std::unique_ptr<TraceBuffer> MakeTraceBuffer(size_t capacity,
                                             LogBuffer* logs);

}  // namespace agentix::sandbox
