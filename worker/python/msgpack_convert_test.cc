#include "worker/python/msgpack_convert.h"

#include <catch2/catch.hpp>
#include <msgpack.hpp>

#include "worker/python/py_error.h"
#include "worker/python/test_interpreter.h"

namespace agentix::worker {
namespace {

// repr() of a Python object, consuming the reference.
std::string Repr(PyObject* object) {
  REQUIRE(object != nullptr);
  PyObject* repr = PyObject_Repr(object);
  Py_DECREF(object);
  REQUIRE(repr != nullptr);
  std::string out = PyUnicode_AsUTF8(repr);
  Py_DECREF(repr);
  return out;
}

std::string Encode(const char* expression) {
  PyObject* value = testing::EvalPython(expression);
  REQUIRE(value != nullptr);
  std::string out;
  const bool ok = PythonToMsgpack(value, out);
  Py_DECREF(value);
  if (!ok) {
    PythonError error = FetchPythonError();
    FAIL(error.type << ": " << error.message);
  }
  return out;
}

PythonError EncodeError(const char* expression) {
  PyObject* value = testing::EvalPython(expression);
  REQUIRE(value != nullptr);
  std::string out;
  REQUIRE_FALSE(PythonToMsgpack(value, out));
  Py_DECREF(value);
  REQUIRE(PyErr_Occurred());
  return FetchPythonError();
}

PythonError DecodeError(const std::string& bytes) {
  REQUIRE(MsgpackToPython(bytes.data(), bytes.size()) == nullptr);
  REQUIRE(PyErr_Occurred());
  return FetchPythonError();
}

std::string RoundTrip(const char* expression) {
  const std::string bytes = Encode(expression);
  return Repr(MsgpackToPython(bytes.data(), bytes.size()));
}

TEST_CASE("Python values round-trip through msgpack", "[msgpack]") {
  testing::EnsureInterpreter();
  REQUIRE(RoundTrip("None") == "None");
  REQUIRE(RoundTrip("[True, False]") == "[True, False]");
  REQUIRE(RoundTrip("[0, -1, 127, -32, 2**63 - 1, -2**63, 2**64 - 1]") ==
          "[0, -1, 127, -32, 9223372036854775807, -9223372036854775808, "
          "18446744073709551615]");
  REQUIRE(RoundTrip("1.5") == "1.5");
  REQUIRE(RoundTrip("'h\\u00e9llo'") == "'héllo'");
  REQUIRE(RoundTrip("b'\\x00\\xff'") == "b'\\x00\\xff'");
  REQUIRE(RoundTrip("bytearray(b'ab')") == "b'ab'");
  REQUIRE(RoundTrip("memoryview(b'cd')") == "b'cd'");
  // Tuples become lists, as msgpack-python does.
  REQUIRE(RoundTrip("(1, (2, 3))") == "[1, [2, 3]]");
  REQUIRE(RoundTrip("{'a': {b'k': [1, {}]}}") == "{'a': {b'k': [1, {}]}}");
}

TEST_CASE("Types msgpack cannot carry are refused", "[msgpack]") {
  testing::EnsureInterpreter();
  PythonError error = EncodeError("{1, 2}");
  REQUIRE(error.type == "TypeError");
  REQUIRE(error.message == "agentix.codec: cannot encode <class 'set'>");
  REQUIRE(EncodeError("2**64").type == "OverflowError");
  REQUIRE(EncodeError("-2**63 - 1").type == "OverflowError");
  REQUIRE(EncodeError("'\\ud800'").type == "UnicodeEncodeError");
  testing::RunPython("_cycle = []\n_cycle.append(_cycle)\n");
  REQUIRE(EncodeError("_cycle").type == "RecursionError");
}

TEST_CASE("Bad msgpack input raises ValueError", "[msgpack]") {
  testing::EnsureInterpreter();
  REQUIRE(DecodeError("").type == "ValueError");
  REQUIRE(DecodeError("\x92\x01").type == "ValueError");  // truncated array
  PythonError trailing = DecodeError(std::string("\x01\x02", 2));
  REQUIRE(trailing.message == "trailing bytes after the msgpack value");
  // {1: 2}: int keys are refused (strict_map_key).
  REQUIRE(DecodeError("\x81\x01\x02").message ==
          "msgpack map keys must be str or bytes");
  // fixext1 type 5.
  REQUIRE(DecodeError(std::string("\xd4\x05\x00", 3)).message ==
          "unsupported msgpack ext type 5");
  // Invalid UTF-8 in a str.
  REQUIRE(DecodeError("\xa1\xff").type == "UnicodeDecodeError");
}

TEST_CASE("Container headers claiming more elements than the input holds "
          "are refused before anything is allocated", "[msgpack]") {
  testing::EnsureInterpreter();
  // map32 / array32 claiming 2^32-1 entries: msgpack-cxx alone would reserve
  // about 128 GiB (MemoryError) or, for ~17 million entries, 1 GiB.
  REQUIRE(DecodeError("\xdf\xff\xff\xff\xff\xa1k\x01").message ==
          "malformed or truncated msgpack");
  REQUIRE(DecodeError("\xdd\xff\xff\xff\xff\x01").message ==
          "malformed or truncated msgpack");
  // The 14-byte input the fuzzer found: a map32 of 0x010381a1 entries
  // nested in arrays.
  REQUIRE(DecodeError(std::string("\x92\x93\x01\x92\x01\xdf\x01\x03\x81\xa1"
                                  "\x0e\x92\x01\x02",
                                  14))
              .type == "ValueError");
}

TEST_CASE("Whole floats stay floats; bytes and str stay apart", "[msgpack]") {
  testing::EnsureInterpreter();
  CHECK(Encode("2.0") == std::string("\xcb\x40\x00\x00\x00\x00\x00\x00\x00", 9));
  CHECK(RoundTrip("[2.0, -0.0, 1e300]") == "[2.0, -0.0, 1e+300]");
  CHECK(Encode("'a'") == "\xa1" "a");
  CHECK(Encode("b'a'") == std::string("\xc4\x01" "a", 3));
  CHECK(Repr(MsgpackToPython("\xca\x40\x00\x00\x00", 5)) == "2.0");  // float32
}

TEST_CASE("The timestamp extension maps to aware datetimes, both ways",
          "[msgpack]") {
  testing::EnsureInterpreter();
  testing::RunPython("import datetime as _dt\n_utc = _dt.timezone.utc\n");
  // timestamp32: seconds only.
  CHECK(Encode("_dt.datetime(2020, 1, 2, 3, 4, 5, tzinfo=_utc)") ==
        std::string("\xd6\xff\x5e\x0d\x5d\xa5", 6));
  CHECK(Repr(MsgpackToPython("\xd6\xff\x5e\x0d\x5d\xa5", 6)) ==
        "datetime.datetime(2020, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)");
  // timestamp64 (microseconds) and timestamp96 (before 1970, after 2514).
  for (const char* value :
       {"_dt.datetime(2020, 1, 2, 3, 4, 5, 678901, tzinfo=_utc)",
        "_dt.datetime(1969, 12, 31, 23, 59, 59, 500000, tzinfo=_utc)",
        "_dt.datetime(1, 1, 1, tzinfo=_utc)",
        "_dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=_utc)"}) {
    INFO(value);
    CHECK(RoundTrip(value) == Repr(testing::EvalPython(value)));
  }
  CHECK(Encode("_dt.datetime(2020, 1, 2, 3, 4, 5, 678901, tzinfo=_utc)")
            .substr(0, 2) == "\xd7\xff");
  CHECK(Encode("_dt.datetime(1969, 12, 31, tzinfo=_utc)").substr(0, 3) ==
        "\xc7\x0c\xff");
  // Another zone: the same instant, returned in UTC.
  CHECK(RoundTrip("_dt.datetime(2020, 1, 2, 5, 4, 5, tzinfo=_dt.timezone("
                  "_dt.timedelta(hours=2)))") ==
        "datetime.datetime(2020, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)");
  // Nanoseconds are cut to microseconds: 1 s + 1,999 ns.
  CHECK(Repr(MsgpackToPython(std::string("\xd7\xff\x00\x00\x1f\x3c\x00\x00\x00\x01", 10).data(), 10)) ==
        "datetime.datetime(1970, 1, 1, 0, 0, 1, 1, tzinfo=datetime.timezone.utc)");
  // A naive datetime has no instant; malformed timestamps are refused.
  CHECK(EncodeError("_dt.datetime(2020, 1, 2)").type == "TypeError");
  CHECK(DecodeError(std::string("\xd5\xff\x00\x00", 4)).message ==
        "msgpack timestamp of 2 bytes (4, 8 or 12 expected)");
  CHECK(DecodeError(std::string("\xd7\xff\xff\xff\xff\xfc\x00\x00\x00\x00", 10))
            .message == "msgpack timestamp nanoseconds >= 1e9");
  CHECK(DecodeError(std::string("\xc7\x0c\xff\x00\x00\x00\x00\x7f\xff\xff\xff"
                                "\xff\xff\xff\xff", 15))
            .message == "msgpack timestamp outside datetime's range");
}

TEST_CASE("msgpack written by msgpack-cxx decodes", "[msgpack]") {
  testing::EnsureInterpreter();
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> packer(buffer);
  packer.pack_array(2);
  packer.pack_array(2);
  packer.pack(1);
  packer.pack(2.5f);
  packer.pack_map(1);
  packer.pack(std::string("key"));
  packer.pack_nil();
  REQUIRE(Repr(MsgpackToPython(buffer.data(), buffer.size())) ==
          "[[1, 2.5], {'key': None}]");
}

}  // namespace
}  // namespace agentix::worker
