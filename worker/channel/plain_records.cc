#include "worker/channel/plain_records.h"

#include <cmath>
#include <cstring>
#include <string>

#include "agentix/runtime/v1/runtime.pb.h"
#include "worker/channel/log_record.h"

namespace agentix::worker {

MessageFields& LogRecordFields() {
  // The daemon numbers records and knows which worker sent them.
  static MessageFields* const fields = new MessageFields(
      runtime::v1::LogRecord::descriptor(), {"seq", "worker_id"});
  return *fields;
}

MessageFields& TraceEventFields() {
  // The daemon numbers events, knows the worker and derives the
  // OpenTelemetry byte ids from the agentix_*_id strings.
  static MessageFields* const fields = new MessageFields(
      runtime::v1::TraceEvent::descriptor(),
      {"seq", "trace_id", "span_id", "parent_span_id", "worker_id"});
  return *fields;
}

namespace {

// The logging.LogRecord attributes send_log_record reads.
enum RecordKey {
  kName,
  kMsg,
  kArgs,
  kLevelno,
  kLevelname,
  kPathname,
  kLineno,
  kFuncName,
  kModule,
  kExcInfo,
  kExcText,
  kStackInfo,
  kCreated,
  kContext,
  kRecordKeys
};
constexpr const char* kRecordKeyNames[kRecordKeys] = {
    "name",      "msg",    "args",     "levelno", "levelname",
    "pathname",  "lineno", "funcName", "module",  "exc_info",
    "exc_text",  "stack_info", "created", "agentix_context"};

// The LogRecord fields send_log_record writes, in the order of the bridge's
// keyword call (send_log): logger, level, level_name, message,
// time_unix_nanos, file, line, function, module, exception_text, origin,
// call_id, context, stack_info (extras: never, such records decline).
enum LogField {
  kLogger,
  kLevel,
  kLevelName,
  kMessage,
  kTime,
  kFile,
  kLine,
  kFunction,
  kModuleField,
  kExceptionText,
  kOrigin,
  kCallId,
  kContextField,
  kStackInfoField,
  kLogFields
};
constexpr const char* kLogFieldNames[kLogFields] = {
    "logger", "level",          "level_name", "message", "time_unix_nanos",
    "file",   "line",           "function",   "module",  "exception_text",
    "origin", "call_id",        "context",    "stack_info"};

// agentix.runtime.v1.LogOrigin LOG_ORIGIN_LOGGING.
constexpr long kOriginLogging = 1;

class RecordValues;

// What send_log_record needs once: the attribute names interned, the
// fields' indexes.
struct RecordReader {
  PyObject* keys[kRecordKeys] = {};
  int fields[kLogFields] = {};
  PyObject* origin = nullptr;

  bool Encode(const RecordValues& values, PyObject* message,
              PyObject* context, PyObject* call_id, std::string& out);
};

RecordReader* MakeRecordReader() {
  auto* reader = new RecordReader;
  bool ok = true;
  for (int i = 0; ok && i < kRecordKeys; ++i) {
    reader->keys[i] = PyUnicode_InternFromString(kRecordKeyNames[i]);
    ok = reader->keys[i] != nullptr;
  }
  for (int i = 0; ok && i < kLogFields; ++i) {
    reader->fields[i] = LogRecordFields().IndexOf(kLogFieldNames[i]);
    if (reader->fields[i] < 0) {
      PyErr_Format(PyExc_SystemError, "LogRecord has no field %s",
                   kLogFieldNames[i]);
      ok = false;
    }
  }
  if (ok) {
    reader->origin = PyLong_FromLong(kOriginLogging);
    ok = reader->origin != nullptr;
  }
  if (ok) return reader;
  for (PyObject* key : reader->keys) Py_XDECREF(key);
  delete reader;
  return nullptr;
}

// Whether every key of a record's __dict__ is in `standard_keys` (a
// frozenset): the keys found standard last time are remembered by position
// (a record's dict has the same interned keys in the same order each time),
// so a key that is the same object as last time costs one comparison instead
// of a set lookup. 1, 0, or -1 with an error set. GIL-guarded.
int OnlyStandardKeys(PyObject* dict, PyObject* standard_keys) {
  constexpr Py_ssize_t kRemembered = 32;
  static PyObject* known_set = nullptr;  // the frozenset `known` was checked in
  static PyObject* known[kRemembered] = {};
  if (standard_keys != known_set) {
    for (PyObject*& key : known) Py_CLEAR(key);
    Py_XSETREF(known_set, Py_NewRef(standard_keys));
  }
  Py_ssize_t pos = 0;
  PyObject* key = nullptr;
  PyObject* value = nullptr;
  for (Py_ssize_t i = 0; PyDict_Next(dict, &pos, &key, &value); ++i) {
    if (i < kRemembered && key == known[i]) continue;
    const int standard = PySet_Contains(standard_keys, key);
    if (standard <= 0) return standard;
    // Held: the same address is then always this key.
    if (i < kRemembered) Py_XSETREF(known[i], Py_NewRef(key));
  }
  return 1;
}

bool IsStrOrNone(PyObject* value) {
  return value == nullptr || value == Py_None || PyUnicode_CheckExact(value);
}

// A record's attribute values, held (formatting the message runs user code
// that could change the record).
class RecordValues {
 public:
  RecordValues() = default;
  RecordValues(const RecordValues&) = delete;
  RecordValues& operator=(const RecordValues&) = delete;
  ~RecordValues() {
    for (PyObject* value : values_) Py_XDECREF(value);
    Py_XDECREF(time_);
  }

  // 1 if `dict` is an ordinary record's (see ChannelSendLogRecord), 0 if
  // not, -1 with an error set.
  int Read(const RecordReader& reader, PyObject* dict,
           PyObject* standard_keys, PyObject* unforwarded) {
    // No extras: every attribute is a standard one (what the bridge's
    // _STANDARD_KEYS.issuperset(record.__dict__) checks).
    const int standard = OnlyStandardKeys(dict, standard_keys);
    if (standard <= 0) return standard;
    for (int i = 0; i < kRecordKeys; ++i) {
      values_[i] = PyDict_GetItemWithError(dict, reader.keys[i]);
      if (values_[i] == nullptr && PyErr_Occurred()) return -1;
      Py_XINCREF(values_[i]);
    }
    // Present, with the types the bridge's general path would send as they
    // are; anything else (None where a value is needed, subclasses whose
    // methods could differ) declines.
    PyObject* name = values_[kName];
    if (name == nullptr || !PyUnicode_CheckExact(name) ||
        values_[kMsg] == nullptr || values_[kArgs] == nullptr ||
        values_[kLevelno] == nullptr || !PyLong_CheckExact(values_[kLevelno]) ||
        values_[kLevelname] == nullptr ||
        !PyUnicode_CheckExact(values_[kLevelname]) ||
        !IsStrOrNone(values_[kPathname]) || !IsStrOrNone(values_[kFuncName]) ||
        !IsStrOrNone(values_[kModule]) || !IsStrOrNone(values_[kStackInfo]) ||
        !IsStrOrNone(values_[kExcText]) ||
        (values_[kLineno] != nullptr && values_[kLineno] != Py_None &&
         !PyLong_CheckExact(values_[kLineno])) ||
        values_[kCreated] == nullptr || !PyFloat_CheckExact(values_[kCreated])) {
      return 0;
    }
    // An exception not yet formatted: the general path formats it (and
    // keeps the text on the record, as logging.Formatter does).
    PyObject* exc_info = values_[kExcInfo];
    if (exc_info != nullptr && exc_info != Py_None && !HasText(kExcText)) {
      return 0;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(unforwarded); ++i) {
      PyObject* prefix = PyTuple_GET_ITEM(unforwarded, i);
      if (!PyUnicode_Check(prefix)) return 0;
      const Py_ssize_t match =
          PyUnicode_Tailmatch(name, prefix, 0, PY_SSIZE_T_MAX, -1);
      if (match != 0) return match < 0 ? -1 : 0;
    }
    // int(record.created * 1e9), where it fits the field.
    const double nanos = PyFloat_AS_DOUBLE(values_[kCreated]) * 1e9;
    if (!std::isfinite(nanos) || std::fabs(nanos) >= 9.2e18) return 0;
    time_ = PyLong_FromLongLong(static_cast<long long>(nanos));
    if (time_ == nullptr) return -1;
    PyObject* context = values_[kContext];
    if (context != nullptr && !PyUnicode_CheckExact(context)) {
      if (PyUnicode_Check(context)) return 0;  // a str subclass: general path
      Py_DECREF(context);
      values_[kContext] = nullptr;  // not a str: the bridge's own context
    }
    return 1;
  }

  // record.getMessage(): str(msg), %-formatted with args if there are any.
  // New reference, or nullptr with an error set.
  PyObject* Message() const {
    return PlainMessage(values_[kMsg], values_[kArgs]);
  }

  // The value of `key` when it is not None (a str or int: "x or default").
  PyObject* Get(RecordKey key) const {
    PyObject* value = values_[key];
    return value == Py_None ? nullptr : value;
  }
  PyObject* Time() const { return time_; }

 private:
  bool HasText(RecordKey key) const {
    PyObject* value = values_[key];
    return value != nullptr && value != Py_None &&
           PyUnicode_GET_LENGTH(value) > 0;
  }

  PyObject* values_[kRecordKeys] = {};
  PyObject* time_ = nullptr;
};

bool RecordReader::Encode(const RecordValues& values, PyObject* message,
                          PyObject* context, PyObject* call_id,
                          std::string& out) {
  MessageFields& f = LogRecordFields();
  // A None or missing optional value is the field's default, which is left
  // out: the same bytes as passing "" or 0.
  auto put = [&](LogField field, PyObject* value) {
    return value == nullptr || f.EncodeField(fields[field], value, out);
  };
  return put(kLogger, values.Get(kName)) && put(kLevel, values.Get(kLevelno)) &&
         put(kLevelName, values.Get(kLevelname)) && put(kMessage, message) &&
         put(kTime, values.Time()) && put(kFile, values.Get(kPathname)) &&
         put(kLine, values.Get(kLineno)) &&
         put(kFunction, values.Get(kFuncName)) &&
         put(kModuleField, values.Get(kModule)) &&
         put(kExceptionText, values.Get(kExcText)) && put(kOrigin, origin) &&
         put(kCallId, call_id) && put(kContextField, context) &&
         put(kStackInfoField, values.Get(kStackInfo));
}

// The agentix.trace Span attributes send_span reads.
enum SpanKey {
  kSpanId,
  kTraceId,
  kParentId,
  kSpanName,
  kAttrs,
  kStartedAt,
  kEndedAt,
  kStatus,
  kStatusDescription,
  kError,
  kEvents,
  kSpanKeys
};
constexpr const char* kSpanKeyNames[kSpanKeys] = {
    "span_id",    "trace_id", "parent_id", "name",
    "attrs",      "started_at", "ended_at", "status",
    "status_description", "error", "events"};

// The TraceEvent fields send_span writes, in the order of the forwarder's
// keyword calls (worker/driver/traces.py on_span_start / on_span_end).
enum SpanField {
  kKindField,
  kTraceIdField,
  kSpanIdField,
  kParentIdField,
  kNameField,
  kStartField,
  kEndField,
  kAttributesField,
  kStatusField,
  kCallIdField,
  kSpanFields
};
constexpr const char* kSpanFieldNames[kSpanFields] = {
    "kind", "agentix_trace_id",      "agentix_span_id",     "agentix_parent_id",
    "name", "start_time_unix_nanos", "end_time_unix_nanos", "attributes",
    "status", "call_id"};

// agentix's own timestamp form, "YYYY-MM-DDTHH:MM:SS.ffffffZ", as Unix
// nanoseconds (the forwarder's _unix_nanos): 1 and `nanos` set, 0 for any
// other form (the forwarder's general path parses those).
int StampNanos(PyObject* stamp, long long& nanos) {
  if (stamp == Py_None) {
    nanos = 0;
    return 1;
  }
  if (!PyUnicode_CheckExact(stamp) || !PyUnicode_IS_ASCII(stamp) ||
      PyUnicode_GET_LENGTH(stamp) != 27) {
    return 0;
  }
  const char* t = static_cast<const char*>(PyUnicode_DATA(stamp));
  static constexpr char kShape[] = "dddd-dd-ddTdd:dd:dd.ddddddZ";
  for (int i = 0; i < 27; ++i) {
    if (kShape[i] == 'd' ? (t[i] < '0' || t[i] > '9') : t[i] != kShape[i]) {
      return 0;
    }
  }
  auto number = [t](int from, int to) {
    long long n = 0;
    for (int i = from; i < to; ++i) n = n * 10 + (t[i] - '0');
    return n;
  };
  // The second's Unix time is kept: a span's stamps (and the next span's)
  // mostly share it.
  static char cached_head[19] = {};  // GIL-guarded
  static long long cached_seconds = 0;
  static bool cached = false;
  if (!cached || std::memcmp(cached_head, t, 19) != 0) {
    const long long year = number(0, 4), month = number(5, 7);
    if (year < 1 || month < 1 || month > 12) return 0;
    // calendar.timegm's days from the civil date (the forwarder's _timegm).
    const long long y = year - (month <= 2);
    const long long era = y / 400, yoe = y % 400;  // y >= 0
    const long long doy =
        (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + number(8, 10) - 1;
    const long long days =
        era * 146097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719468;
    cached_seconds =
        ((days * 24 + number(11, 13)) * 60 + number(14, 16)) * 60 +
        number(17, 19);
    std::memcpy(cached_head, t, 19);
    cached = true;
  }
  // Beyond int64 nanoseconds (before 1677, after 2262) the general path
  // fails as the field cannot hold it.
  constexpr long long kMaxSeconds = 9223372035;
  if (cached_seconds > kMaxSeconds || cached_seconds < -kMaxSeconds) return 0;
  nanos = cached_seconds * 1000000000LL + number(20, 26) * 1000;
  return 1;
}

// A plain attribute value, sent as it is by the forwarder (_attribute_map):
// exactly a str, float, bool, bytes, or an int in int64's range.
bool IsPlainAttribute(PyObject* value) {
  if (PyUnicode_CheckExact(value) || PyFloat_CheckExact(value) ||
      PyBool_Check(value) || PyBytes_CheckExact(value)) {
    return true;
  }
  if (!PyLong_CheckExact(value)) return false;
  int overflow = 0;
  PyLong_AsLongLongAndOverflow(value, &overflow);
  return overflow == 0;
}

// What send_span needs once: attribute names interned, the fields'
// indexes, the kinds and status codes as Python ints.
struct SpanReader {
  PyObject* keys[kSpanKeys] = {};
  int fields[kSpanFields] = {};
  PyObject* span_start = nullptr;  // TRACE_EVENT_KIND_SPAN_START (3)
  PyObject* span_end = nullptr;    // 4
  PyObject* statuses[3] = {};      // "unset", "ok", "error" (interned)
  PyObject* status_codes[3] = {};  // 0, 1, 2

  // 1 with the event's bytes in `out`, 0 if the span needs the general
  // path, -1 with an error set.
  int Encode(bool end, PyObject* kind, PyObject* const* v, PyObject* call_id,
             std::string& out);
};

SpanReader* MakeSpanReader() {
  auto* reader = new SpanReader;
  bool ok = true;
  for (int i = 0; ok && i < kSpanKeys; ++i) {
    reader->keys[i] = PyUnicode_InternFromString(kSpanKeyNames[i]);
    ok = reader->keys[i] != nullptr;
  }
  for (int i = 0; ok && i < kSpanFields; ++i) {
    reader->fields[i] = TraceEventFields().IndexOf(kSpanFieldNames[i]);
    if (reader->fields[i] < 0) {
      PyErr_Format(PyExc_SystemError, "TraceEvent has no field %s",
                   kSpanFieldNames[i]);
      ok = false;
    }
  }
  constexpr const char* kStatuses[3] = {"unset", "ok", "error"};
  for (int i = 0; ok && i < 3; ++i) {
    reader->statuses[i] = PyUnicode_InternFromString(kStatuses[i]);
    reader->status_codes[i] = PyLong_FromLong(i);
    ok = reader->statuses[i] != nullptr && reader->status_codes[i] != nullptr;
  }
  if (ok) {
    // Small ints: CPython's cached objects, compared by identity.
    reader->span_start = PyLong_FromLong(runtime::v1::TRACE_EVENT_KIND_SPAN_START);
    reader->span_end = PyLong_FromLong(runtime::v1::TRACE_EVENT_KIND_SPAN_END);
    ok = reader->span_start != nullptr && reader->span_end != nullptr;
  }
  if (ok) return reader;
  PyErr_SetString(PyExc_SystemError, "send_span: cannot set up");
  delete reader;  // what was made is leaked: only at start-up, never again
  return nullptr;
}

int SpanReader::Encode(bool end, PyObject* kind, PyObject* const* v,
                       PyObject* call_id, std::string& out) {
  // The forwarder's short calls: ids and name as str (no parent: None),
  // stamps in agentix's form, plain attribute values; at the end also no
  // events, error or status description.
  for (SpanKey key : {kSpanId, kTraceId, kSpanName}) {
    if (v[key] == nullptr || !PyUnicode_CheckExact(v[key])) return 0;
  }
  PyObject* parent = v[kParentId];
  if (parent == nullptr || (parent != Py_None && !PyUnicode_CheckExact(parent))) {
    return 0;
  }
  PyObject* attrs = v[kAttrs];
  if (attrs == nullptr || (attrs != Py_None && !PyDict_CheckExact(attrs))) {
    return 0;
  }
  if (attrs != Py_None) {
    Py_ssize_t pos = 0;
    PyObject* key = nullptr;
    PyObject* value = nullptr;
    while (PyDict_Next(attrs, &pos, &key, &value)) {
      if (!PyUnicode_CheckExact(key) || !IsPlainAttribute(value)) return 0;
    }
    if (PyDict_GET_SIZE(attrs) == 0) attrs = Py_None;  // left out
  }
  long long start = 0, finish = 0;
  if (v[kStartedAt] == nullptr || StampNanos(v[kStartedAt], start) == 0) {
    return 0;
  }
  PyObject* status = nullptr;
  if (end) {
    if (v[kEndedAt] == nullptr || StampNanos(v[kEndedAt], finish) == 0 ||
        v[kError] != Py_None || v[kStatusDescription] != Py_None ||
        v[kEvents] == nullptr || !PyList_CheckExact(v[kEvents]) ||
        PyList_GET_SIZE(v[kEvents]) != 0 || v[kStatus] == nullptr) {
      return 0;
    }
    // _SPAN_STATUS.get(span.status, 0), for a str status (anything else
    // could compare equal to one of the names: the general path decides).
    if (!PyUnicode_CheckExact(v[kStatus])) return 0;
    status = status_codes[0];
    for (int i = 0; i < 3; ++i) {
      if (v[kStatus] == statuses[i] ||
          PyUnicode_Compare(v[kStatus], statuses[i]) == 0) {
        status = status_codes[i];
        break;
      }
    }
  }
  MessageFields& f = TraceEventFields();
  auto put = [&](SpanField field, PyObject* value) {
    return value == nullptr || value == Py_None ||
           f.EncodeField(fields[field], value, out);
  };
  // The stamps as C integers: no Python int each.
  bool ok = put(kKindField, kind) && put(kTraceIdField, v[kTraceId]) &&
            put(kSpanIdField, v[kSpanId]) && put(kParentIdField, parent) &&
            put(kNameField, v[kSpanName]) &&
            f.EncodeIntegerField(fields[kStartField], start, out);
  if (ok && end) ok = f.EncodeIntegerField(fields[kEndField], finish, out);
  ok = ok && put(kAttributesField, attrs);
  if (ok && end) ok = put(kStatusField, status);
  ok = ok && put(kCallIdField, call_id);
  return ok ? 1 : -1;
}

}  // namespace

int EncodePlainLogRecord(PyObject* record, PyObject* context,
                         PyObject* call_id, PyObject* standard_keys,
                         PyObject* unforwarded, std::string& out) {
  static RecordReader* reader = nullptr;  // GIL-guarded
  if (reader == nullptr) {
    reader = MakeRecordReader();
    if (reader == nullptr) return -1;
  }
  if (!PyFrozenSet_Check(standard_keys) || !PyTuple_Check(unforwarded)) {
    PyErr_SetString(PyExc_TypeError,
                    "send_log_record: standard_keys must be a frozenset and "
                    "unforwarded a tuple");
    return -1;
  }
  const int plain = IsPlainLogRecord(record);
  if (plain <= 0) return plain;
  PyObject* dict = PyObject_GenericGetDict(record, nullptr);
  if (dict == nullptr) return -1;
  RecordValues values;
  const int read = values.Read(*reader, dict, standard_keys, unforwarded);
  Py_DECREF(dict);
  if (read <= 0) return read;
  // Last, after every reason to decline: formatting runs user code (str()
  // of the message and its arguments), which the general path would run
  // again.
  PyObject* message = values.Message();
  if (message == nullptr) {
    PyErr_Clear();  // the general path reports the failure in the record
    return 0;
  }
  if (values.Get(kContext) != nullptr) context = values.Get(kContext);
  const bool encoded = reader->Encode(values, message, context, call_id, out);
  Py_DECREF(message);
  return encoded ? 1 : -1;
}

int EncodePlainSpan(PyObject* kind, PyObject* span, PyObject* call_id,
                    PyObject* span_type, std::string& out) {
  static SpanReader* reader = nullptr;  // GIL-guarded
  if (reader == nullptr) {
    reader = MakeSpanReader();
    if (reader == nullptr) return -1;
  }
  const bool end = kind == reader->span_end;
  if ((!end && kind != reader->span_start) || !PyType_Check(span_type)) {
    PyErr_SetString(PyExc_TypeError,
                    "send_span: kind must be 3 or 4 and span_type a class");
    return -1;
  }
  if (reinterpret_cast<PyObject*>(Py_TYPE(span)) != span_type) return 0;
  PyObject* dict = PyObject_GenericGetDict(span, nullptr);
  if (dict == nullptr) return -1;
  // Nothing below runs Python code: the values stay the dict's. A start
  // reads only the attributes before ended_at (the rest are not sent).
  PyObject* v[kSpanKeys] = {};
  const int read = end ? kSpanKeys : kEndedAt;
  for (int i = 0; i < read; ++i) {
    v[i] = PyDict_GetItemWithError(dict, reader->keys[i]);
    if (v[i] == nullptr && PyErr_Occurred()) {
      Py_DECREF(dict);
      return -1;
    }
  }
  const int encoded = reader->Encode(end, kind, v, call_id, out);
  Py_DECREF(dict);
  return encoded;
}

}  // namespace agentix::worker
