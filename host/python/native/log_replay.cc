// See log_replay.h. Declining is the safety rule, as for span_item: every
// check that can send a record to the Python path runs before the first
// step that could be observed (isEnabledFor), so a declined record has had
// nothing done to it.
#include "host/python/native/log_replay.h"

#include <cstddef>

namespace agentix::host {
namespace {

// LogRecordFields' items (side_records.cc's order: runtime.proto's).
enum Field : Py_ssize_t {
  kLogger = 1, kLevel = 2, kLevelName = 3, kMessage = 4, kTime = 5, kFile = 6, kLine = 7, kFunction = 8,
  kModule = 9, kExceptionText = 10, kOrigin = 11, kWorkerId = 12, kCallId = 13, kContext = 14, kExtras = 15,
  kStackInfo = 16,
};
// The items a batch's base attributes depend on (RecordBatch._from_template's key).
constexpr Field kKeyFields[] = {kLogger, kLevel, kLevelName, kFile, kFunction, kModule, kOrigin, kWorkerId,
                                kCallId, kContext};
constexpr size_t kKeys = sizeof(kKeyFields) / sizeof(kKeyFields[0]);

// The levels replay asks Logger.isEnabledFor about (logs.MAX_CACHED_LEVEL).
constexpr long kMaxCachedLevel = 100;

enum Name : size_t {
  kDisabledName, kCacheName, kNameName, kFiltersName, kCallHandlersName, kHandleName, kMakeRecordName,
  kIsEnabledForName, kLogRecordName, kDictName,
  // The record's own attributes, in _from_template's order.
  kMsgName, kLinenoName, kCreatedName, kMsecsName, kRelativeCreatedName, kExcTextName, kStackInfoName,
  kNames,
};
constexpr const char* kNameTexts[kNames] = {
    "disabled", "_cache", "name", "filters", "callHandlers", "handle", "makeRecord", "isEnabledFor",
    "LogRecord", "__dict__", "msg", "lineno", "created", "msecs", "relativeCreated", "exc_text", "stack_info",
};
PyObject* names[kNames] = {};
PyObject* empty_tuple = nullptr;

struct Replayer {
  PyObject_HEAD
  vectorcallfunc vectorcall;  // Replayer_vectorcall: no argument tuple per record
  PyObject* fields_type;
  PyObject* loggers;         // logs._loggers (dict: wire name -> Logger)
  PyObject* logging_dict;    // the logging module's dict (LogRecord read per record, as replay does)
  PyObject* record_type;     // logging.LogRecord as logs.py saw it
  double relative_ms;
  Py_ssize_t max_name_chars;
  PyObject* base_for;        // (name, level, record) -> the batch's base dict
  PyObject* fallback;        // RecordBatch.replay
  PyObject* is_enabled_for;  // the stdlib's Logger.isEnabledFor
  PyObject* make_record;     // the stdlib's Logger.makeRecord
  PyObject* handle;          // the stdlib's Logger.handle
  // The base last given by base_for and what it was given for (held, so
  // equal pointers are the same objects). Forgotten whenever the Python
  // path runs (it may have changed the batch's bases).
  PyObject* last_base;
  PyObject* last_logger;
  PyObject* last_name;
  PyObject* last_keys[kKeys];
};

PyObject* Replayer_vectorcall(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames);

void ForgetBase(Replayer* self) {
  Py_CLEAR(self->last_base);
  Py_CLEAR(self->last_logger);
  Py_CLEAR(self->last_name);
  for (PyObject*& key : self->last_keys) Py_CLEAR(key);
}

void Replayer_dealloc(Replayer* self) {
  ForgetBase(self);
  Py_XDECREF(self->fields_type);
  Py_XDECREF(self->loggers);
  Py_XDECREF(self->logging_dict);
  Py_XDECREF(self->record_type);
  Py_XDECREF(self->base_for);
  Py_XDECREF(self->fallback);
  Py_XDECREF(self->is_enabled_for);
  Py_XDECREF(self->make_record);
  Py_XDECREF(self->handle);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

PyObject* Replayer_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject *fields_type, *loggers, *logging_module, *record_type, *base_for, *fallback, *is_enabled_for,
      *make_record, *handle;
  double relative_ms;
  Py_ssize_t max_name_chars;
  static const char* kKeywords[] = {"fields_type", "loggers", "logging_module", "record_type", "relative_ms",
                                    "max_name_chars", "base_for", "fallback", "is_enabled_for",
                                    "make_record", "handle", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!O!O!dnOOOOO:LogReplayer", const_cast<char**>(kKeywords),
                                   &PyType_Type, &fields_type, &PyDict_Type, &loggers, &PyModule_Type,
                                   &logging_module, &PyType_Type, &record_type, &relative_ms, &max_name_chars,
                                   &base_for, &fallback, &is_enabled_for, &make_record, &handle)) {
    return nullptr;
  }
  if (!PyCallable_Check(base_for) || !PyCallable_Check(fallback)) {
    PyErr_SetString(PyExc_TypeError, "LogReplayer: base_for and fallback must be callable");
    return nullptr;
  }
  PyObject* logging_dict = PyModule_GetDict(logging_module);  // borrowed
  if (logging_dict == nullptr) return nullptr;
  auto* self = reinterpret_cast<Replayer*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->vectorcall = Replayer_vectorcall;
  self->fields_type = Py_NewRef(fields_type);
  self->loggers = Py_NewRef(loggers);
  self->logging_dict = Py_NewRef(logging_dict);
  self->record_type = Py_NewRef(record_type);
  self->relative_ms = relative_ms;
  self->max_name_chars = max_name_chars;
  self->base_for = Py_NewRef(base_for);
  self->fallback = Py_NewRef(fallback);
  self->is_enabled_for = Py_NewRef(is_enabled_for);
  self->make_record = Py_NewRef(make_record);
  self->handle = Py_NewRef(handle);
  return reinterpret_cast<PyObject*>(self);
}

// The truth of `value` (a new reference, released); -1 for nullptr / an error.
int TruthOf(PyObject* value) {
  if (value == nullptr) return -1;
  const int truth = PyObject_IsTrue(value);
  Py_DECREF(value);
  return truth;
}

// logger.isEnabledFor(level): read in C (the stdlib's `disabled` and _cache)
// while the class keeps the stdlib's method and the cache answers; the method
// itself otherwise (it fills the cache).
int IsEnabled(const Replayer* self, PyObject* logger, PyObject* level) {
  if (_PyType_Lookup(Py_TYPE(logger), names[kIsEnabledForName]) == self->is_enabled_for) {
    const int off = TruthOf(PyObject_GetAttr(logger, names[kDisabledName]));
    if (off != 0) return off < 0 ? -1 : 0;
    PyObject* cache = PyObject_GetAttr(logger, names[kCacheName]);
    if (cache == nullptr) return -1;
    if (PyDict_CheckExact(cache)) {
      PyObject* hit = Py_XNewRef(PyDict_GetItemWithError(cache, level));
      Py_DECREF(cache);
      if (hit != nullptr) return TruthOf(hit);
      if (PyErr_Occurred()) return -1;
    } else {
      Py_DECREF(cache);
    }
  }
  PyObject* argv[] = {logger, level};
  return TruthOf(PyObject_VectorcallMethod(names[kIsEnabledForName], argv, 2, nullptr));
}

// The batch's base attributes for `logger`'s record of `item` (a new
// reference): the last ones when every key is the same object, else
// base_for(name, level, item)'s (then remembered).
PyObject* BaseFor(Replayer* self, PyObject* logger, PyObject* item) {
  PyObject* name = PyObject_GetAttr(logger, names[kNameName]);
  if (name == nullptr) return nullptr;
  bool same = self->last_base != nullptr && self->last_logger == logger && self->last_name == name;
  for (size_t i = 0; same && i < kKeys; ++i) {
    same = self->last_keys[i] == PyStructSequence_GET_ITEM(item, kKeyFields[i]);
  }
  if (same) {
    Py_DECREF(name);
    return Py_NewRef(self->last_base);
  }
  PyObject* argv[] = {name, PyStructSequence_GET_ITEM(item, kLevel), item};
  PyObject* base = PyObject_Vectorcall(self->base_for, argv, 3, nullptr);
  if (base == nullptr || !PyDict_Check(base)) {
    if (base != nullptr) PyErr_SetString(PyExc_TypeError, "LogReplayer: base_for must return a dict");
    Py_XDECREF(base);
    Py_DECREF(name);
    return nullptr;
  }
  ForgetBase(self);
  self->last_base = Py_NewRef(base);
  self->last_logger = Py_NewRef(logger);
  self->last_name = name;  // the reference GetAttr gave
  for (size_t i = 0; i < kKeys; ++i) self->last_keys[i] = Py_NewRef(PyStructSequence_GET_ITEM(item, kKeyFields[i]));
  return base;
}

// The replayed record: object.__new__(LogRecord) with a copy of `base` plus
// the item's own attributes as its __dict__ (_from_template's).
PyObject* MakeRecord(const Replayer* self, PyObject* base, PyObject* item, long long nanos) {
  PyObject* attrs = PyDict_Copy(base);
  if (attrs == nullptr) return nullptr;
  const double created = static_cast<double>(nanos) / 1e9;
  const double created_ms = created * 1000;  // two roundings, as Python's `created * 1000 + relative`
  PyObject* values[7] = {
      Py_NewRef(PyStructSequence_GET_ITEM(item, kMessage)),
      Py_NewRef(PyStructSequence_GET_ITEM(item, kLine)),
      PyFloat_FromDouble(created),
      PyFloat_FromDouble(static_cast<double>(nanos % 1000000000 / 1000000)),
      PyFloat_FromDouble(created_ms + self->relative_ms),
      nullptr,
      nullptr,
  };
  bool ok = values[2] != nullptr && values[3] != nullptr && values[4] != nullptr;
  const Field texts[] = {kExceptionText, kStackInfo};  // `text or None`
  for (size_t i = 0; ok && i < 2; ++i) {
    PyObject* text = PyStructSequence_GET_ITEM(item, texts[i]);
    const int truth = PyObject_IsTrue(text);
    ok = truth >= 0;
    values[5 + i] = Py_NewRef(truth > 0 ? text : Py_None);
  }
  for (size_t i = 0; ok && i < 7; ++i) ok = PyDict_SetItem(attrs, names[kMsgName + i], values[i]) == 0;
  for (PyObject* value : values) Py_XDECREF(value);
  PyObject* record = ok ? PyBaseObject_Type.tp_new(reinterpret_cast<PyTypeObject*>(self->record_type),
                                                   empty_tuple, nullptr)
                        : nullptr;
  if (record != nullptr && PyObject_SetAttr(record, names[kDictName], attrs) < 0) Py_CLEAR(record);
  Py_DECREF(attrs);
  return record;
}

// replay's dispatch: Logger.handle without its filter call when the logger
// has no filters (then callHandlers unless disabled), else handle.
int Dispatch(const Replayer* self, PyObject* logger, PyObject* record) {
  PyObject* argv[] = {logger, record};
  if (_PyType_Lookup(Py_TYPE(logger), names[kHandleName]) == self->handle) {
    const int filtered = TruthOf(PyObject_GetAttr(logger, names[kFiltersName]));
    if (filtered < 0) return -1;
    if (filtered == 0) {
      const int off = TruthOf(PyObject_GetAttr(logger, names[kDisabledName]));
      if (off != 0) return off < 0 ? -1 : 0;
      PyObject* done = PyObject_VectorcallMethod(names[kCallHandlersName], argv, 2, nullptr);
      Py_XDECREF(done);
      return done == nullptr ? -1 : 0;
    }
  }
  PyObject* done = PyObject_VectorcallMethod(names[kHandleName], argv, 2, nullptr);
  Py_XDECREF(done);
  return done == nullptr ? -1 : 0;
}

PyObject* Decline(Replayer* self, PyObject* item) {
  ForgetBase(self);
  return PyObject_CallOneArg(self->fallback, item);
}

PyObject* Replayer_vectorcall(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<Replayer*>(callable);
  if (PyVectorcall_NARGS(nargsf) != 1 || (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0)) {
    PyErr_SetString(PyExc_TypeError, "a LogReplayer takes one record");
    return nullptr;
  }
  PyObject* item = args[0];
  if (Py_TYPE(item) != reinterpret_cast<PyTypeObject*>(self->fields_type)) return Decline(self, item);
  // Everything that can send the record to the Python path, before any step
  // of its replay.
  PyObject* wire_name = PyStructSequence_GET_ITEM(item, kLogger);
  if (!PyUnicode_CheckExact(wire_name) || PyUnicode_GET_LENGTH(wire_name) > self->max_name_chars) {
    return Decline(self, item);
  }
  PyObject* logger = PyDict_GetItemWithError(self->loggers, wire_name);
  if (logger == nullptr) return PyErr_Occurred() ? nullptr : Decline(self, item);
  Py_INCREF(logger);
  PyObject* level = PyStructSequence_GET_ITEM(item, kLevel);
  PyObject* stamp = PyStructSequence_GET_ITEM(item, kTime);
  PyObject* extras = PyStructSequence_GET_ITEM(item, kExtras);
  const long level_value = PyLong_CheckExact(level) ? PyLong_AsLong(level) : -1;
  const long long nanos = PyLong_CheckExact(stamp) ? PyLong_AsLongLong(stamp) : -1;
  if (PyErr_Occurred()) PyErr_Clear();  // beyond long / int64: the Python path
  PyObject* record_type = PyDict_GetItemWithError(self->logging_dict, names[kLogRecordName]);
  if (record_type != self->record_type || level_value < 0 || level_value > kMaxCachedLevel || nanos <= 0 ||
      !PyBytes_CheckExact(extras) || PyBytes_GET_SIZE(extras) != 0 ||
      _PyType_Lookup(Py_TYPE(logger), names[kMakeRecordName]) != self->make_record) {
    Py_DECREF(logger);
    return PyErr_Occurred() ? nullptr : Decline(self, item);
  }
  const int present = PyObject_IsTrue(logger);  // replay's `_loggers.get(name) or ...`
  if (present <= 0) {
    Py_DECREF(logger);
    return present < 0 ? nullptr : Decline(self, item);
  }
  int status = IsEnabled(self, logger, level);
  if (status > 0) {
    PyObject* base = BaseFor(self, logger, item);
    PyObject* record = base != nullptr ? MakeRecord(self, base, item, nanos) : nullptr;
    Py_XDECREF(base);
    status = record != nullptr ? Dispatch(self, logger, record) : -1;
    Py_XDECREF(record);
  }
  Py_DECREF(logger);
  return status < 0 ? nullptr : Py_NewRef(Py_None);
}

PyTypeObject ReplayerType = {PyVarObject_HEAD_INIT(nullptr, 0)};

}  // namespace

bool AddLogReplayType(PyObject* module) {
  for (size_t i = 0; i < kNames; ++i) {
    names[i] = PyUnicode_InternFromString(kNameTexts[i]);
    if (names[i] == nullptr) return false;
  }
  empty_tuple = PyTuple_New(0);
  if (empty_tuple == nullptr) return false;
  ReplayerType.tp_name = "agentix.runtime.client._native_calls.LogReplayer";
  ReplayerType.tp_basicsize = sizeof(Replayer);
  ReplayerType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  ReplayerType.tp_vectorcall_offset = offsetof(Replayer, vectorcall);
  ReplayerType.tp_doc =
      "LogReplayer(fields_type, loggers, logging_module, record_type, relative_ms, max_name_chars, base_for, "
      "fallback, is_enabled_for, make_record, handle): called with one record, replays it as "
      "logs.RecordBatch.replay does (its templated path in C; anything else through fallback).";
  ReplayerType.tp_new = Replayer_new;
  ReplayerType.tp_dealloc = reinterpret_cast<destructor>(Replayer_dealloc);
  ReplayerType.tp_call = PyVectorcall_Call;
  return PyType_Ready(&ReplayerType) == 0 &&
         PyModule_AddObjectRef(module, "LogReplayer", reinterpret_cast<PyObject*>(&ReplayerType)) == 0;
}

}  // namespace agentix::host
