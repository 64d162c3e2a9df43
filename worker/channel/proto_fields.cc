#include "worker/channel/proto_fields.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "worker/channel/py_args.h"

namespace agentix::worker {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

MessageFields::MessageFields(
    const google::protobuf::Descriptor* descriptor,
    std::initializer_list<std::string_view> receiver_owned) {
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    if (field->is_repeated() ||
        field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      continue;  // no Python form defined for these here
    }
    if (std::find(receiver_owned.begin(), receiver_owned.end(),
                  field->name()) != receiver_owned.end()) {
      continue;
    }
    fields_.push_back(Field{nullptr, field});
  }
}

bool MessageFields::Intern() {
  for (Field& f : fields_) {
    f.name = PyUnicode_InternFromString(f.field->name().c_str());
    if (f.name == nullptr) return false;
  }
  interned_ = true;
  return true;
}

bool MessageFields::SetOne(const FieldDescriptor* field, PyObject* value,
                           Message& out) {
  const Reflection* r = out.GetReflection();
  const char* name = field->name().c_str();
  long long number = 0;
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string text;
      const bool ok = field->type() == FieldDescriptor::TYPE_BYTES
                          ? OptionalBuffer(value, text)
                          : ToUtf8(value, name, "backslashreplace", text);
      if (!ok) return false;
      r->SetString(&out, field, std::move(text));
      return true;
    }
    case FieldDescriptor::CPPTYPE_INT32:
      if (!ToInt(value, name, number)) return false;
      if (number < INT32_MIN || number > INT32_MAX) break;
      r->SetInt32(&out, field, static_cast<int32_t>(number));
      return true;
    case FieldDescriptor::CPPTYPE_INT64:
      if (!ToInt(value, name, number)) return false;
      r->SetInt64(&out, field, static_cast<int64_t>(number));
      return true;
    case FieldDescriptor::CPPTYPE_UINT32:
      if (!ToInt(value, name, number)) return false;
      if (number < 0 || number > UINT32_MAX) break;
      r->SetUInt32(&out, field, static_cast<uint32_t>(number));
      return true;
    case FieldDescriptor::CPPTYPE_UINT64:
      if (!ToInt(value, name, number)) return false;
      if (number < 0) break;
      r->SetUInt64(&out, field, static_cast<uint64_t>(number));
      return true;
    case FieldDescriptor::CPPTYPE_ENUM:
      if (!ToInt(value, name, number)) return false;
      if (number < INT32_MIN || number > INT32_MAX ||
          field->enum_type()->FindValueByNumber(
              static_cast<int>(number)) == nullptr) {
        PyErr_Format(PyExc_ValueError, "%s must be a value of %s", name,
                     field->enum_type()->full_name().c_str());
        return false;
      }
      r->SetEnumValue(&out, field, static_cast<int>(number));
      return true;
    case FieldDescriptor::CPPTYPE_BOOL:
      if (!PyBool_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%s must be bool, not %.100s", name,
                     Py_TYPE(value)->tp_name);
        return false;
      }
      r->SetBool(&out, field, value == Py_True);
      return true;
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT: {
      const double d = PyFloat_AsDouble(value);
      if (d == -1.0 && PyErr_Occurred()) return false;
      if (field->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE) {
        r->SetDouble(&out, field, d);
      } else {
        r->SetFloat(&out, field, static_cast<float>(d));
      }
      return true;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;  // not in fields_
  }
  PyErr_Format(PyExc_ValueError, "%s out of range", name);
  return false;
}

bool MessageFields::Fill(const char* function, PyObject* const* args,
                         Py_ssize_t nargs, PyObject* kwnames, Message& out) {
  if (nargs != 0) {
    PyErr_Format(PyExc_TypeError, "%s() takes keyword arguments only",
                 function);
    return false;
  }
  if (!interned_ && !Intern()) return false;
  const size_t n = fields_.size();
  const Py_ssize_t count = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  // Call sites pass interned names in the message's order, so a field is
  // found by pointer, mostly in one step from the previous one.
  size_t next = 0;
  for (Py_ssize_t k = 0; k < count; ++k) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    size_t found = n;
    for (size_t step = 0; step < n && found == n; ++step) {
      const size_t i = (next + step) % n;
      if (fields_[i].name == key) found = i;
    }
    for (size_t i = 0; i < n && found == n; ++i) {
      const int equal = PyUnicode_Compare(fields_[i].name, key) == 0;
      if (PyErr_Occurred()) return false;
      if (equal) found = i;
    }
    if (found == n) {
      PyErr_Format(PyExc_TypeError,
                   "%s() got an unexpected keyword argument '%U'", function,
                   key);
      return false;
    }
    next = found + 1;
    if (!SetOne(fields_[found].field, args[k], out)) return false;
  }
  return true;
}

}  // namespace agentix::worker
