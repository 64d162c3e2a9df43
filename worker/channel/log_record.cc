#include "worker/channel/log_record.h"

namespace agentix::worker {
namespace {

// logging.LogRecord and the getMessage its class had when first needed
// (compared by identity per record). GIL-guarded; kept for the process.
struct PlainRecordType {
  PyObject* type = nullptr;
  PyObject* get_message_name = nullptr;
  PyObject* get_message = nullptr;
};

PlainRecordType* LoadPlainRecordType() {
  PyObject* logging = PyImport_ImportModule("logging");
  if (logging == nullptr) return nullptr;
  PyObject* type = PyObject_GetAttrString(logging, "LogRecord");
  Py_DECREF(logging);
  if (type == nullptr) return nullptr;
  if (!PyType_Check(type)) {
    Py_DECREF(type);
    PyErr_SetString(PyExc_TypeError, "logging.LogRecord is not a class");
    return nullptr;
  }
  PyObject* name = PyUnicode_InternFromString("getMessage");
  if (name == nullptr) {
    Py_DECREF(type);
    return nullptr;
  }
  PyObject* method =
      _PyType_Lookup(reinterpret_cast<PyTypeObject*>(type), name);
  if (method == nullptr) {
    Py_DECREF(type);
    Py_DECREF(name);
    PyErr_SetString(PyExc_TypeError, "logging.LogRecord has no getMessage");
    return nullptr;
  }
  Py_INCREF(method);
  return new PlainRecordType{type, name, method};
}

}  // namespace

int IsPlainLogRecord(PyObject* record) {
  static PlainRecordType* plain = nullptr;
  if (plain == nullptr) {
    plain = LoadPlainRecordType();
    if (plain == nullptr) return -1;
  }
  PyTypeObject* type = Py_TYPE(record);
  return reinterpret_cast<PyObject*>(type) == plain->type &&
         _PyType_Lookup(type, plain->get_message_name) == plain->get_message;
}

namespace {

// True if `msg % args` runs no code of the user's and always gives the
// same str: a str message and a tuple of str, int and float (exact types).
bool FormatsTheSame(PyObject* msg, PyObject* args) {
  if (!PyUnicode_CheckExact(msg) || !PyTuple_CheckExact(args)) return false;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); ++i) {
    PyObject* item = PyTuple_GET_ITEM(args, i);
    if (!PyUnicode_CheckExact(item) && !PyLong_CheckExact(item) &&
        !PyFloat_CheckExact(item)) {
      return false;
    }
  }
  return true;
}

// The last such message: the log bridge and the durable log format each
// record's message one after the other (~0.15 us each). The msg and args
// objects are held, so the same pointers are the same (immutable) objects.
// GIL-guarded.
struct LastMessage {
  PyObject* msg = nullptr;
  PyObject* args = nullptr;
  PyObject* message = nullptr;
};
LastMessage last_message;

PyObject* FormatMessage(PyObject* msg, PyObject* args) {
  PyObject* message = PyObject_Str(msg);
  if (message == nullptr) return nullptr;
  const int has_args = PyObject_IsTrue(args);
  if (has_args <= 0) {
    if (has_args < 0) Py_CLEAR(message);
    return message;
  }
  PyObject* formatted = PyNumber_Remainder(message, args);
  Py_DECREF(message);
  return formatted;
}

}  // namespace

PyObject* PlainMessage(PyObject* msg, PyObject* args) {
  LastMessage& last = last_message;
  if (msg == last.msg && args == last.args) return Py_NewRef(last.message);
  PyObject* message = FormatMessage(msg, args);
  if (message != nullptr && PyUnicode_CheckExact(message) &&
      FormatsTheSame(msg, args)) {
    PyObject* old_msg = last.msg;
    PyObject* old_args = last.args;
    PyObject* old_message = last.message;
    last.msg = Py_NewRef(msg);
    last.args = Py_NewRef(args);
    last.message = Py_NewRef(message);
    // Released after the new entry is in place: a dealloc may run code.
    Py_XDECREF(old_msg);
    Py_XDECREF(old_args);
    Py_XDECREF(old_message);
  }
  return message;
}

}  // namespace agentix::worker
