#include "sandbox/log_buffer.h"

#include <array>
#include <chrono>
#include <cstring>
#include <optional>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/utf8.h"
#include "wire/wire_limits.h"

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

// The value of each hex digit, -1 for any other byte. A span carries 64
// hex digits to decode; a compare chain per digit was ~5% of the daemon's
// CPU in a span burst.
constexpr std::array<int8_t, 256> kHexValue = [] {
  std::array<int8_t, 256> value{};
  for (int c = 0; c < 256; ++c) {
    value[c] = c >= '0' && c <= '9'   ? static_cast<int8_t>(c - '0')
               : c >= 'a' && c <= 'f' ? static_cast<int8_t>(c - 'a' + 10)
               : c >= 'A' && c <= 'F' ? static_cast<int8_t>(c - 'A' + 10)
                                      : int8_t{-1};
  }
  return value;
}();

// "trace_<32 hex>" / "span_<24 hex>" -> the OpenTelemetry byte id of
// `bytes` (at most 16) bytes (leading hex digits) in `out`; false (`out`
// unspecified) if the id is not of that form.
bool OtelIdBytes(std::string_view agentix_id, size_t bytes, char* out) {
  const size_t underscore = agentix_id.find('_');
  const std::string_view hex = underscore == std::string_view::npos
                                   ? agentix_id
                                   : agentix_id.substr(underscore + 1);
  if (hex.size() < 2 * bytes) return false;
  const auto* digits = reinterpret_cast<const unsigned char*>(hex.data());
  for (size_t i = 0; i < bytes; ++i) {
    const int high = kHexValue[digits[2 * i]];
    const int low = kHexValue[digits[2 * i + 1]];
    if ((high | low) < 0) return false;
    out[i] = static_cast<char>((high << 4) | low);
  }
  return true;
}

std::string OtelId(std::string_view agentix_id, size_t bytes) {
  char id[16];
  return OtelIdBytes(agentix_id, bytes, id) ? std::string(id, bytes) : "";
}

// The tags of TraceEvent's OpenTelemetry ids (bytes: wire type 2).
constexpr char kTraceIdTag = '\x1a';       // 3
constexpr char kSpanIdTag = '\x22';        // 4
constexpr char kParentSpanIdTag = '\x2a';  // 5

// Encodes the OpenTelemetry id derived from `agentix_id` as protobuf's
// serializer writes the field (`bytes` < 128: a one-byte length) at
// `out + *n`, advancing `*n`; nothing if it has none (proto3 leaves an
// empty field out).
void EncodeOtelId(char tag, std::string_view agentix_id, size_t bytes,
                  char* out, size_t* n) {
  char id[16];
  if (!OtelIdBytes(agentix_id, bytes, id)) return;
  out[(*n)++] = tag;
  out[(*n)++] = static_cast<char>(bytes);
  std::memcpy(out + *n, id, bytes);
  *n += bytes;
}

// What the checks need to know of a field of runtime.proto's messages.
enum class FieldKind {
  kOther,
  kString,
  kAttribute,
  kAttributeValue,
  kSpanEvent,
};
using KindOf = FieldKind (*)(uint32_t number);

FieldKind LogRecordField(uint32_t number) {
  switch (number) {
    case 2: case 4: case 5: case 7: case 9: case 10: case 11: case 13:
    case 14: case 15: case 17:
      return FieldKind::kString;
    default:
      return FieldKind::kOther;  // varints and `extras` (bytes)
  }
}
FieldKind AttributeValueField(uint32_t number) {
  return number == 1 ? FieldKind::kString : FieldKind::kOther;
}
FieldKind AttributeField(uint32_t number) {
  return number == 1   ? FieldKind::kString
         : number == 2 ? FieldKind::kAttributeValue
                       : FieldKind::kOther;
}
FieldKind SpanEventField(uint32_t number) {
  return number == 1   ? FieldKind::kString
         : number == 3 ? FieldKind::kAttribute
                       : FieldKind::kOther;
}
FieldKind TraceEventField(uint32_t number) {
  switch (number) {
    case 6: case 7: case 8: case 9: case 15: case 16: case 18: case 19:
      return FieldKind::kString;
    case 12: case 17:
      return FieldKind::kAttribute;
    case 13:
      return FieldKind::kSpanEvent;
    default:
      return FieldKind::kOther;
  }
}

inline bool ReadVarint(const unsigned char*& p, const unsigned char* end,
                       uint64_t& out) {
  // Tags, lengths and most values of these messages are one byte.
  if (p != end && *p < 0x80) {
    out = *p++;
    return true;
  }
  out = 0;
  for (int shift = 0; shift <= 63; shift += 7) {
    if (p == end) return false;
    const unsigned b = *p++;
    if (shift == 63 && b > 1) return false;  // more than 64 bits
    out |= static_cast<uint64_t>(b & 0x7F) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

// The visitor of nested messages (one type, so CheckMessage is
// instantiated once for them).
struct IgnoreFields {
  void operator()(uint64_t, std::string_view) const {}
};
struct IgnoreNumbers {
  void operator()(uint64_t) const {}
};

// Whether `bytes` is a well-formed message whose fields `kind_of` names,
// every string field (nested ones too) valid UTF-8: what a host's parse of
// the response needs. `visit(number, value)` sees each length-delimited
// field of the top level, `number_seen(number)` the number of every field
// of the top level. Stricter than protobuf where that costs nothing
// (no groups, no over-long varints): what this refuses takes the full parse.
template <typename Visit, typename NumberSeen = IgnoreNumbers>
bool CheckMessage(std::string_view bytes, KindOf kind_of, Visit&& visit,
                  NumberSeen&& number_seen = {}) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const auto* const end = p + bytes.size();
  while (p < end) {
    uint64_t tag;
    if (!ReadVarint(p, end, tag)) return false;
    const uint64_t number = tag >> 3;
    if (number == 0 || number > 536870911) return false;
    number_seen(number);
    switch (tag & 7) {
      case 0: {
        uint64_t ignored;
        if (!ReadVarint(p, end, ignored)) return false;
        break;
      }
      case 1:
        if (end - p < 8) return false;
        p += 8;
        break;
      case 5:
        if (end - p < 4) return false;
        p += 4;
        break;
      case 2: {
        uint64_t len;
        if (!ReadVarint(p, end, len)) return false;
        if (len > static_cast<uint64_t>(end - p)) return false;
        const std::string_view value(reinterpret_cast<const char*>(p), len);
        p += len;
        const IgnoreFields none;
        bool ok = true;
        switch (kind_of(static_cast<uint32_t>(number))) {
          case FieldKind::kString:
            ok = base::IsValidUtf8(value);
            break;
          case FieldKind::kAttribute:
            ok = CheckMessage(value, AttributeField, none);
            break;
          case FieldKind::kAttributeValue:
            ok = CheckMessage(value, AttributeValueField, none);
            break;
          case FieldKind::kSpanEvent:
            ok = CheckMessage(value, SpanEventField, none);
            break;
          case FieldKind::kOther:
            break;
        }
        if (!ok) return false;
        visit(number, value);
        break;
      }
      default:  // groups (3, 4) and the unused 6, 7
        return false;
    }
  }
  return true;
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

LogRecord DropWarning(uint64_t dropped, bool at_most, size_t capacity,
                      const std::string& what) {
  return RuntimeWarning(
      "agentix.sandbox",
      absl::StrCat(at_most ? "at most " : "", dropped, " sandbox ", what,
                   " were dropped: the daemon's buffer (", capacity,
                   " entries) filled up before a host received them"));
}

LogRecordWire ToWireLogRecord(std::string bytes, const std::string& worker_id,
                              std::string* call_id) {
  std::string_view call;
  bool daemon_field = false;  // seq or worker_id: the daemon's to set
  // Checked, not decoded: the worker's bytes become the record's body as
  // they are (moved, not parsed); a record carrying a field the daemon owns
  // is parsed, so that field is the daemon's and appears once.
  if (bytes.size() + kDaemonFieldBytes <= kMaxWireItemBytes &&
      CheckMessage(
          bytes, LogRecordField,
          [&](uint64_t number, std::string_view value) {
            if (number == 14) call = value;  // the last one wins
          },
          [&](uint64_t number) {
            daemon_field |= number == 1 || number == 13;
          }) &&
      !daemon_field) {
    call_id->assign(call);  // before `bytes` moves: `call` points into it
    LogRecordWire w(std::move(bytes));
    w.set_worker_id(worker_id);
    return w;
  }
  // Too big, malformed, not UTF-8 or carrying the daemon's fields (forged):
  // decoded, cut or replaced as before.
  const LogRecord full = ToLogRecord(bytes, worker_id);
  *call_id = full.call_id();
  return WireOf(full);
}

std::optional<TraceEventWire> ToWireTraceEvent(std::string bytes,
                                               const std::string& worker_id,
                                               std::string* call_id) {
  std::string_view trace, span, parent, call;
  bool daemon_field = false;  // a field only the daemon may set
  if (bytes.size() + kDaemonFieldBytes <= kMaxWireItemBytes &&
      CheckMessage(
          bytes, TraceEventField,
          [&](uint64_t number, std::string_view value) {
            if (number == 6) trace = value;  // the last one wins
            else if (number == 7) span = value;
            else if (number == 8) parent = value;
            else if (number == 18) call = value;
          },
          [&](uint64_t number) {
            daemon_field |= number == 1 || number == 3 || number == 4 ||
                            number == 5 || number == 19;
          }) &&
      !daemon_field) {
    // The worker's bytes become the event's body without a copy, the
    // OpenTelemetry ids its suffix. The ids are encoded first: `trace`,
    // `span`, `parent` and `call` point into `bytes`.
    char ids[kOtelIdsBytes];
    size_t n = 0;
    EncodeOtelId(kTraceIdTag, trace, 16, ids, &n);
    EncodeOtelId(kSpanIdTag, span, 8, ids, &n);
    EncodeOtelId(kParentSpanIdTag, parent, 8, ids, &n);
    call_id->assign(call);
    TraceEventWire w(std::move(bytes), std::string_view(ids, n));
    w.set_worker_id(worker_id);
    return w;
  }
  // Too big, malformed, not UTF-8 or carrying the daemon's fields (forged):
  // decoded, cut or replaced as before (its ids land in the body).
  std::optional<TraceEvent> full = ToTraceEvent(bytes, worker_id);
  if (!full.has_value()) return std::nullopt;
  *call_id = full->call_id();
  return WireOf(*full);
}

namespace {
// A full message as buffered: its seq and worker_id taken out, the rest
// serialized as the body.
template <typename Wire, typename Full>
Wire WireOfFull(Full full) {
  const uint64_t seq = full.seq();
  std::string worker_id = std::move(*full.mutable_worker_id());
  full.clear_seq();
  full.clear_worker_id();
  Wire wire(full.SerializeAsString());
  wire.set_seq(seq);
  wire.set_worker_id(worker_id);
  return wire;
}
// A buffered record parsed back (the full message's parse of its bytes).
template <typename Full, typename Wire>
Full FullOfWire(const Wire& wire) {
  Full full;
  full.ParseFromString(wire.SerializeAsString());
  return full;
}
}  // namespace

LogRecordWire WireOf(const LogRecord& record) {
  return WireOfFull<LogRecordWire>(record);
}
LogRecord FullOf(const LogRecordWire& record) {
  return FullOfWire<LogRecord>(record);
}
TraceEventWire WireOf(const TraceEvent& event) {
  return WireOfFull<TraceEventWire>(event);
}
TraceEvent FullOf(const TraceEventWire& event) {
  return FullOfWire<TraceEvent>(event);
}

uint64_t LogBuffer::Append(std::vector<LogRecord> records) {
  std::vector<LogRecordWire> wire;
  wire.reserve(records.size());
  for (const LogRecord& r : records) wire.push_back(WireOf(r));
  return Append(std::move(wire));
}

std::unique_ptr<LogBuffer> MakeLogBuffer(size_t capacity) {
  return std::make_unique<LogBuffer>(
      capacity, "log",
      [](uint64_t dropped, bool at_most, size_t cap,
         const std::string& /*client: the buffer routes its record*/)
          -> std::optional<LogRecordWire> {
        return WireOf(DropWarning(dropped, at_most, cap, "log records"));
      },
      /*reports_into_self=*/true);
}

std::unique_ptr<TraceBuffer> MakeTraceBuffer(size_t capacity,
                                             LogBuffer* logs) {
  return std::make_unique<TraceBuffer>(
      capacity, "trace",
      [logs](uint64_t dropped, bool at_most, size_t cap,
             const std::string& client) -> std::optional<TraceEventWire> {
        // Lock order trace -> log; the log buffer never calls back here.
        // A report for one client goes to that client's Logs streams (one
        // that named no client cannot be told from others: to all).
        std::vector<std::string> owners;
        if (!client.empty()) owners.push_back(client);
        logs->Append(
            {WireOf(DropWarning(dropped, at_most, cap, "trace events"))},
                     owners);
        return std::nullopt;
      },
      /*reports_into_self=*/false);
}

}  // namespace agentix::sandbox
