#include "worker/channel/py_args.h"

#include <cstring>

namespace agentix::worker {

PyObject* Str(const std::string& s) {
  return PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()),
                              "surrogateescape");
}

PyObject* BytesOf(std::string_view data) {
  return PyBytes_FromStringAndSize(data.data(),
                                   static_cast<Py_ssize_t>(data.size()));
}

bool ToUtf8(PyObject* object, const char* what, const char* errors,
            std::string& out) {
  if (!PyUnicode_Check(object)) {
    PyErr_Format(PyExc_TypeError, "%s must be str, not %.100s", what,
                 Py_TYPE(object)->tp_name);
    return false;
  }
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(object, &size);
  if (data != nullptr) {
    out.assign(data, static_cast<size_t>(size));
    return true;
  }
  if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) return false;
  PyErr_Clear();
  PyObject* bytes = PyUnicode_AsEncodedString(object, "utf-8", errors);
  if (bytes == nullptr) return false;
  out.assign(PyBytes_AS_STRING(bytes),
             static_cast<size_t>(PyBytes_GET_SIZE(bytes)));
  Py_DECREF(bytes);
  return true;
}

bool ToInt(PyObject* object, const char* what, long long& out) {
  if (!PyLong_Check(object)) {
    PyErr_Format(PyExc_TypeError, "%s must be int, not %.100s", what,
                 Py_TYPE(object)->tp_name);
    return false;
  }
  out = PyLong_AsLongLong(object);
  return !(out == -1 && PyErr_Occurred());
}

bool CheckArgs(const char* name, Py_ssize_t nargs, Py_ssize_t want) {
  if (nargs == want) return true;
  PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name,
               want, nargs);
  return false;
}

bool OptionalBuffer(PyObject* object, std::string& out) {
  if (object == Py_None) return true;
  Py_buffer view;
  if (PyObject_GetBuffer(object, &view, PyBUF_CONTIG_RO) != 0) return false;
  out.assign(static_cast<const char*>(view.buf), static_cast<size_t>(view.len));
  PyBuffer_Release(&view);
  return true;
}

namespace {

bool AllSet(std::initializer_list<PyObject*> items) {
  for (PyObject* item : items) {
    if (item == nullptr) return false;
  }
  return true;
}

// Moves `items` into the fresh tuple (or struct sequence) `container`; if it
// is nullptr, releases them instead.
PyObject* Fill(PyObject* container, std::initializer_list<PyObject*> items) {
  Py_ssize_t i = 0;
  for (PyObject* item : items) {
    if (container != nullptr) {
      PyTuple_SET_ITEM(container, i++, item);  // steals
    } else {
      Py_XDECREF(item);
    }
  }
  return container;
}

}  // namespace

bool InternAll(const char* const* strings, int n, PyObject** out) {
  for (int i = 0; i < n; ++i) {
    if (out[i] == nullptr) out[i] = PyUnicode_InternFromString(strings[i]);
    if (out[i] == nullptr) return false;
  }
  return true;
}

PyObject* Tuple(std::initializer_list<PyObject*> items) {
  return Fill(AllSet(items) ? PyTuple_New(static_cast<Py_ssize_t>(items.size()))
                            : nullptr,
              items);
}

PyObject* Record(PyObject* type, std::initializer_list<PyObject*> items) {
  // A struct sequence is a tuple underneath (PyStructSequence_SET_ITEM is
  // PyTuple_SET_ITEM).
  return Fill(AllSet(items) ? PyStructSequence_New(
                                  reinterpret_cast<PyTypeObject*>(type))
                            : nullptr,
              items);
}

int AddRecordType(PyObject* module, PyStructSequence_Desc* desc,
                  PyObject** type) {
  *type = reinterpret_cast<PyObject*>(PyStructSequence_NewType(desc));
  if (*type == nullptr) return -1;
  const char* dot = std::strrchr(desc->name, '.');
  return PyModule_AddObjectRef(module, dot != nullptr ? dot + 1 : desc->name,
                               *type);
}

void SetError(PyObject* type, const absl::Status& status) {
  if (status.code() == absl::StatusCode::kResourceExhausted &&
      status.message() == "out of memory") {
    PyErr_NoMemory();
    return;
  }
  PyErr_SetString(type, std::string(status.message()).c_str());
}

}  // namespace agentix::worker
