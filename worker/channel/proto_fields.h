// Records that cross the C/Python edge by name, encoded straight into their
// protobuf message's wire form (agentix.runtime.v1.LogRecord, ...): a send_*
// entry point takes keyword arguments only, each naming a field of the
// message, found through the message's descriptor. runtime.proto is then the
// one place a record's fields are written: a new scalar field is settable
// from Python with no change here. An omitted field keeps proto3's default;
// an unknown name, or a field the receiver owns (the daemon's seq), is a
// TypeError. The bytes are written directly from the descriptor (tag,
// value) rather than through a Message and reflection: the record path is
// per log line, and a message costs a heap string per field.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include <google/protobuf/descriptor.h>

namespace agentix::worker {

class MessageFields {
 public:
  // The settable fields of `descriptor`'s message: its scalar, string,
  // bytes and enum fields, less `receiver_owned`.
  MessageFields(const google::protobuf::Descriptor* descriptor,
                std::initializer_list<std::string_view> receiver_owned);

  // Appends to `out` the serialized message (of the descriptor's type) a
  // METH_FASTCALL | METH_KEYWORDS call describes; GIL held. Strings are
  // UTF-8 with invalid surrogates backslash-escaped (proto3 strings must be
  // valid UTF-8), bytes fields take any bytes-like object or None, integers
  // must fit their field, an enum must be one of its declared values;
  // default values are left out, as proto3 serializers do. False with
  // TypeError or ValueError set (`out` then holds a partial message:
  // discard it).
  bool Encode(const char* function, PyObject* const* args, Py_ssize_t nargs,
              PyObject* kwnames, std::string& out);

 private:
  struct Field {
    PyObject* name = nullptr;  // interned on first use (needs the GIL)
    const google::protobuf::FieldDescriptor* field = nullptr;
    std::string tag;  // the field's key on the wire (number, wire type)
  };
  bool Intern();
  bool EncodeOne(const Field& f, PyObject* value, std::string& out);

  std::vector<Field> fields_;
  bool interned_ = false;
  std::string scratch_;  // text that needed escaping; GIL-guarded
};

}  // namespace agentix::worker
