#include "sandbox/log_buffer.h"

#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "sandbox/wire_limits.h"

namespace agentix::sandbox {

using runtime::v1::Attribute;
using runtime::v1::LogRecord;
using runtime::v1::TraceEvent;

namespace {

int64_t NowUnixNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// "trace_<32 hex>" / "span_<24 hex>" -> the OpenTelemetry byte id of
// `bytes` bytes (leading hex digits); empty if the id is not of that form.
std::string OtelId(const std::string& agentix_id, size_t bytes) {
  const size_t underscore = agentix_id.find('_');
  const std::string hex = underscore == std::string::npos
                              ? agentix_id
                              : agentix_id.substr(underscore + 1);
  if (hex.size() < 2 * bytes) return "";
  std::string out;
  for (size_t i = 0; i < bytes; ++i) {
    unsigned value = 0;
    for (size_t j = 0; j < 2; ++j) {
      const char c = hex[2 * i + j];
      value <<= 4;
      if (c >= '0' && c <= '9') value |= c - '0';
      else if (c >= 'a' && c <= 'f') value |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') value |= c - 'A' + 10;
      else return "";
    }
    out.push_back(static_cast<char>(value));
  }
  return out;
}

// Room for what the daemon adds to a worker's record or event (seq,
// worker_id, the three OpenTelemetry ids, with their tags and lengths):
// far less than this, but a record near the limit is sized exactly anyway.
constexpr size_t kDaemonFieldBytes = 1024;

}  // namespace

LogRecord ToLogRecord(const std::string& bytes, const std::string& worker_id) {
  LogRecord r;
  // The worker sends the message itself (runtime.proto is the one schema):
  // no field is re-mapped here. Fields this daemon does not know yet stay
  // as unknown fields and reach the host unchanged.
  if (!r.ParseFromString(bytes)) {
    // Only code writing to the channel fd by hand gets here; the record
    // stays visible, in its place, instead of vanishing.
    r = RuntimeWarning(
        "agentix.sandbox",
        absl::StrCat("a log record from the worker could not be decoded (",
                     bytes.size(), " bytes)"));
  }
  r.clear_seq();  // the buffer numbers it
  r.set_worker_id(worker_id);
  // No message over 4 MiB (wire_limits.h). A parsed message serializes to
  // at most its input's bytes plus the fields set here, so a small one is
  // not sized (each ByteSizeLong walks every field; the writer sizes it
  // again anyway).
  if (bytes.size() + kDaemonFieldBytes > kMaxWireItemBytes) FitLogRecord(r);
  return r;
}

void FitLogRecord(LogRecord& r) {
  if (r.ByteSizeLong() <= kMaxWireItemBytes) return;
  // A quarter each for the long texts; names are short or cut harder.
  constexpr size_t kText = kMaxWireItemBytes / 4;
  constexpr size_t kName = 64u << 10;
  TruncateForWire(*r.mutable_message(), kText);
  TruncateForWire(*r.mutable_exception_text(), kText);
  TruncateForWire(*r.mutable_stack_info(), kText);
  for (std::string* name : {r.mutable_logger(), r.mutable_level_name(),
                            r.mutable_file(), r.mutable_function(),
                            r.mutable_module(), r.mutable_call_id(),
                            r.mutable_context()}) {
    TruncateForWire(*name, kName);
  }
  // msgpack cannot be cut: the extras go when the record is too big.
  if (r.ByteSizeLong() > kMaxWireItemBytes) r.clear_extras();
}

std::optional<TraceEvent> ToTraceEvent(const std::string& bytes,
                                       const std::string& worker_id) {
  TraceEvent e;
  // As for log records: the worker sends the message itself, unknown
  // fields pass through. The daemon owns seq, worker_id and the
  // OpenTelemetry byte ids, which it derives from the agentix ids.
  if (!e.ParseFromString(bytes)) return std::nullopt;
  e.clear_seq();  // the buffer numbers it
  e.set_trace_id(OtelId(e.agentix_trace_id(), 16));
  e.set_span_id(OtelId(e.agentix_span_id(), 8));
  e.set_parent_span_id(OtelId(e.agentix_parent_id(), 8));
  e.set_worker_id(worker_id);
  if (bytes.size() + kDaemonFieldBytes > kMaxWireItemBytes) FitTraceEvent(e);
  return e;
}

namespace {

// Cuts every key and string or bytes value in `attributes` to `max_bytes`.
void CutAttributes(
    google::protobuf::RepeatedPtrField<Attribute>& attributes,
    size_t max_bytes) {
  for (Attribute& a : attributes) {
    TruncateForWire(*a.mutable_key(), max_bytes);
    auto* value = a.mutable_value();
    if (value->has_string_value()) {
      TruncateForWire(*value->mutable_string_value(), max_bytes);
    } else if (value->has_bytes_value() &&
               value->bytes_value().size() > max_bytes) {
      value->mutable_bytes_value()->resize(max_bytes);
    }
  }
}

}  // namespace

void FitTraceEvent(TraceEvent& e) {
  const size_t size = e.ByteSizeLong();
  if (size <= kMaxWireItemBytes) return;
  constexpr size_t kText = 256u << 10;
  TruncateForWire(*e.mutable_name(), kText);
  TruncateForWire(*e.mutable_status_description(), kText);
  TruncateForWire(*e.mutable_error_message(), kText);
  TruncateForWire(*e.mutable_agentix_trace_id(), kText);
  TruncateForWire(*e.mutable_agentix_span_id(), kText);
  TruncateForWire(*e.mutable_agentix_parent_id(), kText);
  TruncateForWire(*e.mutable_call_id(), kText);
  // Then every string inside attributes and events, harder each round:
  // counts are kept (the host reports what its own limits drop), and 2 KiB
  // still exceeds the host's 1,024-character names.
  for (size_t cut : {size_t{64} << 10, size_t{8} << 10, size_t{2} << 10}) {
    if (e.ByteSizeLong() <= kMaxWireItemBytes) return;
    CutAttributes(*e.mutable_attributes(), cut);
    CutAttributes(*e.mutable_error_data(), cut);
    for (auto& event : *e.mutable_events()) {
      TruncateForWire(*event.mutable_name(), cut);
      CutAttributes(*event.mutable_attributes(), cut);
    }
  }
  if (e.ByteSizeLong() <= kMaxWireItemBytes) return;
  // Still too many: the attributes, events and error data are replaced by
  // one attribute saying so.
  e.clear_attributes();
  e.clear_events();
  e.clear_error_data();
  Attribute* a = e.add_attributes();
  a->set_key("agentix.truncated");
  a->mutable_value()->set_string_value(absl::StrCat(
      "attributes, events and error data dropped: the event had ", size,
      " bytes, over the ", kMaxWireItemBytes, "-byte wire limit"));
}

LogRecord RuntimeWarning(std::string logger, std::string message) {
  LogRecord warning;
  warning.set_logger(std::move(logger));
  warning.set_level(30);
  warning.set_level_name("WARNING");
  warning.set_message(std::move(message));
  warning.set_time_unix_nanos(NowUnixNanos());
  warning.set_origin(runtime::v1::LOG_ORIGIN_RUNTIME);
  return warning;
}

LogRecord DropWarning(uint64_t dropped, size_t capacity,
                      const std::string& what) {
  return RuntimeWarning(
      "agentix.sandbox",
      absl::StrCat(dropped, " sandbox ", what,
                   " were dropped: the daemon's buffer (", capacity,
                   " entries) filled up before a host received them"));
}

std::unique_ptr<LogBuffer> MakeLogBuffer(size_t capacity) {
  return std::make_unique<LogBuffer>(
      capacity, "log",
      [](uint64_t dropped, size_t cap) -> std::optional<LogRecord> {
        return DropWarning(dropped, cap, "log records");
      },
      /*reports_into_self=*/true);
}

std::unique_ptr<TraceBuffer> MakeTraceBuffer(size_t capacity,
                                             LogBuffer* logs) {
  return std::make_unique<TraceBuffer>(
      capacity, "trace",
      [logs](uint64_t dropped, size_t cap) -> std::optional<TraceEvent> {
        // Lock order trace -> log; the log buffer never calls back here.
        logs->Append({DropWarning(dropped, cap, "trace events")});
        return std::nullopt;
      },
      /*reports_into_self=*/false);
}

}  // namespace agentix::sandbox
