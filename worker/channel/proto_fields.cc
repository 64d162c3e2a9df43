#include "worker/channel/proto_fields.h"

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <string>

#include "worker/channel/py_args.h"

namespace agentix::worker {
namespace {

using google::protobuf::FieldDescriptor;

enum WireType { kVarint = 0, kFixed64 = 1, kLength = 2, kFixed32 = 5 };

void AppendVarint(std::string& out, uint64_t value) {
  char buf[10];
  int n = 0;
  while (value >= 0x80) {
    buf[n++] = static_cast<char>(value | 0x80);
    value >>= 7;
  }
  buf[n++] = static_cast<char>(value);
  out.append(buf, n);
}

void AppendFixed(std::string& out, const void* value, size_t size) {
  // Little-endian on the wire, as on every host this builds for (x86-64,
  // arm64).
  out.append(static_cast<const char*>(value), size);
}

WireType WireTypeOf(FieldDescriptor::Type type) {
  switch (type) {
    case FieldDescriptor::TYPE_DOUBLE:
    case FieldDescriptor::TYPE_FIXED64:
    case FieldDescriptor::TYPE_SFIXED64:
      return kFixed64;
    case FieldDescriptor::TYPE_FLOAT:
    case FieldDescriptor::TYPE_FIXED32:
    case FieldDescriptor::TYPE_SFIXED32:
      return kFixed32;
    case FieldDescriptor::TYPE_STRING:
    case FieldDescriptor::TYPE_BYTES:
      return kLength;
    default:
      return kVarint;
  }
}

void AppendLength(std::string& out, const std::string& tag, const char* data,
                  size_t size) {
  if (size == 0) return;  // proto3 default
  out.append(tag);
  AppendVarint(out, size);
  out.append(data, size);
}

bool OutOfRange(const char* name) {
  PyErr_Format(PyExc_ValueError, "%s out of range", name);
  return false;
}

}  // namespace

MessageFields::MessageFields(
    const google::protobuf::Descriptor* descriptor,
    std::initializer_list<std::string_view> receiver_owned) {
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    if (field->is_repeated() ||
        field->type() == FieldDescriptor::TYPE_MESSAGE ||
        field->type() == FieldDescriptor::TYPE_GROUP) {
      continue;  // no Python form defined for these here
    }
    if (std::find(receiver_owned.begin(), receiver_owned.end(),
                  field->name()) != receiver_owned.end()) {
      continue;
    }
    Field f;
    f.field = field;
    AppendVarint(f.tag, (static_cast<uint64_t>(field->number()) << 3) |
                            WireTypeOf(field->type()));
    fields_.push_back(std::move(f));
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

bool MessageFields::EncodeOne(const Field& f, PyObject* value,
                              std::string& out) {
  const FieldDescriptor* field = f.field;
  const char* name = field->name().c_str();
  long long number = 0;
  switch (field->type()) {
    case FieldDescriptor::TYPE_STRING: {
      if (PyUnicode_Check(value)) {
        Py_ssize_t size = 0;
        const char* data = PyUnicode_AsUTF8AndSize(value, &size);
        if (data != nullptr) {
          AppendLength(out, f.tag, data, static_cast<size_t>(size));
          return true;
        }
        if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) return false;
        PyErr_Clear();  // lone surrogates: escaped below
      }
      if (!ToUtf8(value, name, "backslashreplace", scratch_)) return false;
      AppendLength(out, f.tag, scratch_.data(), scratch_.size());
      return true;
    }
    case FieldDescriptor::TYPE_BYTES: {
      if (value == Py_None) return true;
      Py_buffer view;
      if (PyObject_GetBuffer(value, &view, PyBUF_CONTIG_RO) != 0) {
        return false;
      }
      AppendLength(out, f.tag, static_cast<const char*>(view.buf),
                   static_cast<size_t>(view.len));
      PyBuffer_Release(&view);
      return true;
    }
    case FieldDescriptor::TYPE_BOOL:
      if (!PyBool_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%s must be bool, not %.100s", name,
                     Py_TYPE(value)->tp_name);
        return false;
      }
      if (value == Py_True) {
        out.append(f.tag);
        out.push_back(1);
      }
      return true;
    case FieldDescriptor::TYPE_DOUBLE:
    case FieldDescriptor::TYPE_FLOAT: {
      const double d = PyFloat_AsDouble(value);
      if (d == -1.0 && PyErr_Occurred()) return false;
      if (d == 0.0 && !std::signbit(d)) return true;  // proto3 default
      out.append(f.tag);
      if (field->type() == FieldDescriptor::TYPE_DOUBLE) {
        AppendFixed(out, &d, sizeof d);
      } else {
        const float single = static_cast<float>(d);
        AppendFixed(out, &single, sizeof single);
      }
      return true;
    }
    default:
      break;
  }
  // Every other type is an integer.
  if (!ToInt(value, name, number)) return false;
  uint64_t bits = 0;
  switch (field->type()) {
    case FieldDescriptor::TYPE_ENUM:
      if (number < INT32_MIN || number > INT32_MAX ||
          field->enum_type()->FindValueByNumber(static_cast<int>(number)) ==
              nullptr) {
        PyErr_Format(PyExc_ValueError, "%s must be a value of %s", name,
                     field->enum_type()->full_name().c_str());
        return false;
      }
      bits = static_cast<uint64_t>(number);  // sign-extended, as int32
      break;
    case FieldDescriptor::TYPE_INT32:
    case FieldDescriptor::TYPE_SFIXED32:
      if (number < INT32_MIN || number > INT32_MAX) return OutOfRange(name);
      bits = static_cast<uint64_t>(number);
      break;
    case FieldDescriptor::TYPE_SINT32:
      if (number < INT32_MIN || number > INT32_MAX) return OutOfRange(name);
      bits = (static_cast<uint64_t>(number) << 1) ^
             static_cast<uint64_t>(number >> 63);
      break;
    case FieldDescriptor::TYPE_UINT32:
    case FieldDescriptor::TYPE_FIXED32:
      if (number < 0 || number > UINT32_MAX) return OutOfRange(name);
      bits = static_cast<uint64_t>(number);
      break;
    case FieldDescriptor::TYPE_UINT64:
    case FieldDescriptor::TYPE_FIXED64:
      if (number < 0) return OutOfRange(name);
      bits = static_cast<uint64_t>(number);
      break;
    case FieldDescriptor::TYPE_SINT64:
      bits = (static_cast<uint64_t>(number) << 1) ^
             static_cast<uint64_t>(number >> 63);
      break;
    default:  // INT64, SFIXED64
      bits = static_cast<uint64_t>(number);
      break;
  }
  if (bits == 0) return true;  // proto3 default
  out.append(f.tag);
  switch (WireTypeOf(field->type())) {
    case kFixed32: {
      const uint32_t low = static_cast<uint32_t>(bits);
      AppendFixed(out, &low, sizeof low);
      break;
    }
    case kFixed64:
      AppendFixed(out, &bits, sizeof bits);
      break;
    default:
      AppendVarint(out, bits);
  }
  return true;
}

bool MessageFields::Encode(const char* function, PyObject* const* args,
                           Py_ssize_t nargs, PyObject* kwnames,
                           std::string& out) {
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
    if (!EncodeOne(fields_[found], args[k], out)) return false;
  }
  return true;
}

}  // namespace agentix::worker
