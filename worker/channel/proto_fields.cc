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
    case FieldDescriptor::TYPE_MESSAGE:
      return kLength;
    default:
      return kVarint;
  }
}

void AppendLength(std::string& out, const std::string& tag, const char* data,
                  size_t size, bool always) {
  if (size == 0 && !always) return;  // proto3 default
  out.append(tag);
  AppendVarint(out, size);
  out.append(data, size);
}

bool OutOfRange(const char* name) {
  PyErr_Format(PyExc_ValueError, "%s out of range", name);
  return false;
}

// Puts the varint length of out[start..] in front of it: a nested message's
// size is known once it is written (mostly a few bytes to move).
void PrefixLength(std::string& out, size_t start) {
  std::string length;
  AppendVarint(length, out.size() - start);
  out.insert(start, length);
}

// A message that is one oneof of scalars (AttributeValue): its Python form
// is the scalar itself.
bool IsChoice(const google::protobuf::Descriptor* d) {
  if (d->field_count() == 0 || d->oneof_decl_count() != 1) return false;
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->containing_oneof() == nullptr || f->is_repeated() ||
        f->type() == FieldDescriptor::TYPE_MESSAGE ||
        f->type() == FieldDescriptor::TYPE_GROUP) {
      return false;
    }
  }
  return true;
}

// A {key, value} entry (Attribute, or a proto map's entry): a repeated
// field of these is a Python dict.
bool IsEntry(const google::protobuf::Descriptor* d) {
  return d->field_count() == 2 && d->field(0)->name() == "key" &&
         d->field(1)->name() == "value" && !d->field(0)->is_repeated() &&
         d->field(0)->type() != FieldDescriptor::TYPE_MESSAGE &&
         !d->field(1)->is_repeated();
}

// Which Python scalar a field holds, for picking a oneof member by type.
enum Scalar { kBool, kInt, kFloat, kStr, kBytes, kScalarKinds };

int ScalarOf(FieldDescriptor::Type type) {
  switch (type) {
    case FieldDescriptor::TYPE_BOOL:
      return kBool;
    case FieldDescriptor::TYPE_DOUBLE:
    case FieldDescriptor::TYPE_FLOAT:
      return kFloat;
    case FieldDescriptor::TYPE_STRING:
      return kStr;
    case FieldDescriptor::TYPE_BYTES:
      return kBytes;
    case FieldDescriptor::TYPE_ENUM:
    case FieldDescriptor::TYPE_MESSAGE:
    case FieldDescriptor::TYPE_GROUP:
      return -1;
    default:
      return kInt;
  }
}

// Nested message types deeper than this have no Python form (a recursive
// type would otherwise never end).
constexpr int kMaxDepth = 8;

}  // namespace

MessageFields::MessageFields(
    const google::protobuf::Descriptor* descriptor,
    std::initializer_list<std::string_view> receiver_owned)
    : MessageFields(descriptor, receiver_owned, 0) {}

MessageFields::MessageFields(
    const google::protobuf::Descriptor* descriptor,
    std::initializer_list<std::string_view> receiver_owned, int depth)
    : descriptor_(descriptor) {
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    if (field->type() == FieldDescriptor::TYPE_GROUP) continue;
    if (std::find(receiver_owned.begin(), receiver_owned.end(),
                  field->name()) != receiver_owned.end()) {
      continue;
    }
    Field f;
    f.field = field;
    f.presence = field->containing_oneof() != nullptr;
    if (field->type() == FieldDescriptor::TYPE_MESSAGE) {
      if (depth >= kMaxDepth) continue;
      const google::protobuf::Descriptor* type = field->message_type();
      f.message.reset(new MessageFields(type, {}, depth + 1));
      if (field->is_repeated()) {
        f.form = IsEntry(type) ? Form::kMap : Form::kMessages;
      } else {
        f.form = IsChoice(type) ? Form::kChoice : Form::kMessage;
      }
    } else {
      f.form = field->is_repeated() ? Form::kScalars : Form::kScalar;
    }
    AppendVarint(f.tag, (static_cast<uint64_t>(field->number()) << 3) |
                            WireTypeOf(field->type()));
    fields_.push_back(std::move(f));
  }
}

MessageFields::~MessageFields() = default;

bool MessageFields::Intern() {
  for (Field& f : fields_) {
    f.name = PyUnicode_InternFromString(f.field->name().c_str());
    if (f.name == nullptr) return false;
    if (f.message != nullptr && !f.message->Intern()) return false;
  }
  interned_ = true;
  return true;
}

size_t MessageFields::Find(PyObject* key, size_t next) {
  const size_t n = fields_.size();
  // Call sites pass interned names in the message's order, so a field is
  // found by pointer, mostly in one step from the previous one.
  for (size_t step = 0; step < n; ++step) {
    const size_t i = (next + step) % n;
    if (fields_[i].name == key) return i;
  }
  for (size_t i = 0; i < n; ++i) {
    const int equal = PyUnicode_Compare(fields_[i].name, key) == 0;
    if (PyErr_Occurred()) return n;
    if (equal) return i;
  }
  return n;
}

bool MessageFields::EncodeOne(const Field& f, PyObject* value,
                              std::string& out) {
  if (f.form == Form::kScalar) return EncodeScalar(f, value, out);
  if (value == Py_None) return true;  // left out
  const char* name = f.field->name().c_str();
  switch (f.form) {
    case Form::kChoice:
    case Form::kMessage: {
      out.append(f.tag);
      const size_t start = out.size();
      if (!(f.form == Form::kChoice ? f.message->EncodeChoice(value, out)
                                    : f.message->EncodeDict(value, out))) {
        return false;
      }
      PrefixLength(out, start);
      return true;
    }
    case Form::kMap: {
      if (!PyDict_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%s must be a dict, not %.100s", name,
                     Py_TYPE(value)->tp_name);
        return false;
      }
      Py_ssize_t pos = 0;
      PyObject* key = nullptr;
      PyObject* item = nullptr;
      while (PyDict_Next(value, &pos, &key, &item)) {
        // Held: encoding may run Python code (__index__) that edits the dict.
        Py_INCREF(key);
        Py_INCREF(item);
        out.append(f.tag);
        const size_t start = out.size();
        const bool ok = f.message->EncodeEntry(key, item, out);
        Py_DECREF(key);
        Py_DECREF(item);
        if (!ok) return false;
        PrefixLength(out, start);
      }
      return true;
    }
    default:  // kScalars, kMessages
      break;
  }
  if (!PyList_Check(value) && !PyTuple_Check(value)) {
    PyErr_Format(PyExc_TypeError, "%s must be a list or tuple, not %.100s",
                 name, Py_TYPE(value)->tp_name);
    return false;
  }
  // Sizes re-read each step, items held: a list may change meanwhile.
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(value); ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(value, i);
    Py_INCREF(item);
    bool ok = true;
    if (f.form == Form::kScalars) {
      ok = EncodeScalar(f, item, out, /*always=*/true);
    } else {
      out.append(f.tag);
      const size_t start = out.size();
      ok = f.message->EncodeDict(item, out);
      if (ok) PrefixLength(out, start);
    }
    Py_DECREF(item);
    if (!ok) return false;
  }
  return true;
}

bool MessageFields::EncodeDict(PyObject* dict, std::string& out) {
  if (!PyDict_Check(dict)) {
    PyErr_Format(PyExc_TypeError, "a %s must be a dict, not %.100s",
                 descriptor_->full_name().c_str(), Py_TYPE(dict)->tp_name);
    return false;
  }
  Py_ssize_t pos = 0;
  PyObject* key = nullptr;
  PyObject* value = nullptr;
  size_t next = 0;
  while (PyDict_Next(dict, &pos, &key, &value)) {
    if (!PyUnicode_Check(key)) {
      PyErr_Format(PyExc_TypeError, "a %s's keys must be field names (str)",
                   descriptor_->full_name().c_str());
      return false;
    }
    Py_INCREF(key);
    Py_INCREF(value);
    const size_t found = Find(key, next);
    bool ok = found < fields_.size();
    if (ok) {
      next = found + 1;
      ok = EncodeOne(fields_[found], value, out);
    } else if (!PyErr_Occurred()) {
      PyErr_Format(PyExc_TypeError, "%s has no field '%U'",
                   descriptor_->full_name().c_str(), key);
    }
    Py_DECREF(key);
    Py_DECREF(value);
    if (!ok) return false;
  }
  return true;
}

bool MessageFields::EncodeChoice(PyObject* value, std::string& out) {
  int kind = -1;
  if (PyBool_Check(value)) {
    kind = kBool;
  } else if (PyLong_Check(value)) {
    kind = kInt;
  } else if (PyFloat_Check(value)) {
    kind = kFloat;
  } else if (PyUnicode_Check(value)) {
    kind = kStr;
  } else if (PyObject_CheckBuffer(value)) {
    kind = kBytes;
  }
  // The first member that holds this kind of scalar.
  for (const Field& f : fields_) {
    if (kind >= 0 && ScalarOf(f.field->type()) == kind) {
      return EncodeScalar(f, value, out, /*always=*/true);
    }
  }
  PyErr_Format(PyExc_TypeError, "a %s cannot hold a %.100s",
               descriptor_->full_name().c_str(), Py_TYPE(value)->tp_name);
  return false;
}

bool MessageFields::EncodeEntry(PyObject* key, PyObject* value,
                                std::string& out) {
  return EncodeOne(fields_[0], key, out) && EncodeOne(fields_[1], value, out);
}

bool MessageFields::EncodeScalar(const Field& f, PyObject* value,
                                 std::string& out, bool always) {
  always = always || f.presence;
  const FieldDescriptor* field = f.field;
  const char* name = field->name().c_str();
  long long number = 0;
  switch (field->type()) {
    case FieldDescriptor::TYPE_STRING: {
      if (PyUnicode_Check(value)) {
        Py_ssize_t size = 0;
        const char* data = PyUnicode_AsUTF8AndSize(value, &size);
        if (data != nullptr) {
          AppendLength(out, f.tag, data, static_cast<size_t>(size), always);
          return true;
        }
        if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) return false;
        PyErr_Clear();  // lone surrogates: escaped below
      }
      if (!ToUtf8(value, name, "backslashreplace", scratch_)) return false;
      AppendLength(out, f.tag, scratch_.data(), scratch_.size(), always);
      return true;
    }
    case FieldDescriptor::TYPE_BYTES: {
      if (value == Py_None) return true;
      Py_buffer view;
      if (PyObject_GetBuffer(value, &view, PyBUF_CONTIG_RO) != 0) {
        return false;
      }
      AppendLength(out, f.tag, static_cast<const char*>(view.buf),
                   static_cast<size_t>(view.len), always);
      PyBuffer_Release(&view);
      return true;
    }
    case FieldDescriptor::TYPE_BOOL:
      if (!PyBool_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%s must be bool, not %.100s", name,
                     Py_TYPE(value)->tp_name);
        return false;
      }
      if (value == Py_True || always) {
        out.append(f.tag);
        out.push_back(value == Py_True ? 1 : 0);
      }
      return true;
    case FieldDescriptor::TYPE_DOUBLE:
    case FieldDescriptor::TYPE_FLOAT: {
      const double d = PyFloat_AsDouble(value);
      if (d == -1.0 && PyErr_Occurred()) return false;
      if (d == 0.0 && !std::signbit(d) && !always) return true;  // default
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
  return EncodeNumber(f, number, out, always);
}

bool MessageFields::EncodeNumber(const Field& f, long long number,
                                 std::string& out, bool always) {
  const FieldDescriptor* field = f.field;
  const char* name = field->name().c_str();
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
  if (bits == 0 && !always) return true;  // proto3 default
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

int MessageFields::IndexOf(std::string_view name) const {
  for (size_t i = 0; i < fields_.size(); ++i) {
    if (fields_[i].field->name() == name) return static_cast<int>(i);
  }
  return -1;
}

bool MessageFields::EncodeField(int index, PyObject* value,
                                std::string& out) {
  return EncodeOne(fields_[static_cast<size_t>(index)], value, out);
}

bool MessageFields::EncodeIntegerField(int index, long long value,
                                       std::string& out) {
  const Field& f = fields_[static_cast<size_t>(index)];
  if (f.form != Form::kScalar) {
    PyErr_Format(PyExc_TypeError, "%s is not a single scalar",
                 f.field->name().c_str());
    return false;
  }
  switch (f.field->type()) {
    case FieldDescriptor::TYPE_STRING:
    case FieldDescriptor::TYPE_BYTES:
    case FieldDescriptor::TYPE_BOOL:
    case FieldDescriptor::TYPE_DOUBLE:
    case FieldDescriptor::TYPE_FLOAT:
      PyErr_Format(PyExc_TypeError, "%s is not an integer field",
                   f.field->name().c_str());
      return false;
    default:
      return EncodeNumber(f, value, out, f.presence);
  }
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
  const Py_ssize_t count = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  size_t next = 0;
  for (Py_ssize_t k = 0; k < count; ++k) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    const size_t found = Find(key, next);
    if (found == fields_.size()) {
      if (!PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError,
                     "%s() got an unexpected keyword argument '%U'", function,
                     key);
      }
      return false;
    }
    next = found + 1;
    if (!EncodeOne(fields_[found], args[k], out)) return false;
  }
  return true;
}

}  // namespace agentix::worker
