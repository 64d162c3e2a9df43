// Records that cross the C/Python edge by name, encoded straight into their
// protobuf message's wire form (agentix.runtime.v1.LogRecord, TraceEvent):
// a send_* entry point takes keyword arguments only, each naming a field of
// the message, found through the message's descriptor. runtime.proto is then
// the one place a record's fields are written: a new field is settable from
// Python with no change here. An omitted field (or None) keeps proto3's
// default; an unknown name, or a field the receiver owns (the daemon's seq),
// is a TypeError. The bytes are written directly from the descriptor (tag,
// value) rather than through a Message and reflection: the record path is
// per log line and per span, and a message costs a heap string per field.
//
// The Python form of each field follows from its type:
//   scalar, string, bytes, enum   the Python scalar (see Encode)
//   repeated scalar               a list or tuple of them
//   message of one oneof of       a Python scalar; its type picks the
//     scalars (AttributeValue)      member (bool, int, float, str, bytes)
//   repeated {key, value} entry   a dict {key: value's form} (Attribute,
//     (Attribute; proto maps)       and any proto map<...> field)
//   other message                 a dict of its field names
//   other repeated message        a list or tuple of such dicts
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <google/protobuf/descriptor.h>

namespace agentix::worker {

class MessageFields {
 public:
  // The settable fields of `descriptor`'s message, less `receiver_owned`.
  MessageFields(const google::protobuf::Descriptor* descriptor,
                std::initializer_list<std::string_view> receiver_owned);
  ~MessageFields();

  // Appends to `out` the serialized message (of the descriptor's type) a
  // METH_FASTCALL | METH_KEYWORDS call describes; GIL held. Strings are
  // UTF-8 with invalid surrogates backslash-escaped (proto3 strings must be
  // valid UTF-8), bytes fields take any bytes-like object or None, integers
  // must fit their field, an enum must be one of its declared values;
  // default values are left out, as proto3 serializers do (a oneof member
  // is always written: its presence is its meaning). False with TypeError
  // or ValueError set (`out` then holds a partial message: discard it).
  bool Encode(const char* function, PyObject* const* args, Py_ssize_t nargs,
              PyObject* kwnames, std::string& out);

  // For callers that read a record's values themselves (send_log_record):
  // the index of the settable field `name`, or -1; and one field appended
  // to `out` as Encode appends a keyword argument of that name (the same
  // checks, the same bytes). GIL held.
  int IndexOf(std::string_view name) const;
  bool EncodeField(int index, PyObject* value, std::string& out);
  // EncodeField of an integer field (a scalar of any integer or enum type)
  // with the value as a C integer: the same bytes, without a Python int.
  bool EncodeIntegerField(int index, long long value, std::string& out);

 private:
  enum class Form { kScalar, kScalars, kChoice, kMap, kMessage, kMessages };
  struct Field {
    PyObject* name = nullptr;  // interned on first use (needs the GIL)
    const google::protobuf::FieldDescriptor* field = nullptr;
    std::string tag;  // the field's key on the wire (number, wire type)
    Form form = Form::kScalar;
    bool presence = false;  // a oneof member: written even when default
    std::unique_ptr<MessageFields> message;  // the fields of a message type
  };
  MessageFields(const google::protobuf::Descriptor* descriptor,
                std::initializer_list<std::string_view> receiver_owned,
                int depth);
  bool Intern();
  // The index of the field named `key` (a str), searched from `next`;
  // fields_.size() if none (an error is set only if comparing failed).
  size_t Find(PyObject* key, size_t next);
  bool EncodeOne(const Field& f, PyObject* value, std::string& out);
  // `always`: write the value even if it is the default (list items).
  bool EncodeScalar(const Field& f, PyObject* value, std::string& out,
                    bool always = false);
  // EncodeScalar's integer types, from the value as a C integer.
  bool EncodeNumber(const Field& f, long long number, std::string& out,
                    bool always);
  // This message's fields from a dict of field names.
  bool EncodeDict(PyObject* dict, std::string& out);
  // This message (one oneof of scalars) from a scalar.
  bool EncodeChoice(PyObject* value, std::string& out);
  // This message (a {key, value} entry) from one dict item.
  bool EncodeEntry(PyObject* key, PyObject* value, std::string& out);

  const google::protobuf::Descriptor* descriptor_;
  std::vector<Field> fields_;
  bool interned_ = false;
  std::string scratch_;  // text that needed escaping; GIL-guarded
};

}  // namespace agentix::worker
