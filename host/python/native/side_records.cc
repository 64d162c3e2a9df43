// See side_records.h. No C++ exception leaves this file: the entry points
// catch and turn them into Python errors.
#include "host/python/native/side_records.h"

#include <array>
#include <cstdint>
#include <cstddef>
#include <exception>
#include <optional>
#include <string_view>
#include <vector>

#include "host/python/native/cxx_errors.h"
#include "host/python/native/side_wire.h"

namespace agentix::host {
namespace {

PyTypeObject* log_record_type = nullptr;
PyTypeObject* trace_event_type = nullptr;
PyTypeObject* span_event_type = nullptr;

// Field names as runtime.proto's, in its order (LogRecord: all of them).
PyStructSequence_Field kLogRecordFields[] = {
    {"seq", nullptr},       {"logger", nullptr},         {"level", nullptr},
    {"level_name", nullptr}, {"message", nullptr},       {"time_unix_nanos", nullptr},
    {"file", nullptr},      {"line", nullptr},           {"function", nullptr},
    {"module", nullptr},    {"exception_text", nullptr}, {"origin", nullptr},
    {"worker_id", nullptr}, {"call_id", nullptr},        {"context", nullptr},
    {"extras", nullptr},    {"stack_info", nullptr},     {nullptr, nullptr},
};
PyStructSequence_Desc kLogRecordDesc = {
    "agentix.runtime.client._native_calls.LogRecordFields",
    "A LogRecord's fields, as log_records decodes them (attributes named as the protobuf fields).",
    kLogRecordFields, 17};

// TraceEvent without the OpenTelemetry ids (3-5). attributes / error_data:
// tuples of (key, value) pairs, value the set oneof member's Python value or
// None; events: a tuple of SpanEventFields.
PyStructSequence_Field kTraceEventFields[] = {
    {"seq", nullptr},
    {"kind", nullptr},
    {"agentix_trace_id", nullptr},
    {"agentix_span_id", nullptr},
    {"agentix_parent_id", nullptr},
    {"name", nullptr},
    {"start_time_unix_nanos", nullptr},
    {"end_time_unix_nanos", nullptr},
    {"attributes", nullptr},
    {"events", nullptr},
    {"status", nullptr},
    {"status_description", nullptr},
    {"error_message", nullptr},
    {"error_data", nullptr},
    {"call_id", nullptr},
    {"worker_id", nullptr},
    {nullptr, nullptr},
};
PyStructSequence_Desc kTraceEventDesc = {
    "agentix.runtime.client._native_calls.TraceEventFields",
    "A TraceEvent's fields as trace_events decodes them (attributes: (key, value) pairs).",
    kTraceEventFields, 16};

PyStructSequence_Field kSpanEventFields[] = {
    {"name", nullptr}, {"time_unix_nanos", nullptr}, {"attributes", nullptr}, {nullptr, nullptr}};
PyStructSequence_Desc kSpanEventDesc = {
    "agentix.runtime.client._native_calls.SpanEventFields",
    "A SpanEventRecord's fields (attributes: (key, value) pairs).", kSpanEventFields, 3};

// Makes the str objects of one response. A field whose text repeats the
// previous item's (logger, file, ids, level name...) gets the previous
// item's object again: fewer allocations, and replay's dict lookups by
// those strings reuse the hash cached in the object.
class Texts {
 public:
  Texts() = default;
  Texts(const Texts&) = delete;
  Texts& operator=(const Texts&) = delete;
  ~Texts() {
    for (Slot& slot : slots_) Py_XDECREF(slot.object);
  }

  // A new reference to `text` (valid UTF-8: checked by the decoder) as str,
  // reusing slot `slot`'s object when its text is the same.
  PyObject* Repeated(size_t slot_index, std::string_view text) {
    Slot& slot = slots_[slot_index];
    if (slot.object != nullptr && slot.text == text) return Py_NewRef(slot.object);
    PyObject* made = Fresh(text);
    if (made == nullptr) return nullptr;
    Py_XSETREF(slot.object, Py_NewRef(made));
    slot.text = text;
    return made;
  }

  // A new str of `text`, not kept.
  static PyObject* Fresh(std::string_view text) {
    return PyUnicode_DecodeUTF8(text.empty() ? "" : text.data(), static_cast<Py_ssize_t>(text.size()),
                                "strict");
  }

  static constexpr size_t kSlots = 16;

 private:
  struct Slot {
    std::string_view text;
    PyObject* object = nullptr;
  };
  std::array<Slot, kSlots> slots_{};
};

PyObject* Bytes(std::string_view bytes) {
  return PyBytes_FromStringAndSize(bytes.empty() ? "" : bytes.data(), static_cast<Py_ssize_t>(bytes.size()));
}

// Fills a struct sequence item by item; the first failure is kept (the
// sequence is then released by the caller).
class Filler {
 public:
  explicit Filler(PyObject* sequence) : sequence_(sequence) {}
  // Steals `item`; nullptr (a failed constructor) marks the fill failed.
  void Add(PyObject* item) {
    if (item == nullptr) {
      ok_ = false;
    } else if (!ok_) {
      Py_DECREF(item);
    } else {
      PyStructSequence_SetItem(sequence_, index_++, item);
    }
  }
  bool ok() const { return ok_; }

 private:
  PyObject* sequence_;
  Py_ssize_t index_ = 0;
  bool ok_ = true;
};

// Slots of Texts for log records and trace events (each field its own).
enum LogSlot : size_t { kLogger, kLevelName, kFile, kFunction, kModule, kWorker, kCall, kContext, kLogSlots };
enum TraceSlot : size_t { kTraceId, kParentId, kName, kTraceCall, kTraceWorker, kKey0, kTraceSlots = kKey0 + 8 };
static_assert(kLogSlots <= Texts::kSlots && kTraceSlots <= Texts::kSlots);

PyObject* NewLogRecord(const LogRecordView& record, Texts& texts) {
  PyObject* out = PyStructSequence_New(log_record_type);
  if (out == nullptr) return nullptr;
  Filler fill(out);
  fill.Add(PyLong_FromUnsignedLongLong(record.seq));
  fill.Add(texts.Repeated(kLogger, record.logger));
  fill.Add(PyLong_FromLong(record.level));
  fill.Add(texts.Repeated(kLevelName, record.level_name));
  fill.Add(Texts::Fresh(record.message));
  fill.Add(PyLong_FromLongLong(record.time_unix_nanos));
  fill.Add(texts.Repeated(kFile, record.file));
  fill.Add(PyLong_FromLong(record.line));
  fill.Add(texts.Repeated(kFunction, record.function));
  fill.Add(texts.Repeated(kModule, record.module));
  fill.Add(Texts::Fresh(record.exception_text));
  fill.Add(PyLong_FromLong(record.origin));
  fill.Add(texts.Repeated(kWorker, record.worker_id));
  fill.Add(texts.Repeated(kCall, record.call_id));
  fill.Add(texts.Repeated(kContext, record.context));
  fill.Add(Bytes(record.extras));
  fill.Add(Texts::Fresh(record.stack_info));
  if (!fill.ok()) Py_CLEAR(out);
  return out;
}

PyObject* AttributeValue(const AttributeView& attribute) {
  switch (attribute.kind) {
    case AttributeView::Kind::kString:
      return Texts::Fresh(attribute.text);
    case AttributeView::Kind::kBool:
      return PyBool_FromLong(static_cast<long>(attribute.integer));
    case AttributeView::Kind::kInt:
      return PyLong_FromLongLong(attribute.integer);
    case AttributeView::Kind::kDouble:
      return PyFloat_FromDouble(attribute.number);
    case AttributeView::Kind::kBytes:
      return Bytes(attribute.text);
    case AttributeView::Kind::kUnset:
      break;
  }
  return Py_NewRef(Py_None);
}

// ((key, value), ...): a tuple, not a list (one allocation; the empty one
// is a singleton). The first keys' objects repeat across items when
// `texts` is given.
PyObject* AttributeList(const std::vector<AttributeView>& attributes, Texts* texts) {
  PyObject* list = PyTuple_New(static_cast<Py_ssize_t>(attributes.size()));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < attributes.size(); ++i) {
    const AttributeView& attribute = attributes[i];
    PyObject* key = texts != nullptr && i < kTraceSlots - kKey0 ? texts->Repeated(kKey0 + i, attribute.key)
                                                                : Texts::Fresh(attribute.key);
    PyObject* value = key == nullptr ? nullptr : AttributeValue(attribute);
    PyObject* pair = value == nullptr ? nullptr : PyTuple_Pack(2, key, value);
    Py_XDECREF(key);
    Py_XDECREF(value);
    if (pair == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyTuple_SET_ITEM(list, static_cast<Py_ssize_t>(i), pair);
  }
  return list;
}

// (SpanEventFields, ...), a tuple as AttributeList's.
PyObject* SpanEventList(const std::vector<SpanEventView>& events) {
  PyObject* list = PyTuple_New(static_cast<Py_ssize_t>(events.size()));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < events.size(); ++i) {
    PyObject* item = PyStructSequence_New(span_event_type);
    if (item != nullptr) {
      Filler fill(item);
      fill.Add(Texts::Fresh(events[i].name));
      fill.Add(PyLong_FromLongLong(events[i].time_unix_nanos));
      fill.Add(AttributeList(events[i].attributes, nullptr));
      if (!fill.ok()) Py_CLEAR(item);
    }
    if (item == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyTuple_SET_ITEM(list, static_cast<Py_ssize_t>(i), item);
  }
  return list;
}

PyObject* NewTraceEvent(const TraceEventView& event, Texts& texts) {
  PyObject* out = PyStructSequence_New(trace_event_type);
  if (out == nullptr) return nullptr;
  Filler fill(out);
  fill.Add(PyLong_FromUnsignedLongLong(event.seq));
  fill.Add(PyLong_FromLong(event.kind));
  fill.Add(texts.Repeated(kTraceId, event.agentix_trace_id));
  fill.Add(Texts::Fresh(event.agentix_span_id));
  fill.Add(texts.Repeated(kParentId, event.agentix_parent_id));
  fill.Add(texts.Repeated(kName, event.name));
  fill.Add(PyLong_FromLongLong(event.start_time_unix_nanos));
  fill.Add(PyLong_FromLongLong(event.end_time_unix_nanos));
  fill.Add(AttributeList(event.attributes, &texts));
  fill.Add(SpanEventList(event.events));
  fill.Add(PyLong_FromLong(event.status));
  fill.Add(Texts::Fresh(event.status_description));
  fill.Add(Texts::Fresh(event.error_message));
  fill.Add(AttributeList(event.error_data, nullptr));
  fill.Add(texts.Repeated(kTraceCall, event.call_id));
  fill.Add(texts.Repeated(kTraceWorker, event.worker_id));
  if (!fill.ok()) Py_CLEAR(out);
  return out;
}

// (instance_id, [make(item) for item in items]) of a decoded response.
template <typename Item, typename Make>
PyObject* ResponseTuple(std::string_view instance_id, const std::vector<Item>& items, Make make) {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(items.size()));
  if (list == nullptr) return nullptr;
  Texts texts;
  for (size_t i = 0; i < items.size(); ++i) {
    PyObject* item = make(items[i], texts);
    if (item == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), item);
  }
  PyObject* id = Texts::Fresh(instance_id);
  if (id == nullptr) {
    Py_DECREF(list);
    return nullptr;
  }
  return Py_BuildValue("(NN)", id, list);
}

// Decodes `message` (any bytes-like object) with `decode` into this
// thread's reused view of its type (side_wire.h says why) and builds the
// result with `build`; None when the decoder leaves the message to
// protobuf. A view whose items grew past kMaxKeptViewBytes is not kept.
constexpr size_t kMaxKeptViewBytes = size_t{4} << 20;

template <typename View, typename Item, typename Build>
PyObject* DecodeMessage(PyObject* message, const char* what, bool (*decode)(std::string_view, View*),
                        std::vector<Item> View::*items, Build build) {
  // `build` allocates Python objects, and a collection that triggers can run
  // finalizers (any Python code): one that decodes again on this thread gets
  // a view of its own rather than this one.
  static thread_local View reused;
  static thread_local bool reused_busy = false;
  View own;
  View* view = reused_busy ? &own : &reused;
  const bool uses_reused = view == &reused;
  Py_buffer buffer;
  if (PyObject_GetBuffer(message, &buffer, PyBUF_SIMPLE) < 0) return nullptr;
  PyObject* result = nullptr;
  if (uses_reused) reused_busy = true;
  try {
    const bool decoded = decode(std::string_view(static_cast<const char*>(buffer.buf), static_cast<size_t>(buffer.len)), view);
    result = decoded ? build(*view) : Py_NewRef(Py_None);
  } catch (...) {
    Py_CLEAR(result);
    SetErrorFromCxx(what);
  }
  if (uses_reused) {
    // Its views point into `buffer`: cleared before it is released.
    (view->*items).clear();
    view->instance_id = {};
    if ((view->*items).capacity() * sizeof(Item) > kMaxKeptViewBytes) (view->*items) = {};
    reused_busy = false;
  }
  PyBuffer_Release(&buffer);
  return result;
}

// `micros` (0 or more) since the epoch as agentix.trace's ISO-8601 UTC
// stamp, "YYYY-MM-DDTHH:MM:SS.ffffffZ" (27 characters), into `out`: the
// text iso_from_unix_micros makes (civil date from days: H. Hinnant's
// algorithm; int64 nanoseconds end in 2262, so the year has four digits).
constexpr size_t kStampChars = 27;
void FormatStamp(int64_t micros, char* out) {
  const int64_t seconds = micros / 1000000;
  const int64_t fraction = micros % 1000000;
  const int64_t days = seconds / 86400;
  const int64_t second_of_day = seconds % 86400;
  const int64_t z = days + 719468;
  const int64_t era = z / 146097;  // z >= 0
  const int64_t doe = z - era * 146097;
  const int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const int64_t mp = (5 * doy + 2) / 153;
  const int64_t day = doy - (153 * mp + 2) / 5 + 1;
  const int64_t month = mp < 10 ? mp + 3 : mp - 9;
  const int64_t year = yoe + era * 400 + (month <= 2);
  auto digits = [&out](size_t at, int64_t value, int count) {
    for (int i = count - 1; i >= 0; --i) {
      out[at + i] = static_cast<char>('0' + value % 10);
      value /= 10;
    }
  };
  digits(0, year, 4);
  out[4] = '-';
  digits(5, month, 2);
  out[7] = '-';
  digits(8, day, 2);
  out[10] = 'T';
  digits(11, second_of_day / 3600, 2);
  out[13] = ':';
  digits(14, second_of_day / 60 % 60, 2);
  out[16] = ':';
  digits(17, second_of_day % 60, 2);
  out[19] = '.';
  digits(20, fraction, 6);
  out[26] = 'Z';
}

// A new str of nanos' stamp, or None for 0 or less (IsoFromUnixNanos's
// text for an int64 already read).
PyObject* StampOrNone(long long nanos) {
  if (nanos <= 0) return Py_NewRef(Py_None);
  PyObject* text = PyUnicode_New(kStampChars, 127);
  if (text == nullptr) return nullptr;
  FormatStamp(nanos / 1000, reinterpret_cast<char*>(PyUnicode_1BYTE_DATA(text)));
  return text;
}

// Span's fields in its __init__'s order, and the other strs span_item
// makes; interned once, at import.
constexpr const char* kSpanFieldNames[] = {"span_id",  "trace_id",   "parent_id", "name",
                                           "attrs",    "started_at", "ended_at",  "status",
                                           "status_description", "error", "events"};
constexpr size_t kSpanFields = sizeof(kSpanFieldNames) / sizeof(kSpanFieldNames[0]);
PyObject* span_field_names[kSpanFields] = {};
PyObject* status_names[3] = {};  // SpanStatusCode UNSET, OK, ERROR as agentix.trace's SpanStatus
PyObject* call_id_key = nullptr;
PyObject* empty_tuple = nullptr;

// TraceEventFields' items span_item reads (kTraceEventFields' order).
enum TraceField : Py_ssize_t {
  kFieldKind = 1, kFieldTraceId, kFieldSpanId, kFieldParentId, kFieldName, kFieldStart, kFieldEnd,
  kFieldAttributes, kFieldEvents, kFieldStatus, kFieldStatusDescription, kFieldErrorMessage,
  kFieldErrorData, kFieldCallId,
};
constexpr long kSpanStart = 3, kSpanEnd = 4;  // TraceEventKind

// The limits traces.py bounds a sandbox's spans by (its MAX_* constants).
struct SpanLimits {
  long long id_chars, name_chars, key_chars, attributes;
};

bool LongerThan(PyObject* text, long long limit) {
  return !PyUnicode_Check(text) || PyUnicode_GET_LENGTH(text) > limit;
}

// attrs of a span event within `limits`: {key: value}, call_id set unless an
// attribute has that key; nullptr with an error set, or with `*declined`
// for an event the Python path must bound.
PyObject* SpanAttrs(PyObject* event, const SpanLimits& limits, bool* declined) {
  PyObject* items = PyStructSequence_GET_ITEM(event, kFieldAttributes);
  if (!PyTuple_Check(items) || PyTuple_GET_SIZE(items) > limits.attributes) {
    *declined = true;
    return nullptr;
  }
  PyObject* attrs = PyDict_New();
  if (attrs == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(items); ++i) {
    PyObject* pair = PyTuple_GET_ITEM(items, i);  // (key, value): AttributeList's
    PyObject* key = PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2 ? PyTuple_GET_ITEM(pair, 0) : nullptr;
    if (key == nullptr || LongerThan(key, limits.key_chars)) {
      *declined = true;
      Py_DECREF(attrs);
      return nullptr;
    }
    if (PyDict_SetItem(attrs, key, PyTuple_GET_ITEM(pair, 1)) < 0) {
      Py_DECREF(attrs);
      return nullptr;
    }
  }
  PyObject* call_id = PyStructSequence_GET_ITEM(event, kFieldCallId);
  if (!PyUnicode_Check(call_id)) {
    *declined = true;
    Py_DECREF(attrs);
    return nullptr;
  }
  if (PyUnicode_GET_LENGTH(call_id) > 0 && PyDict_SetDefault(attrs, call_id_key, call_id) == nullptr) {
    Py_DECREF(attrs);
    return nullptr;
  }
  return attrs;
}

// The Span (of `span_type`, made as Span.__new__ then its fields set in
// __init__'s order) a SPAN_START / SPAN_END event of the common shape
// describes; None (`*declined`) for anything else.
PyObject* NewSpan(PyObject* event, PyTypeObject* span_type, const SpanLimits& limits, bool* declined) {
  *declined = true;
  const long kind = PyLong_AsLong(PyStructSequence_GET_ITEM(event, kFieldKind));
  if (kind != kSpanStart && kind != kSpanEnd) {
    PyErr_Clear();  // not an int: trace_item's path says what is wrong
    return nullptr;
  }
  PyObject* trace_id = PyStructSequence_GET_ITEM(event, kFieldTraceId);
  PyObject* span_id = PyStructSequence_GET_ITEM(event, kFieldSpanId);
  PyObject* parent_id = PyStructSequence_GET_ITEM(event, kFieldParentId);
  PyObject* name = PyStructSequence_GET_ITEM(event, kFieldName);
  PyObject* events = PyStructSequence_GET_ITEM(event, kFieldEvents);
  PyObject* error_message = PyStructSequence_GET_ITEM(event, kFieldErrorMessage);
  PyObject* description = PyStructSequence_GET_ITEM(event, kFieldStatusDescription);
  if (LongerThan(trace_id, limits.id_chars) || LongerThan(span_id, limits.id_chars) ||
      LongerThan(parent_id, limits.id_chars) || LongerThan(name, limits.name_chars) ||
      !PyTuple_Check(events) || PyTuple_GET_SIZE(events) != 0 || LongerThan(error_message, 0) ||
      !PyUnicode_Check(description)) {
    return nullptr;  // events, an error, or a bound to apply: the Python path
  }
  *declined = false;
  PyObject* stamps[] = {PyStructSequence_GET_ITEM(event, kFieldStart), PyStructSequence_GET_ITEM(event, kFieldEnd)};
  PyObject* status_code = PyStructSequence_GET_ITEM(event, kFieldStatus);
  if (!PyLong_CheckExact(stamps[0]) || !PyLong_CheckExact(stamps[1]) || !PyLong_CheckExact(status_code)) {
    *declined = true;
    return nullptr;
  }
  const long long start = PyLong_AsLongLong(stamps[0]);
  const long long end = PyLong_AsLongLong(stamps[1]);
  const long status = PyLong_AsLong(status_code);
  if (PyErr_Occurred()) {  // beyond int64 (not from the decoder): trace_item's path
    PyErr_Clear();
    *declined = true;
    return nullptr;
  }
  PyObject* values[kSpanFields] = {};
  values[0] = Py_NewRef(span_id);
  values[1] = Py_NewRef(trace_id);
  values[2] = Py_NewRef(PyUnicode_GET_LENGTH(parent_id) > 0 ? parent_id : Py_None);
  values[3] = Py_NewRef(name);
  values[4] = SpanAttrs(event, limits, declined);
  values[5] = values[4] == nullptr ? nullptr : StampOrNone(start);
  values[6] = values[5] == nullptr ? nullptr : StampOrNone(end);
  values[7] = Py_NewRef(status_names[status == 1 || status == 2 ? status : 0]);
  values[8] = Py_NewRef(PyUnicode_GET_LENGTH(description) > 0 ? description : Py_None);
  values[9] = Py_NewRef(Py_None);
  values[10] = PyList_New(0);
  PyObject* span = nullptr;
  bool made = values[6] != nullptr && values[10] != nullptr;
  if (made) span = span_type->tp_new(span_type, empty_tuple, nullptr);
  made = span != nullptr;
  for (size_t i = 0; made && i < kSpanFields; ++i) {
    made = PyObject_SetAttr(span, span_field_names[i], values[i]) == 0;
  }
  for (PyObject* value : values) Py_XDECREF(value);
  if (!made) Py_CLEAR(span);
  return span;
}

}  // namespace

PyObject* SpanItem(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6 || !PyType_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError,
                    "span_item() takes (event, span_type, max_id_chars, max_name_chars, max_key_chars, "
                    "max_attributes)");
    return nullptr;
  }
  SpanLimits limits{};
  long long* fields[] = {&limits.id_chars, &limits.name_chars, &limits.key_chars, &limits.attributes};
  for (size_t i = 0; i < 4; ++i) {
    *fields[i] = PyLong_AsLongLong(args[2 + i]);
    if (*fields[i] == -1 && PyErr_Occurred()) return nullptr;
  }
  // Protobuf's TraceEvent (the pure wheel's, or a response only protobuf
  // read) takes the Python path.
  if (Py_TYPE(args[0]) != trace_event_type) return Py_NewRef(Py_None);
  bool declined = false;
  PyObject* span = NewSpan(args[0], reinterpret_cast<PyTypeObject*>(args[1]), limits, &declined);
  if (span == nullptr && declined && !PyErr_Occurred()) return Py_NewRef(Py_None);
  return span;
}

namespace {

// SpanReplayer: EventReplayer.replay's plain span path without a Python frame
// per event (see side_records.h). Declining is the safety rule, as for
// span_item: every check that can send an event to the Python path runs
// before the first step a processor could observe.
enum ReplayName : size_t {
  kProcessorsName, kSkippedName, kDisabledName, kDispatchName, kOnSpanStartName, kOnSpanEndName, kReplayNames,
};
constexpr const char* kReplayNameTexts[kReplayNames] = {"_processors", "_skipped", "_disabled", "_dispatch",
                                                        "on_span_start", "on_span_end"};
PyObject* replay_names[kReplayNames] = {};

struct SpanReplayer {
  PyObject_HEAD
  vectorcallfunc vectorcall;  // SpanReplayer_vectorcall: no argument tuple per event
  PyObject* replayer;         // the traces.EventReplayer whose state (processors, skipped methods) is read
  PyObject* fallback;         // its replay: every event the C path declines
  PyObject* trace_dict;       // agentix.utils.trace's module dict (_processors, _disabled, _dispatch)
  PyObject* span_type;        // agentix.trace's Span
  PyObject* report;           // (processor, method, error): a processor raised (_dispatch's log record)
  SpanLimits limits;
};

void SpanReplayer_dealloc(SpanReplayer* self) {
  Py_XDECREF(self->replayer);
  Py_XDECREF(self->fallback);
  Py_XDECREF(self->trace_dict);
  Py_XDECREF(self->span_type);
  Py_XDECREF(self->report);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

PyObject* SpanReplayer_vectorcall(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames);

PyObject* SpanReplayer_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject *replayer, *fallback, *trace_module, *span_type, *report;
  SpanLimits limits{};
  static const char* kKeywords[] = {"replayer", "fallback", "trace_module", "span_type", "report",
                                    "max_id_chars", "max_name_chars", "max_key_chars", "max_attributes",
                                    nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO!O!OLLLL:SpanReplayer", const_cast<char**>(kKeywords),
                                   &replayer, &fallback, &PyModule_Type, &trace_module, &PyType_Type,
                                   &span_type, &report, &limits.id_chars, &limits.name_chars,
                                   &limits.key_chars, &limits.attributes)) {
    return nullptr;
  }
  if (!PyCallable_Check(fallback) || !PyCallable_Check(report)) {
    PyErr_SetString(PyExc_TypeError, "SpanReplayer: fallback and report must be callable");
    return nullptr;
  }
  PyObject* trace_dict = PyModule_GetDict(trace_module);  // borrowed
  if (trace_dict == nullptr) return nullptr;
  auto* self = reinterpret_cast<SpanReplayer*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->vectorcall = SpanReplayer_vectorcall;
  self->replayer = Py_NewRef(replayer);
  self->fallback = Py_NewRef(fallback);
  self->trace_dict = Py_NewRef(trace_dict);
  self->span_type = Py_NewRef(span_type);
  self->report = Py_NewRef(report);
  self->limits = limits;
  return reinterpret_cast<PyObject*>(self);
}

// agentix.trace's _disabled, read as _dispatch reads it; -1 with an error set.
int TracingDisabled(const SpanReplayer* self) {
  PyObject* disabled = PyDict_GetItemWithError(self->trace_dict, replay_names[kDisabledName]);
  if (disabled == nullptr) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_AttributeError, "agentix.trace has no _disabled");
    return -1;
  }
  return PyObject_IsTrue(disabled);
}

// What the C path does with an event for `method` now.
enum class Step { kError, kDecline, kSkip, kReplay };

// kReplay when the replayer has seen agentix.trace's current processor list
// (else its replay refreshes first), `method` is not one it skips, tracing
// is on and there is a processor (else _dispatch's warning path, declined);
// kSkip (nothing to do) for a skipped method or tracing off when the ids are
// within their bound (else declined: replay refuses it). `*processors` the list.
Step NextStep(const SpanReplayer* self, PyObject* event, PyObject* method, PyObject** processors) {
  *processors = PyDict_GetItemWithError(self->trace_dict, replay_names[kProcessorsName]);
  if (*processors == nullptr) return PyErr_Occurred() ? Step::kError : Step::kDecline;
  PyObject* seen = PyObject_GetAttr(self->replayer, replay_names[kProcessorsName]);
  if (seen == nullptr) return Step::kError;
  Py_DECREF(seen);  // only compared
  if (seen != *processors) return Step::kDecline;
  PyObject* skipped = PyObject_GetAttr(self->replayer, replay_names[kSkippedName]);
  if (skipped == nullptr) return Step::kError;
  int skips = PySequence_Contains(skipped, method);
  Py_DECREF(skipped);
  if (skips == 0) skips = TracingDisabled(self);
  if (skips < 0) return Step::kError;
  if (skips > 0) {
    const TraceField ids[] = {kFieldTraceId, kFieldSpanId, kFieldParentId};
    for (TraceField id : ids) {
      if (LongerThan(PyStructSequence_GET_ITEM(event, id), self->limits.id_chars)) return Step::kDecline;
    }
    return Step::kSkip;
  }
  return PyTuple_CheckExact(*processors) && PyTuple_GET_SIZE(*processors) > 0 ? Step::kReplay : Step::kDecline;
}

// _dispatch(method, span) for the list NextStep saw: each processor's
// method in order, an Exception from one reported (report) and the next
// called; `_dispatch` itself if the list changed meanwhile.
PyObject* Dispatch(const SpanReplayer* self, PyObject* method, PyObject* span, PyObject* processors) {
  const int disabled = TracingDisabled(self);
  if (disabled != 0) return disabled < 0 ? nullptr : Py_NewRef(Py_None);
  PyObject* now = PyDict_GetItemWithError(self->trace_dict, replay_names[kProcessorsName]);
  if (now != processors) {
    PyObject* dispatch = PyDict_GetItemWithError(self->trace_dict, replay_names[kDispatchName]);
    if (dispatch == nullptr) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_AttributeError, "agentix.trace has no _dispatch");
      return nullptr;
    }
    Py_INCREF(dispatch);  // borrowed from a dict Python code may change
    PyObject* argv[] = {method, span};
    PyObject* done = PyObject_Vectorcall(dispatch, argv, 2, nullptr);
    Py_DECREF(dispatch);
    return done;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(processors); ++i) {
    PyObject* processor = PyTuple_GET_ITEM(processors, i);
    PyObject* argv[] = {processor, span};
    PyObject* done = PyObject_VectorcallMethod(method, argv, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
    if (done != nullptr) {
      Py_DECREF(done);
      continue;
    }
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return nullptr;  // as `except Exception:`
    PyObject *type, *error, *traceback;
    PyErr_Fetch(&type, &error, &traceback);
    PyErr_NormalizeException(&type, &error, &traceback);
    if (traceback != nullptr && error != nullptr) PyException_SetTraceback(error, traceback);
    PyObject* report_argv[] = {processor, method, error != nullptr ? error : Py_None};
    PyObject* reported = PyObject_Vectorcall(self->report, report_argv, 3, nullptr);
    Py_XDECREF(type);
    Py_XDECREF(error);
    Py_XDECREF(traceback);
    if (reported == nullptr) return nullptr;
    Py_DECREF(reported);
  }
  return Py_NewRef(Py_None);
}

PyObject* SpanReplayer_vectorcall(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<SpanReplayer*>(callable);
  if (PyVectorcall_NARGS(nargsf) != 1 || (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0)) {
    PyErr_SetString(PyExc_TypeError, "a SpanReplayer takes one event");
    return nullptr;
  }
  PyObject* event = args[0];
  if (Py_TYPE(event) != trace_event_type) return PyObject_CallOneArg(self->fallback, event);
  PyObject* kind_value = PyStructSequence_GET_ITEM(event, kFieldKind);
  const long kind = PyLong_CheckExact(kind_value) ? PyLong_AsLong(kind_value) : -1;
  if (kind == -1 && PyErr_Occurred()) PyErr_Clear();  // beyond long: the Python path
  if (kind != kSpanStart && kind != kSpanEnd) return PyObject_CallOneArg(self->fallback, event);
  PyObject* method = replay_names[kind == kSpanStart ? kOnSpanStartName : kOnSpanEndName];
  PyObject* processors = nullptr;
  switch (NextStep(self, event, method, &processors)) {
    case Step::kError: return nullptr;
    case Step::kDecline: return PyObject_CallOneArg(self->fallback, event);
    case Step::kSkip: return Py_NewRef(Py_None);
    case Step::kReplay: break;
  }
  Py_INCREF(processors);  // held across the processors' calls
  bool declined = false;
  PyObject* span = NewSpan(event, reinterpret_cast<PyTypeObject*>(self->span_type), self->limits, &declined);
  PyObject* done = nullptr;
  if (span != nullptr) {
    done = Dispatch(self, method, span, processors);
    Py_DECREF(span);
  } else if (declined && !PyErr_Occurred()) {
    done = PyObject_CallOneArg(self->fallback, event);
  }
  Py_DECREF(processors);
  return done;
}

PyTypeObject SpanReplayerType = {PyVarObject_HEAD_INIT(nullptr, 0)};

bool AddSpanReplayerType(PyObject* module) {
  for (size_t i = 0; i < kReplayNames; ++i) {
    replay_names[i] = PyUnicode_InternFromString(kReplayNameTexts[i]);
    if (replay_names[i] == nullptr) return false;
  }
  SpanReplayerType.tp_name = "agentix.runtime.client._native_calls.SpanReplayer";
  SpanReplayerType.tp_basicsize = sizeof(SpanReplayer);
  SpanReplayerType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  SpanReplayerType.tp_vectorcall_offset = offsetof(SpanReplayer, vectorcall);
  SpanReplayerType.tp_doc =
      "SpanReplayer(replayer, fallback, trace_module, span_type, report, max_id_chars, max_name_chars, "
      "max_key_chars, max_attributes): called with one trace event, replays it as traces.EventReplayer.replay "
      "does (a plain span start / end in C; anything else through fallback).";
  SpanReplayerType.tp_new = SpanReplayer_new;
  SpanReplayerType.tp_dealloc = reinterpret_cast<destructor>(SpanReplayer_dealloc);
  SpanReplayerType.tp_call = PyVectorcall_Call;
  return PyType_Ready(&SpanReplayerType) == 0 &&
         PyModule_AddObjectRef(module, "SpanReplayer", reinterpret_cast<PyObject*>(&SpanReplayerType)) == 0;
}

}  // namespace

PyObject* IsoFromUnixNanos(PyObject*, PyObject* nanos) {
  if (!PyLong_Check(nanos)) {
    PyErr_Format(PyExc_TypeError, "iso_from_unix_nanos() takes an int, not %.100s", Py_TYPE(nanos)->tp_name);
    return nullptr;
  }
  const long long value = PyLong_AsLongLong(nanos);  // OverflowError beyond int64
  if (value == -1 && PyErr_Occurred()) return nullptr;
  if (value <= 0) return Py_NewRef(Py_None);
  PyObject* text = PyUnicode_New(kStampChars, 127);
  if (text == nullptr) return nullptr;
  FormatStamp(value / 1000, reinterpret_cast<char*>(PyUnicode_1BYTE_DATA(text)));
  return text;
}

PyObject* LogRecords(PyObject*, PyObject* message) {
  return DecodeMessage(message, "native log_records", DecodeLogsResponseInto, &LogsResponseView::records,
                       [](const LogsResponseView& response) {
    return ResponseTuple(response.instance_id, response.records, NewLogRecord);
  });
}

PyObject* TraceEvents(PyObject*, PyObject* message) {
  return DecodeMessage(message, "native trace_events", DecodeTracesResponseInto, &TracesResponseView::events,
                       [](const TracesResponseView& response) {
                         return ResponseTuple(response.instance_id, response.events, NewTraceEvent);
                       });
}

bool AddSideRecordTypes(PyObject* module) {
  for (size_t i = 0; i < kSpanFields; ++i) {
    span_field_names[i] = PyUnicode_InternFromString(kSpanFieldNames[i]);
    if (span_field_names[i] == nullptr) return false;
  }
  const char* statuses[] = {"unset", "ok", "error"};
  for (size_t i = 0; i < 3; ++i) {
    status_names[i] = PyUnicode_InternFromString(statuses[i]);
    if (status_names[i] == nullptr) return false;
  }
  call_id_key = PyUnicode_InternFromString("call_id");
  empty_tuple = PyTuple_New(0);
  if (call_id_key == nullptr || empty_tuple == nullptr) return false;
  log_record_type = PyStructSequence_NewType(&kLogRecordDesc);
  trace_event_type = log_record_type == nullptr ? nullptr : PyStructSequence_NewType(&kTraceEventDesc);
  span_event_type = trace_event_type == nullptr ? nullptr : PyStructSequence_NewType(&kSpanEventDesc);
  return span_event_type != nullptr && AddSpanReplayerType(module) &&
         PyModule_AddObjectRef(module, "LogRecordFields", reinterpret_cast<PyObject*>(log_record_type)) == 0 &&
         PyModule_AddObjectRef(module, "TraceEventFields", reinterpret_cast<PyObject*>(trace_event_type)) == 0 &&
         PyModule_AddObjectRef(module, "SpanEventFields", reinterpret_cast<PyObject*>(span_event_type)) == 0;
}

}  // namespace agentix::host
