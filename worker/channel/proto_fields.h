// Records that cross the C/Python edge by name, filled straight into their
// protobuf message (agentix.runtime.v1.LogRecord, ...): a send_* entry point
// takes keyword arguments only, each naming a field of the message, found
// through the message's descriptor. runtime.proto is then the one place a
// record's fields are written: a new scalar field is settable from Python
// with no change here. An omitted field keeps proto3's default; an unknown
// name, or a field the receiver owns (the daemon's seq), is a TypeError.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <initializer_list>
#include <string_view>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

namespace agentix::worker {

class MessageFields {
 public:
  // The settable fields of `descriptor`'s message: its scalar, string,
  // bytes and enum fields, less `receiver_owned`.
  MessageFields(const google::protobuf::Descriptor* descriptor,
                std::initializer_list<std::string_view> receiver_owned);

  // Fills `out` (a message of the descriptor's type) from a METH_FASTCALL |
  // METH_KEYWORDS call; GIL held. Strings are UTF-8 with invalid surrogates
  // backslash-escaped (proto3 strings must be valid UTF-8), bytes fields
  // take any bytes-like object or None, integers must fit their field, an
  // enum must be one of its declared values. False with TypeError or
  // ValueError set (`out` then partly filled: discard it).
  bool Fill(const char* function, PyObject* const* args, Py_ssize_t nargs,
            PyObject* kwnames, google::protobuf::Message& out);

 private:
  struct Field {
    PyObject* name = nullptr;  // interned on first use (needs the GIL)
    const google::protobuf::FieldDescriptor* field = nullptr;
  };
  bool Intern();
  bool SetOne(const google::protobuf::FieldDescriptor* field,
              PyObject* value, google::protobuf::Message& out);

  std::vector<Field> fields_;
  bool interned_ = false;
};

}  // namespace agentix::worker
