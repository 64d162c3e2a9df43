#include "sandbox/log_buffer.h"

#include <msgpack.hpp>

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

// Bounds for decoding the worker's msgpack payloads: they hold flat maps and
// short lists, so anything deeper or larger is refused (and reported as
// undecodable) instead of being followed.
msgpack::object_handle UnpackBounded(const std::string& packed) {
  const msgpack::unpack_limit limits(/*array=*/4096, /*map=*/4096,
                                     /*str=*/1 << 24, /*bin=*/1 << 24,
                                     /*ext=*/0, /*depth=*/4);
  std::size_t offset = 0;
  return msgpack::unpack(packed.data(), packed.size(), offset, nullptr,
                         nullptr, limits);
}

// Sets `value` from a msgpack scalar; other types become their msgpack
// text form (the worker already sends repr() for non-scalars).
void SetValue(const msgpack::object& o, runtime::v1::AttributeValue& value) {
  switch (o.type) {
    case msgpack::type::STR:
      value.set_string_value(std::string(o.via.str.ptr, o.via.str.size));
      break;
    case msgpack::type::BIN:
      value.set_bytes_value(std::string(o.via.bin.ptr, o.via.bin.size));
      break;
    case msgpack::type::BOOLEAN:
      value.set_bool_value(o.via.boolean);
      break;
    case msgpack::type::POSITIVE_INTEGER:
      value.set_int_value(static_cast<int64_t>(o.via.u64));
      break;
    case msgpack::type::NEGATIVE_INTEGER:
      value.set_int_value(o.via.i64);
      break;
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64:
      value.set_double_value(o.via.f64);
      break;
    default: {
      std::ostringstream text;
      text << o;
      value.set_string_value(text.str());
    }
  }
}

// Appends the entries of a msgpack map of str -> scalar. A payload that is
// not such a map is kept visible as one attribute rather than dropped.
void AppendAttributes(
    const std::string& packed,
    google::protobuf::RepeatedPtrField<Attribute>* attributes) {
  if (packed.empty()) return;
  try {
    msgpack::object_handle handle = UnpackBounded(packed);
    const msgpack::object& root = handle.get();
    if (root.type != msgpack::type::MAP) throw msgpack::type_error();
    for (uint32_t i = 0; i < root.via.map.size; ++i) {
      const auto& kv = root.via.map.ptr[i];
      if (kv.key.type != msgpack::type::STR) continue;
      Attribute* a = attributes->Add();
      a->set_key(std::string(kv.key.via.str.ptr, kv.key.via.str.size));
      SetValue(kv.val, *a->mutable_value());
    }
  } catch (const std::exception& e) {
    Attribute* a = attributes->Add();
    a->set_key("agentix.undecodable_attributes");
    a->mutable_value()->set_string_value(e.what());
  }
}

// Appends span events from a msgpack array of [name, time_unix_nanos, map].
void AppendEvents(const std::string& packed, TraceEvent& event) {
  if (packed.empty()) return;
  try {
    msgpack::object_handle handle = UnpackBounded(packed);
    const msgpack::object& root = handle.get();
    if (root.type != msgpack::type::ARRAY) throw msgpack::type_error();
    for (uint32_t i = 0; i < root.via.array.size; ++i) {
      const msgpack::object& e = root.via.array.ptr[i];
      if (e.type != msgpack::type::ARRAY || e.via.array.size < 2) continue;
      auto* record = event.add_events();
      record->set_name(e.via.array.ptr[0].as<std::string>());
      record->set_time_unix_nanos(e.via.array.ptr[1].as<int64_t>());
      if (e.via.array.size > 2) {
        msgpack::sbuffer attrs;
        msgpack::pack(attrs, e.via.array.ptr[2]);
        AppendAttributes(std::string(attrs.data(), attrs.size()),
                         record->mutable_attributes());
      }
    }
  } catch (const std::exception& e) {
    auto* record = event.add_events();
    record->set_name("agentix.undecodable_events");
  }
}

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
  FitLogRecord(r);  // no message over 4 MiB (wire_limits.h)
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

TraceEvent ToTraceEvent(const ipc::TraceEntry& t,
                        const std::string& worker_id) {
  TraceEvent e;
  e.set_kind(static_cast<runtime::v1::TraceEventKind>(t.kind));
  e.set_trace_id(OtelId(t.trace_id, 16));
  e.set_span_id(OtelId(t.span_id, 8));
  e.set_parent_span_id(OtelId(t.parent_id, 8));
  e.set_agentix_trace_id(t.trace_id);
  e.set_agentix_span_id(t.span_id);
  e.set_agentix_parent_id(t.parent_id);
  e.set_name(t.name);
  e.set_start_time_unix_nanos(t.start_time_unix_nanos);
  e.set_end_time_unix_nanos(t.end_time_unix_nanos);
  AppendAttributes(t.attributes, e.mutable_attributes());
  AppendEvents(t.events, e);
  e.set_status(static_cast<runtime::v1::SpanStatusCode>(t.status));
  e.set_status_description(t.status_description);
  e.set_error_message(t.error_message);
  AppendAttributes(t.error_data, e.mutable_error_data());
  e.set_call_id(t.call_id);
  e.set_worker_id(worker_id);
  FitTraceEvent(e);
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
