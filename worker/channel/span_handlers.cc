#include "worker/channel/span_handlers.h"

#include "worker/channel/py_args.h"

namespace agentix::worker {
namespace {

enum Key {
  kEnabled,
  kBusy,
  kOn,
  kSendSpan,
  kSpanType,
  kStartGeneral,
  kEndGeneral,
  kOnSpanStart,
  kOnSpanEnd,
  kKeys
};
constexpr const char* kKeyNames[kKeys] = {
    "enabled",       "_busy",           "on",
    "_send_span",    "_span_type",      "_span_start_general",
    "_span_end_general", "on_span_start", "on_span_end"};

PyObject** Keys() {
  static PyObject* keys[kKeys] = {};  // interned; GIL-guarded
  if (keys[kKeys - 1] == nullptr && !InternAll(kKeyNames, kKeys, keys)) {
    return nullptr;
  }
  return keys;
}

// forwarder.<name>(span), `name` looked up as Python would (a method of
// its class, unless the instance shadows it).
PyObject* CallMethod(PyObject* forwarder, PyObject* name, PyObject* span) {
  return PyObject_CallMethodOneArg(forwarder, name, span);
}

// The class's own (Python) on_span_start / on_span_end, for a forwarder
// whose state is not what the C path reads.
PyObject* ClassMethod(PyObject* forwarder, PyObject* name, PyObject* span) {
  PyObject* method = _PyType_Lookup(Py_TYPE(forwarder), name);
  if (method == nullptr) {
    PyErr_SetString(PyExc_TypeError, "trace forwarder class without its method");
    return nullptr;
  }
  Py_INCREF(method);
  PyObject* argv[2] = {forwarder, span};
  PyObject* result = PyObject_Vectorcall(method, argv, 2, nullptr);
  Py_DECREF(method);
  return result;
}

// What the forwarder's method does with `span` for the event `end` names.
// state: (forwarder, call_id, kind) with kind the TraceEventKind int.
PyObject* ForwardSpan(PyObject* state, PyObject* span, bool end) {
  PyObject** keys = Keys();
  if (keys == nullptr) return nullptr;
  PyObject* forwarder = PyTuple_GET_ITEM(state, 0);
  PyObject* method_name = keys[end ? kOnSpanEnd : kOnSpanStart];
  PyObject* dict = PyObject_GenericGetDict(forwarder, nullptr);
  if (dict == nullptr) return nullptr;
  // Held: the truth tests and calls below may run Python code.
  PyObject* values[4] = {};
  constexpr Key kRead[4] = {kEnabled, kBusy, kSendSpan, kSpanType};
  bool complete = true;
  for (int i = 0; i < 4; ++i) {
    values[i] = PyDict_GetItemWithError(dict, keys[kRead[i]]);
    if (values[i] == nullptr) {
      complete = false;
      break;
    }
  }
  for (PyObject* value : values) Py_XINCREF(value);
  Py_DECREF(dict);
  auto release = [&values] {
    for (PyObject* value : values) Py_XDECREF(value);
  };
  if (!complete) {
    release();
    if (PyErr_Occurred()) return nullptr;
    return ClassMethod(forwarder, method_name, span);
  }
  PyObject *enabled = values[0], *busy = values[1], *send = values[2],
           *span_type = values[3];
  // if not self.enabled or busy.on: return
  int skip = 0;
  if (enabled != Py_True) {
    const int truth = PyObject_IsTrue(enabled);
    skip = truth < 0 ? -1 : truth == 0;
  }
  if (skip == 0) {
    PyObject* on = PyObject_GetAttr(busy, keys[kOn]);
    skip = on == nullptr ? -1 : PyObject_IsTrue(on);
    Py_XDECREF(on);
  }
  if (skip != 0) {
    release();
    if (skip < 0 || PyErr_Occurred()) return nullptr;
    Py_RETURN_NONE;
  }
  // try: if self._send_span(kind, span, _call_id.get(), self._span_type):
  //          return
  // except Exception: pass
  PyObject* call_id = nullptr;
  PyObject* sent = nullptr;
  PyObject* var = PyTuple_GET_ITEM(state, 1);
  if (PyContextVar_Get(var, nullptr, &call_id) == 0 && call_id == nullptr) {
    PyErr_SetObject(PyExc_LookupError, var);  // unset, no default: get() raises
  } else if (call_id != nullptr) {
    PyObject* argv[4] = {PyTuple_GET_ITEM(state, 2), span, call_id, span_type};
    sent = PyObject_Vectorcall(send, argv, 4, nullptr);
    Py_DECREF(call_id);
  }
  release();
  int truth = -1;
  if (sent != nullptr) {
    truth = PyObject_IsTrue(sent);
    Py_DECREF(sent);
    if (truth > 0) Py_RETURN_NONE;
  }
  if (truth < 0) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return nullptr;
    PyErr_Clear();
  }
  return CallMethod(forwarder, keys[end ? kEndGeneral : kStartGeneral], span);
}

PyObject* OnSpanStart(PyObject* state, PyObject* span) {
  return ForwardSpan(state, span, false);
}

PyObject* OnSpanEnd(PyObject* state, PyObject* span) {
  return ForwardSpan(state, span, true);
}

PyMethodDef kOnSpanStartDef = {"on_span_start", Guarded<OnSpanStart>, METH_O,
                               "The trace forwarder's on_span_start(span), in C."};
PyMethodDef kOnSpanEndDef = {"on_span_end", Guarded<OnSpanEnd>, METH_O,
                             "The trace forwarder's on_span_end(span), in C."};

// agentix.runtime.v1.TraceEventKind's SPAN_START / SPAN_END.
constexpr long kSpanStart = 3;
constexpr long kSpanEnd = 4;

PyObject* HandlerOf(PyMethodDef* def, PyObject* forwarder, PyObject* call_id,
                    long kind) {
  PyObject* kind_object = PyLong_FromLong(kind);
  if (kind_object == nullptr) return nullptr;
  PyObject* state = PyTuple_Pack(3, forwarder, call_id, kind_object);
  Py_DECREF(kind_object);
  if (state == nullptr) return nullptr;
  PyObject* handler = PyCFunction_NewEx(def, state, nullptr);
  Py_DECREF(state);
  return handler;
}

}  // namespace

PyObject* SpanHandlers(PyObject* /*module*/, PyObject* const* args,
                       Py_ssize_t nargs) {
  if (!CheckArgs("span_handlers", nargs, 2)) return nullptr;
  if (!PyContextVar_CheckExact(args[1])) {
    PyErr_SetString(PyExc_TypeError,
                    "span_handlers(forwarder, call_id: ContextVar)");
    return nullptr;
  }
  PyObject* start = HandlerOf(&kOnSpanStartDef, args[0], args[1], kSpanStart);
  PyObject* end = start != nullptr
                      ? HandlerOf(&kOnSpanEndDef, args[0], args[1], kSpanEnd)
                      : nullptr;
  if (end == nullptr) {
    Py_XDECREF(start);
    return nullptr;
  }
  PyObject* pair = PyTuple_Pack(2, start, end);
  Py_DECREF(start);
  Py_DECREF(end);
  return pair;
}

}  // namespace agentix::worker
