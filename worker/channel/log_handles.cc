#include "worker/channel/log_handles.h"

#include "worker/channel/durable_line.h"
#include "worker/channel/py_args.h"

namespace agentix::worker {
namespace {

enum Key {
  kFilters,
  kLock,
  kFormatter,
  kLineFormatter,
  kStream,
  kMapped,
  kFd,
  kContext,
  kRotates,
  kMaxBytes,
  kSize,
  kHandle,
  kEmit,
  kHandleError,
  kAcquire,
  kRelease,
  kKeys
};
constexpr const char* kKeyNames[kKeys] = {
    "filters", "lock",     "formatter", "_line_formatter", "stream",
    "_mapped", "_fd",      "_context",  "_rotates",        "maxBytes",
    "_size",   "handle",   "emit",      "handleError",     "acquire",
    "release"};

PyObject** Keys() {
  static PyObject* keys[kKeys] = {};  // interned; GIL-guarded
  if (keys[kKeys - 1] == nullptr && !InternAll(kKeyNames, kKeys, keys)) {
    return nullptr;
  }
  return keys;
}

// The handler class's own (Python) handle, for what the C handle leaves to
// it: handler filters to run, an unexpected state.
PyObject* ClassHandle(PyObject* handler, PyObject* record) {
  PyObject** keys = Keys();
  if (keys == nullptr) return nullptr;
  PyObject* method = _PyType_Lookup(Py_TYPE(handler), keys[kHandle]);
  if (method == nullptr) {
    PyErr_SetString(PyExc_TypeError, "log handler class without handle");
    return nullptr;
  }
  Py_INCREF(method);
  PyObject* argv[2] = {handler, record};
  PyObject* result = PyObject_Vectorcall(method, argv, 2, nullptr);
  Py_DECREF(method);
  return result;
}

// Handler.handle's `if self.filters`: the handler's own filter list is an
// empty list (anything else: its class's handle decides).
bool NoFilters(PyObject* filters) {
  return filters != nullptr && PyList_CheckExact(filters) &&
         PyList_GET_SIZE(filters) == 0;
}

PyObject* Emit(PyObject* handler, PyObject* record) {
  PyObject* emitted = PyObject_CallMethodOneArg(handler, Keys()[kEmit], record);
  if (emitted == nullptr) return nullptr;
  Py_DECREF(emitted);
  Py_RETURN_TRUE;
}

// state: (handler, send_log_record, context, call_id, standard_keys,
// unforwarded).
PyObject* BridgeHandleRecord(PyObject* state, PyObject* record) {
  PyObject** keys = Keys();
  if (keys == nullptr) return nullptr;
  PyObject* handler = PyTuple_GET_ITEM(state, 0);
  PyObject* dict = PyObject_GenericGetDict(handler, nullptr);
  if (dict == nullptr) return nullptr;
  const bool no_filters = NoFilters(PyDict_GetItemWithError(dict, keys[kFilters]));
  Py_DECREF(dict);
  if (!no_filters) {
    if (PyErr_Occurred()) return nullptr;
    return ClassHandle(handler, record);
  }
  // try: send_log_record(record, context, _call_id.get(), ...) -> True;
  // declined (False) or an Exception: emit().
  PyObject* call_id = nullptr;
  PyObject* sent = nullptr;
  if (PyContextVar_Get(PyTuple_GET_ITEM(state, 3), nullptr, &call_id) == 0 &&
      call_id == nullptr) {
    // Unset and without a default: get() raises LookupError.
    PyErr_SetObject(PyExc_LookupError, PyTuple_GET_ITEM(state, 3));
  } else if (call_id != nullptr) {
    PyObject* argv[5] = {record, PyTuple_GET_ITEM(state, 2), call_id,
                         PyTuple_GET_ITEM(state, 4), PyTuple_GET_ITEM(state, 5)};
    sent = PyObject_Vectorcall(PyTuple_GET_ITEM(state, 1), argv, 5, nullptr);
    Py_DECREF(call_id);
  }
  if (sent == nullptr) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return nullptr;
    PyErr_Clear();
  } else {
    const int truth = PyObject_IsTrue(sent);
    Py_DECREF(sent);
    if (truth > 0) Py_RETURN_TRUE;
    if (truth < 0) {
      if (!PyErr_ExceptionMatches(PyExc_Exception)) return nullptr;
      PyErr_Clear();
    }
  }
  return Emit(handler, record);
}

// What the durable handle did under the lock.
enum class Locked { kDone, kDefer, kError };

// A new reference to attribute `key` of the handler's dict, or nullptr
// (with an error set, or none: missing).
PyObject* Held(PyObject* dict, PyObject* key) {
  PyObject* value = PyDict_GetItemWithError(dict, key);
  Py_XINCREF(value);
  return value;
}

// _DurableHandler.handle's body under `with self.lock`.
Locked DurableLocked(PyObject* handler, PyObject* dict, PyObject* record) {
  PyObject** keys = Keys();
  PyObject* formatter = PyDict_GetItemWithError(dict, keys[kFormatter]);
  PyObject* line_formatter =
      formatter != nullptr ? PyDict_GetItemWithError(dict, keys[kLineFormatter])
                           : nullptr;
  PyObject* stream = line_formatter != nullptr
                         ? PyDict_GetItemWithError(dict, keys[kStream])
                         : nullptr;
  if (stream == nullptr) return PyErr_Occurred() ? Locked::kError : Locked::kDefer;
  if (formatter == line_formatter && line_formatter != Py_None &&
      stream != Py_None) {
    // size = write_log_line(record, self._mapped or self._fd, self._context,
    //                       max(self.maxBytes - self._size, 0)
    //                       if self._rotates else -1)
    PyObject* mapped = PyDict_GetItemWithError(dict, keys[kMapped]);
    PyObject* sink = mapped == nullptr || mapped == Py_None
                         ? PyDict_GetItemWithError(dict, keys[kFd])
                         : mapped;
    PyObject* context = PyDict_GetItemWithError(dict, keys[kContext]);
    PyObject* rotates = PyDict_GetItemWithError(dict, keys[kRotates]);
    if (mapped == nullptr || sink == nullptr || context == nullptr ||
        rotates == nullptr || !PyBool_Check(rotates)) {
      return PyErr_Occurred() ? Locked::kError : Locked::kDefer;
    }
    long long room = -1;
    if (rotates == Py_True) {
      PyObject* max_bytes = PyDict_GetItemWithError(dict, keys[kMaxBytes]);
      PyObject* size = PyDict_GetItemWithError(dict, keys[kSize]);
      if (max_bytes == nullptr || size == nullptr ||
          !PyLong_CheckExact(max_bytes) || !PyLong_CheckExact(size)) {
        return PyErr_Occurred() ? Locked::kError : Locked::kDefer;
      }
      const long long most = PyLong_AsLongLong(max_bytes);
      const long long used = PyLong_AsLongLong(size);
      if (PyErr_Occurred()) {
        PyErr_Clear();
        return Locked::kDefer;  // (sizes past 2**63: Python's arithmetic)
      }
      room = most > used ? most - used : 0;
    }
    PyObject* room_object = PyLong_FromLongLong(room);
    if (room_object == nullptr) return Locked::kError;
    // Held: str() of the message may run code that changes the handler.
    Py_INCREF(sink);
    Py_INCREF(context);
    PyObject* argv[4] = {record, sink, context, room_object};
    PyObject* written = WriteLogLine(nullptr, argv, 4);
    Py_DECREF(sink);
    Py_DECREF(context);
    Py_DECREF(room_object);
    if (written == nullptr) {
      // except RecursionError: raise / except Exception: handleError
      if (PyErr_ExceptionMatches(PyExc_RecursionError) ||
          !PyErr_ExceptionMatches(PyExc_Exception)) {
        return Locked::kError;
      }
      PyErr_Clear();
      PyObject* handled =
          PyObject_CallMethodOneArg(handler, keys[kHandleError], record);
      if (handled == nullptr) return Locked::kError;
      Py_DECREF(handled);
      return Locked::kDone;
    }
    const long long length = PyLong_AsLongLong(written);
    if (length >= 0) {
      // self._size += size (read again: a nested record may have counted).
      PyObject* before = PyObject_GetAttr(handler, keys[kSize]);
      PyObject* after = before != nullptr ? PyNumber_Add(before, written) : nullptr;
      Py_XDECREF(before);
      Py_DECREF(written);
      const bool counted =
          after != nullptr && PyObject_SetAttr(handler, keys[kSize], after) == 0;
      Py_XDECREF(after);
      return counted ? Locked::kDone : Locked::kError;
    }
    Py_DECREF(written);
    if (PyErr_Occurred()) return Locked::kError;
  }
  PyObject* emitted = PyObject_CallMethodOneArg(handler, keys[kEmit], record);
  if (emitted == nullptr) return Locked::kError;
  Py_DECREF(emitted);
  return Locked::kDone;
}

// state: (handler,).
PyObject* DurableHandleRecord(PyObject* state, PyObject* record) {
  PyObject** keys = Keys();
  if (keys == nullptr) return nullptr;
  PyObject* handler = PyTuple_GET_ITEM(state, 0);
  PyObject* dict = PyObject_GenericGetDict(handler, nullptr);
  if (dict == nullptr) return nullptr;
  PyObject* lock = NoFilters(PyDict_GetItemWithError(dict, keys[kFilters]))
                       ? Held(dict, keys[kLock])
                       : nullptr;
  if (lock == nullptr || lock == Py_None) {
    Py_XDECREF(lock);
    Py_DECREF(dict);
    if (PyErr_Occurred()) return nullptr;
    return ClassHandle(handler, record);
  }
  PyObject* acquired = PyObject_CallMethodNoArgs(lock, keys[kAcquire]);
  if (acquired == nullptr) {
    Py_DECREF(lock);
    Py_DECREF(dict);
    return nullptr;
  }
  Py_DECREF(acquired);
  const Locked done = DurableLocked(handler, dict, record);
  Py_DECREF(dict);
  // The with statement's exit: the lock is released whatever happened, an
  // error pending meanwhile.
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyObject* released = PyObject_CallMethodNoArgs(lock, keys[kRelease]);
  Py_DECREF(lock);
  if (released == nullptr) {
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    return nullptr;
  }
  Py_DECREF(released);
  PyErr_Restore(type, value, traceback);
  switch (done) {
    case Locked::kDone:
      Py_RETURN_TRUE;
    case Locked::kDefer:
      return ClassHandle(handler, record);
    case Locked::kError:
      break;
  }
  return nullptr;
}

PyMethodDef kBridgeHandle = {"handle", Guarded<BridgeHandleRecord>, METH_O,
                             "The log bridge's handle(record), in C."};
PyMethodDef kDurableHandle = {"handle", Guarded<DurableHandleRecord>, METH_O,
                              "The durable log's handle(record), in C."};

PyObject* HandleOf(PyMethodDef* def, PyObject* state) {
  if (state == nullptr) return nullptr;
  PyObject* handle = PyCFunction_NewEx(def, state, nullptr);
  Py_DECREF(state);
  return handle;
}

}  // namespace

PyObject* BridgeHandle(PyObject* /*module*/, PyObject* const* args,
                       Py_ssize_t nargs) {
  if (!CheckArgs("bridge_handle", nargs, 6)) return nullptr;
  if (!PyCallable_Check(args[1]) || !PyUnicode_Check(args[2]) ||
      !PyContextVar_CheckExact(args[3])) {
    PyErr_SetString(PyExc_TypeError,
                    "bridge_handle(handler, send_log_record, context: str, "
                    "call_id: ContextVar, standard_keys, unforwarded)");
    return nullptr;
  }
  PyObject* state = PyTuple_New(nargs);
  if (state != nullptr) {
    for (Py_ssize_t i = 0; i < nargs; ++i) {
      PyTuple_SET_ITEM(state, i, Py_NewRef(args[i]));
    }
  }
  return HandleOf(&kBridgeHandle, state);
}

PyObject* DurableHandle(PyObject* /*module*/, PyObject* const* args,
                        Py_ssize_t nargs) {
  if (!CheckArgs("durable_handle", nargs, 1)) return nullptr;
  return HandleOf(&kDurableHandle, PyTuple_Pack(1, args[0]));
}

}  // namespace agentix::worker
