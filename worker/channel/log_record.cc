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

PyObject* PlainMessage(PyObject* msg, PyObject* args) {
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

}  // namespace agentix::worker
