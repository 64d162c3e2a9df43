#include "worker/python/py_error.h"

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace agentix::worker {
namespace {

// A strong reference released on scope exit (the GIL must be held then).
class Ref {
 public:
  explicit Ref(PyObject* object) : object_(object) {}
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
  ~Ref() { Py_XDECREF(object_); }
  PyObject* get() const { return object_; }

 private:
  PyObject* object_;
};

// UTF-8 of a str object; "" (and no pending error) when that fails.
std::string Utf8(PyObject* str) {
  if (str == nullptr || !PyUnicode_Check(str)) return "";
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(str, &size);
  if (data == nullptr) {
    PyErr_Clear();
    // Lone surrogates: fall back to an escaped encoding.
    Ref bytes(PyUnicode_AsEncodedString(str, "utf-8", "backslashreplace"));
    if (bytes.get() == nullptr) {
      PyErr_Clear();
      return "";
    }
    return std::string(PyBytes_AS_STRING(bytes.get()),
                       PyBytes_GET_SIZE(bytes.get()));
  }
  return std::string(data, static_cast<size_t>(size));
}

std::string FormatTraceback(PyObject* type, PyObject* value, PyObject* tb) {
  Ref module(PyImport_ImportModule("traceback"));
  if (module.get() == nullptr) {
    PyErr_Clear();
    return "";
  }
  Ref lines(PyObject_CallMethod(module.get(), "format_exception", "OOO", type,
                                value, tb != nullptr ? tb : Py_None));
  if (lines.get() == nullptr) {
    PyErr_Clear();
    return "";
  }
  Ref empty(PyUnicode_FromString(""));
  if (empty.get() == nullptr) {
    PyErr_Clear();
    return "";
  }
  Ref joined(PyUnicode_Join(empty.get(), lines.get()));
  if (joined.get() == nullptr) {
    PyErr_Clear();
    return "";
  }
  return Utf8(joined.get());
}

}  // namespace

PythonError FetchPythonError() {
  PythonError error;
  PyObject* type = nullptr;
  PyObject* value = nullptr;
  PyObject* tb = nullptr;
  PyErr_Fetch(&type, &value, &tb);
  if (type == nullptr) {
    error.type = "SystemError";
    error.message = "no Python exception was set";
    return error;
  }
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb != nullptr && value != nullptr) PyException_SetTraceback(value, tb);
  Ref type_ref(type);
  Ref value_ref(value);
  Ref tb_ref(tb);

  if (PyType_Check(type)) {
    error.type = reinterpret_cast<PyTypeObject*>(type)->tp_name;
    // tp_name of a heap type is the bare name; of a static type it may be
    // dotted ("module.Name"). Report the class name only.
    const size_t dot = error.type.rfind('.');
    if (dot != std::string::npos) error.type = error.type.substr(dot + 1);
  } else {
    error.type = "?";
  }
  if (value != nullptr) {
    Ref str(PyObject_Str(value));
    if (str.get() == nullptr) {
      PyErr_Clear();
      error.message = absl::StrCat("<unprintable ", error.type, " object>");
    } else {
      error.message = Utf8(str.get());
    }
  }
  error.traceback = FormatTraceback(type, value != nullptr ? value : Py_None,
                                    tb);
  PyErr_Clear();
  return error;
}

absl::Status PythonErrorToStatus(const PythonError& error,
                                 absl::StatusCode code) {
  absl::Status status(code, error.message.empty()
                                ? error.type
                                : absl::StrCat(error.type, ": ", error.message));
  if (!error.traceback.empty()) {
    status.SetPayload(kTracebackPayloadUrl, absl::Cord(error.traceback));
  }
  return status;
}

}  // namespace agentix::worker
