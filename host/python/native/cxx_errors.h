// The native module's one rule at the C++/Python edge: a C++ exception never
// crosses into the interpreter; the handler turns it into a Python error.
#ifndef AGENTIX_HOST_PYTHON_NATIVE_CXX_ERRORS_H_
#define AGENTIX_HOST_PYTHON_NATIVE_CXX_ERRORS_H_

#include <Python.h>

#include <exception>

namespace agentix::host {

// Turns the C++ exception being handled into a Python RuntimeError
// "<what>: <its message>". Only inside a catch block.
inline void SetErrorFromCxx(const char* what) {
  try {
    throw;
  } catch (const std::exception& e) {
    PyErr_Format(PyExc_RuntimeError, "%s: %s", what, e.what());
  } catch (...) {
    PyErr_Format(PyExc_RuntimeError, "%s: unknown C++ exception", what);
  }
}

}  // namespace agentix::host

#endif  // AGENTIX_HOST_PYTHON_NATIVE_CXX_ERRORS_H_
