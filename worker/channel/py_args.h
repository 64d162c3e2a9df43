// Conversions and guards shared by the `_agentix_worker` entry points: the
// C/Python edge's argument checks, and the rule that no C++ exception
// unwinds through CPython frames.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <exception>
#include <initializer_list>
#include <new>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace agentix::worker {

// str from bytes that must round-trip byte-exactly (call ids, names):
// invalid UTF-8 becomes lone surrogates.
PyObject* Str(const std::string& s);
PyObject* BytesOf(std::string_view data);

// str -> UTF-8. `errors` is "surrogateescape" for ids that must round-trip
// and "backslashreplace" for human text that must be valid UTF-8. False
// with TypeError set if `object` is not a str.
bool ToUtf8(PyObject* object, const char* what, const char* errors,
            std::string& out);
bool ToInt(PyObject* object, const char* what, long long& out);
// TypeError unless nargs == want.
bool CheckArgs(const char* name, Py_ssize_t nargs, Py_ssize_t want);
// Copies a buffer argument (bytes or None) into `out`.
bool OptionalBuffer(PyObject* object, std::string& out);

// Builds a tuple from new references; on any nullptr releases the others and
// returns nullptr (the error is already set).
PyObject* Tuple(std::initializer_list<PyObject*> items);

// Interns strings[i] into out[i] for each entry still nullptr (a table of
// names looked up per record). False with the error set if one fails; the
// entries after it stay nullptr, so a later call completes the table.
bool InternAll(const char* const* strings, int n, PyObject** out);

// A named record (a PyStructSequence: a tuple whose items are also
// attributes) of `type`, from new references; like Tuple on failure.
PyObject* Record(PyObject* type, std::initializer_list<PyObject*> items);

// Creates the record type `desc` describes, adds it to `module` under its
// short name and stores a new reference in `*type`. -1 with an error set.
int AddRecordType(PyObject* module, PyStructSequence_Desc* desc,
                  PyObject** type);

// Sets the Python error for a failed status from a C++ helper (MemoryError
// for the "out of memory" WithoutGil reports).
void SetError(PyObject* type, const absl::Status& status);

// Runs `fn` (which must not touch Python) with the GIL released, converting
// C++ exceptions to a Status so none unwinds through CPython frames.
template <typename Fn>
absl::Status WithoutGil(Fn&& fn) {
  absl::Status status;
  Py_BEGIN_ALLOW_THREADS
  try {
    status = fn();
  } catch (const std::bad_alloc&) {
    status = absl::ResourceExhaustedError("out of memory");
  } catch (const std::exception& e) {
    status = absl::InternalError(e.what());
  }
  Py_END_ALLOW_THREADS
  return status;
}

// Entry points catch every C++ exception (std::bad_alloc from a string, in
// practice), so that none unwinds through CPython frames.
template <typename Call>
PyObject* CatchAll(Call&& call) {
  try {
    return call();
  } catch (const std::bad_alloc&) {
    return PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

template <PyObject* (*Fn)(PyObject*, PyObject*)>
PyObject* Guarded(PyObject* self, PyObject* arg) {
  return CatchAll([&] { return Fn(self, arg); });
}

template <PyObject* (*Fn)(PyObject*, PyObject* const*, Py_ssize_t)>
PyObject* GuardedFast(PyObject* self, PyObject* const* args,
                      Py_ssize_t nargs) {
  return CatchAll([&] { return Fn(self, args, nargs); });
}

template <PyObject* (*Fn)(PyObject*, PyObject* const*, Py_ssize_t, PyObject*)>
PyObject* GuardedFastKeywords(PyObject* self, PyObject* const* args,
                              Py_ssize_t nargs, PyObject* kwnames) {
  return CatchAll([&] { return Fn(self, args, nargs, kwnames); });
}

// PyMethodDef stores every function as a PyCFunction; METH_FASTCALL ones are
// cast back by CPython according to the flags.
template <PyObject* (*Fn)(PyObject*, PyObject* const*, Py_ssize_t)>
PyCFunction Fast() {
  return reinterpret_cast<PyCFunction>(
      reinterpret_cast<void (*)()>(&GuardedFast<Fn>));
}

template <PyObject* (*Fn)(PyObject*, PyObject* const*, Py_ssize_t, PyObject*)>
PyCFunction FastKeywords() {
  return reinterpret_cast<PyCFunction>(
      reinterpret_cast<void (*)()>(&GuardedFastKeywords<Fn>));
}

}  // namespace agentix::worker
