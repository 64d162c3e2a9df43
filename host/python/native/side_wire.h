// Decodes the daemon's LogsResponse and TracesResponse
// (agentix/runtime/v1/runtime.proto) from their wire form, for the host's
// log and trace replay: the Python protobuf runtime costs the host's event
// loop ~0.85 µs a record (~2.5 µs a span's two events) to parse, and the
// replay thread ~0.6 µs a record more to read the fields back out.
//
// Exact or nothing, as namespace_wire.h: a message is decoded only when the
// decoder is sure protobuf would accept it and read the same values;
// anything else (truncation, invalid UTF-8, groups, a known field with an
// unexpected wire type, ...) yields nullopt, and the caller parses the
// message with protobuf, which then reports the error as before.
// side_wire_test.cc (against the generated C++ parser) and
// tests/test_side_wire.py (against Python's) check that promise on damaged
// messages.
#ifndef AGENTIX_HOST_PYTHON_NATIVE_SIDE_WIRE_H_
#define AGENTIX_HOST_PYTHON_NATIVE_SIDE_WIRE_H_

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace agentix::host {

// One LogRecord, every field (views into the decoded bytes; strings are
// valid UTF-8). Field numbers in the comments.
struct LogRecordView {
  uint64_t seq = 0;                  // 1
  std::string_view logger;           // 2
  int32_t level = 0;                 // 3
  std::string_view level_name;       // 4
  std::string_view message;          // 5
  int64_t time_unix_nanos = 0;       // 6
  std::string_view file;             // 7
  int32_t line = 0;                  // 8
  std::string_view function;         // 9
  std::string_view module;           // 10
  std::string_view exception_text;   // 11
  int32_t origin = 0;                // 12 (an open enum: any int32)
  std::string_view worker_id;        // 13
  std::string_view call_id;          // 14
  std::string_view context;          // 15
  std::string_view extras;           // 16 (bytes)
  std::string_view stack_info;       // 17
};

struct LogsResponseView {
  std::string_view instance_id;
  std::vector<LogRecordView> records;
};

std::optional<LogsResponseView> DecodeLogsResponse(std::string_view bytes);

// An Attribute: its key and the set member of its AttributeValue oneof.
struct AttributeView {
  enum class Kind { kUnset, kString, kBool, kInt, kDouble, kBytes };
  std::string_view key;
  Kind kind = Kind::kUnset;
  std::string_view text;  // kString, kBytes
  int64_t integer = 0;    // kInt; kBool: 0 or 1
  double number = 0;      // kDouble
};

// A SpanEventRecord.
struct SpanEventView {
  std::string_view name;
  int64_t time_unix_nanos = 0;
  std::vector<AttributeView> attributes;
};

// A TraceEvent: every field the host replays. The OpenTelemetry ids (3, 4,
// 5: bytes) are checked for their wire form but not returned.
struct TraceEventView {
  uint64_t seq = 0;                        // 1
  int32_t kind = 0;                        // 2
  std::string_view agentix_trace_id;       // 6
  std::string_view agentix_span_id;        // 7
  std::string_view agentix_parent_id;      // 8
  std::string_view name;                   // 9
  int64_t start_time_unix_nanos = 0;       // 10
  int64_t end_time_unix_nanos = 0;         // 11
  std::vector<AttributeView> attributes;   // 12
  std::vector<SpanEventView> events;       // 13
  int32_t status = 0;                      // 14
  std::string_view status_description;     // 15
  std::string_view error_message;          // 16
  std::vector<AttributeView> error_data;   // 17
  std::string_view call_id;                // 18
  std::string_view worker_id;              // 19
};

struct TracesResponseView {
  std::string_view instance_id;
  std::vector<TraceEventView> events;
};

std::optional<TracesResponseView> DecodeTracesResponse(std::string_view bytes);

// The same into `*out`, which keeps its vectors' capacity from one response
// to the next: the host decodes a response of ~1,300 spans or ~750 records
// every few milliseconds in a burst, and a fresh vector that size each time
// was fresh memory to fault in (~3% of the host's CPU a span). False where
// the functions above give nullopt (*out then holds a partial decode).
bool DecodeLogsResponseInto(std::string_view bytes, LogsResponseView* out);
bool DecodeTracesResponseInto(std::string_view bytes, TracesResponseView* out);

}  // namespace agentix::host

#endif  // AGENTIX_HOST_PYTHON_NATIVE_SIDE_WIRE_H_
