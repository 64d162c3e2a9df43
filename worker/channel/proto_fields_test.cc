// MessageFields on a message of every shape (built here, not from
// runtime.proto): each field's Python form follows from its type alone.
#include <catch2/catch.hpp>
#include <climits>
#include <memory>
#include <string>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/text_format.h>

#include "worker/channel/channel_test_util.h"
#include "worker/channel/proto_fields.h"

namespace agentix::worker {
namespace {

namespace pb = google::protobuf;

// package probe; message Value { oneof v { string s = 1; int64 i = 2; } }
// message Inner { string name = 1; repeated int32 ns = 2; }
// message Probe { repeated sint64 nums = 1; Inner inner = 2;
//   repeated Inner inners = 3; map<string, int64> counts = 4;
//   Value value = 5; string owned = 6; double d = 7; int64 n = 8;
//   sint32 z = 9; }
const pb::Descriptor* ProbeDescriptor() {
  static pb::DescriptorPool* pool = [] {
    const char* text = R"pb(
      name: "probe.proto" package: "probe" syntax: "proto3"
      message_type {
        name: "Value"
        oneof_decl { name: "v" }
        field { name: "s" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL oneof_index: 0 }
        field { name: "i" number: 2 type: TYPE_INT64 label: LABEL_OPTIONAL oneof_index: 0 }
      }
      message_type {
        name: "Inner"
        field { name: "name" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
        field { name: "ns" number: 2 type: TYPE_INT32 label: LABEL_REPEATED }
      }
      message_type {
        name: "Probe"
        field { name: "nums" number: 1 type: TYPE_SINT64 label: LABEL_REPEATED }
        field { name: "inner" number: 2 type: TYPE_MESSAGE label: LABEL_OPTIONAL type_name: ".probe.Inner" }
        field { name: "inners" number: 3 type: TYPE_MESSAGE label: LABEL_REPEATED type_name: ".probe.Inner" }
        field { name: "counts" number: 4 type: TYPE_MESSAGE label: LABEL_REPEATED type_name: ".probe.Probe.CountsEntry" }
        field { name: "value" number: 5 type: TYPE_MESSAGE label: LABEL_OPTIONAL type_name: ".probe.Value" }
        field { name: "owned" number: 6 type: TYPE_STRING label: LABEL_OPTIONAL }
        field { name: "d" number: 7 type: TYPE_DOUBLE label: LABEL_OPTIONAL }
        field { name: "n" number: 8 type: TYPE_INT64 label: LABEL_OPTIONAL }
        field { name: "z" number: 9 type: TYPE_SINT32 label: LABEL_OPTIONAL }
        nested_type {
          name: "CountsEntry"
          options { map_entry: true }
          field { name: "key" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
          field { name: "value" number: 2 type: TYPE_INT64 label: LABEL_OPTIONAL }
        }
      }
    )pb";
    pb::FileDescriptorProto file;
    REQUIRE(pb::TextFormat::ParseFromString(text, &file));
    auto* p = new pb::DescriptorPool();
    REQUIRE(p->BuildFile(file) != nullptr);
    return p;
  }();
  return pool->FindMessageTypeByName("probe.Probe");
}

// Encodes probe(**kwargs), kwargs being a Python dict expression; returns
// the message's text form, or "error: <type>: <message>".
MessageFields& ProbeFields() {
  static MessageFields* fields =
      new MessageFields(ProbeDescriptor(), {"owned"});
  return *fields;
}

std::string Encode(const std::string& kwargs) {
  MessageFields* fields = &ProbeFields();
  Py("kw = " + kwargs + "\nnames = tuple(kw)\nvalues = tuple(kw.values())\n");
  PyObject* main = PyModule_GetDict(PyImport_AddModule("__main__"));
  PyObject* names = PyDict_GetItemString(main, "names");
  PyObject* values = PyDict_GetItemString(main, "values");
  std::string out;
  if (!fields->Encode("probe", PySequence_Fast_ITEMS(values), 0, names,
                      out)) {
    PythonError error = FetchPythonError();
    return "error: " + error.type + ": " + error.message;
  }
  pb::DynamicMessageFactory factory;
  std::unique_ptr<pb::Message> message(
      factory.GetPrototype(ProbeDescriptor())->New());
  REQUIRE(message->ParseFromString(out));
  std::string text;
  pb::TextFormat::Printer printer;
  printer.SetSingleLineMode(true);
  printer.PrintToString(*message, &text);
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text;
}

TEST_CASE("Every field shape has a Python form from its descriptor",
          "[channel][proto_fields]") {
  EnsureChannelInterpreter();
  // Repeated scalars: a list (zeros kept: they are items).
  CHECK(Encode("{'nums': [3, 0, -2]}") == "nums: 3 nums: 0 nums: -2");
  // A message: a dict of its fields, nested lists too.
  CHECK(Encode("{'inner': {'name': 'a', 'ns': (1, 2)}}") ==
        "inner { name: \"a\" ns: 1 ns: 2 }");
  // An empty dict is a present, all-default message.
  CHECK(Encode("{'inner': {}}") == "inner { }");
  // A repeated message: a list of dicts.
  CHECK(Encode("{'inners': [{'name': 'x'}, {}]}") ==
        "inners { name: \"x\" } inners { }");
  // A map: a dict.
  CHECK(Encode("{'counts': {'k': 5, 'z': 0}}") ==
        "counts { key: \"k\" value: 5 } counts { key: \"z\" value: 0 }");
  // One oneof of scalars: the scalar, its type picking the member (a zero
  // is written: it is the member's presence).
  CHECK(Encode("{'value': 0}") == "value { i: 0 }");
  CHECK(Encode("{'value': ''}") == "value { s: \"\" }");
  // None leaves any message or repeated field out.
  CHECK(Encode("{'inner': None, 'nums': None, 'counts': None, 'd': 1.5}") ==
        "d: 1.5");
  // Refused: the receiver's field, wrong forms, members of no such type.
  CHECK(Encode("{'owned': 'x'}") ==
        "error: TypeError: probe() got an unexpected keyword argument "
        "'owned'");
  CHECK(Encode("{'nums': 3}") ==
        "error: TypeError: nums must be a list or tuple, not int");
  CHECK(Encode("{'nums': ['3']}") ==
        "error: TypeError: nums must be int, not str");
  CHECK(Encode("{'inner': {'nme': 'a'}}") ==
        "error: TypeError: probe.Inner has no field 'nme'");
  CHECK(Encode("{'counts': [('k', 1)]}") ==
        "error: TypeError: counts must be a dict, not list");
  CHECK(Encode("{'value': 1.5}") ==
        "error: TypeError: a probe.Value cannot hold a float");
}

// EncodeIntegerField(name, value): the bytes, or "error: <type>: <message>".
std::string EncodeInteger(const char* name, long long value) {
  std::string out;
  if (!ProbeFields().EncodeIntegerField(ProbeFields().IndexOf(name), value,
                                        out)) {
    PythonError error = FetchPythonError();
    return "error: " + error.type + ": " + error.message;
  }
  return out;
}

// EncodeField(name, int(value)): the bytes, or "error: ...".
std::string EncodePythonInteger(const char* name, long long value) {
  std::string out;
  PyObject* number = PyLong_FromLongLong(value);
  REQUIRE(number != nullptr);
  const bool ok =
      ProbeFields().EncodeField(ProbeFields().IndexOf(name), number, out);
  Py_DECREF(number);
  if (!ok) {
    PythonError error = FetchPythonError();
    return "error: " + error.type + ": " + error.message;
  }
  return out;
}

TEST_CASE("An integer field from a C integer: the bytes of its Python int",
          "[channel][proto_fields]") {
  EnsureChannelInterpreter();
  Encode("{}");  // interns the field names
  for (long long value : {0LL, 1LL, -1LL, 1704164645123456000LL, LLONG_MIN,
                          LLONG_MAX}) {
    INFO(value);
    CHECK(EncodeInteger("n", value) == EncodePythonInteger("n", value));
  }
  CHECK(EncodeInteger("n", 0).empty());  // proto3's default: left out
  CHECK(EncodeInteger("n", 300) == std::string("\x40\xac\x02", 3));
  for (long long value : {0LL, 5LL, -5LL, 2147483647LL}) {
    INFO(value);
    CHECK(EncodeInteger("z", value) == EncodePythonInteger("z", value));
  }
  CHECK(EncodeInteger("z", -1) == std::string("\x48\x01", 2));  // zigzag
  CHECK(EncodeInteger("z", 2147483648LL) == EncodePythonInteger("z", 2147483648LL));
  CHECK(EncodeInteger("z", 2147483648LL).rfind("error: ValueError", 0) == 0);
  // Not a single integer: refused.
  CHECK(EncodeInteger("d", 1) == "error: TypeError: d is not an integer field");
  CHECK(EncodeInteger("nums", 1) ==
        "error: TypeError: nums is not a single scalar");
}

}  // namespace
}  // namespace agentix::worker
