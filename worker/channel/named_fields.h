// Records that cross the C/Python edge by name: a send_* entry point takes
// keyword arguments only, each naming a member of the C++ record it fills
// (ipc::LogEntry, ipc::TraceEntry). The table of fields is the one place a
// record's Python names are written; an omitted field keeps the record's
// default, an unknown one is a TypeError.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "worker/channel/py_args.h"

namespace agentix::worker {

template <typename Record>
struct NamedField {
  enum Kind {
    kText,    // str, invalid surrogates backslash-escaped (human text)
    kId,      // str that must round-trip byte-exactly (surrogateescape)
    kInt,     // int -> int
    kInt64,   // int -> int64_t
    kBuffer,  // bytes-like or None (left empty)
  };
  const char* name;
  Kind kind;
  std::string Record::*text = nullptr;
  int Record::*int32 = nullptr;
  int64_t Record::*int64 = nullptr;
};

template <typename Record>
constexpr NamedField<Record> TextField(const char* name,
                                       std::string Record::*member) {
  return {name, NamedField<Record>::kText, member, nullptr, nullptr};
}
template <typename Record>
constexpr NamedField<Record> IdField(const char* name,
                                     std::string Record::*member) {
  return {name, NamedField<Record>::kId, member, nullptr, nullptr};
}
template <typename Record>
constexpr NamedField<Record> BufferField(const char* name,
                                         std::string Record::*member) {
  return {name, NamedField<Record>::kBuffer, member, nullptr, nullptr};
}
template <typename Record>
constexpr NamedField<Record> IntField(const char* name, int Record::*member) {
  return {name, NamedField<Record>::kInt, nullptr, member, nullptr};
}
template <typename Record>
constexpr NamedField<Record> Int64Field(const char* name,
                                        int64_t Record::*member) {
  return {name, NamedField<Record>::kInt64, nullptr, nullptr, member};
}

// Fills `out` from a METH_FASTCALL | METH_KEYWORDS call. `names` caches the
// fields' interned names (N nullptrs at first; filled with the GIL held):
// call sites pass interned names in the table's order, so a field is found
// by pointer in one step. False with TypeError/ValueError set on a
// positional argument, an unknown name or a value of the wrong type.
template <typename Record, size_t N>
bool ParseNamedFields(const char* function,
                      const NamedField<Record> (&fields)[N],
                      PyObject* (&names)[N], PyObject* const* args,
                      Py_ssize_t nargs, PyObject* kwnames, Record& out) {
  if (nargs != 0) {
    PyErr_Format(PyExc_TypeError, "%s() takes keyword arguments only",
                 function);
    return false;
  }
  if (names[0] == nullptr) {
    for (size_t i = 0; i < N; ++i) {
      names[i] = PyUnicode_InternFromString(fields[i].name);
      if (names[i] == nullptr) return false;
    }
  }
  const Py_ssize_t count = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  size_t next = 0;  // where the previous field was found, plus one
  for (Py_ssize_t k = 0; k < count; ++k) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    size_t found = N;
    for (size_t step = 0; step < N && found == N; ++step) {
      const size_t i = (next + step) % N;
      if (names[i] == key) found = i;
    }
    for (size_t i = 0; i < N && found == N; ++i) {
      const int equal = PyUnicode_Compare(names[i], key) == 0;
      if (PyErr_Occurred()) return false;
      if (equal) found = i;
    }
    if (found == N) {
      PyErr_Format(PyExc_TypeError,
                   "%s() got an unexpected keyword argument '%U'", function,
                   key);
      return false;
    }
    next = found + 1;
    const NamedField<Record>& field = fields[found];
    PyObject* value = args[k];
    long long number = 0;
    switch (field.kind) {
      case NamedField<Record>::kText:
        if (!ToUtf8(value, field.name, "backslashreplace", out.*field.text)) {
          return false;
        }
        break;
      case NamedField<Record>::kId:
        if (!ToUtf8(value, field.name, "surrogateescape", out.*field.text)) {
          return false;
        }
        break;
      case NamedField<Record>::kBuffer:
        if (!OptionalBuffer(value, out.*field.text)) return false;
        break;
      case NamedField<Record>::kInt:
        if (!ToInt(value, field.name, number)) return false;
        if (number < INT32_MIN || number > INT32_MAX) {
          PyErr_Format(PyExc_ValueError, "%s out of range", field.name);
          return false;
        }
        out.*field.int32 = static_cast<int>(number);
        break;
      case NamedField<Record>::kInt64:
        if (!ToInt(value, field.name, number)) return false;
        out.*field.int64 = static_cast<int64_t>(number);
        break;
    }
  }
  return true;
}

}  // namespace agentix::worker
