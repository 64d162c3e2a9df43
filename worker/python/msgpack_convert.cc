#include "worker/python/msgpack_convert.h"

#include <datetime.h>
#include <msgpack.hpp>

#include <cstdint>
#include <cstring>
#include <exception>
#include <new>

namespace agentix::worker {
namespace {

// Deep enough for any sane payload, shallow enough for the C stack.
constexpr uint32_t kMaxDepth = 512;

PyObject* Convert(const msgpack::object& o);

// The msgpack timestamp extension type (seconds and nanoseconds since the
// Unix epoch, UTC), mapped to and from aware datetime.datetime.
constexpr int8_t kTimestampExt = -1;

// 1970-01-01T00:00:00+00:00 (a borrowed, process-lifetime reference), or
// nullptr with an exception set.
PyObject* Epoch() {
  static PyObject* epoch = nullptr;
  if (epoch != nullptr) return epoch;
  if (PyDateTimeAPI == nullptr) {
    PyDateTime_IMPORT;
    if (PyDateTimeAPI == nullptr) return nullptr;
  }
  epoch = PyDateTimeAPI->DateTime_FromDateAndTime(
      1970, 1, 1, 0, 0, 0, 0, PyDateTimeAPI->TimeZone_UTC,
      PyDateTimeAPI->DateTimeType);
  return epoch;
}

uint64_t BigEndian(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = v << 8 | static_cast<unsigned char>(p[i]);
  return v;
}

// A timestamp ext's body (4, 8 or 12 bytes) as an aware UTC datetime;
// nanoseconds are cut to datetime's microseconds.
PyObject* ConvertTimestamp(const char* body, uint32_t size) {
  int64_t seconds = 0;
  uint32_t nanos = 0;
  if (size == 4) {
    seconds = static_cast<int64_t>(BigEndian(body, 4));
  } else if (size == 8) {
    const uint64_t v = BigEndian(body, 8);
    nanos = static_cast<uint32_t>(v >> 34);
    seconds = static_cast<int64_t>(v & ((uint64_t{1} << 34) - 1));
  } else if (size == 12) {
    nanos = static_cast<uint32_t>(BigEndian(body, 4));
    seconds = static_cast<int64_t>(BigEndian(body + 4, 8));
  } else {
    PyErr_Format(PyExc_ValueError,
                 "msgpack timestamp of %u bytes (4, 8 or 12 expected)", size);
    return nullptr;
  }
  if (nanos >= 1000000000u) {
    PyErr_SetString(PyExc_ValueError, "msgpack timestamp nanoseconds >= 1e9");
    return nullptr;
  }
  PyObject* epoch = Epoch();
  if (epoch == nullptr) return nullptr;
  // Floor division keeps the day count right for times before 1970.
  int64_t days = seconds / 86400;
  int64_t rest = seconds % 86400;
  if (rest < 0) {
    rest += 86400;
    --days;
  }
  if (days > 999999999 || days < -999999999) {
    PyErr_SetString(PyExc_ValueError,
                    "msgpack timestamp outside datetime's range");
    return nullptr;
  }
  PyObject* delta = PyDelta_FromDSU(static_cast<int>(days),
                                    static_cast<int>(rest),
                                    static_cast<int>(nanos / 1000));
  if (delta == nullptr) return nullptr;
  PyObject* when = PyNumber_Add(epoch, delta);
  Py_DECREF(delta);
  if (when == nullptr && PyErr_ExceptionMatches(PyExc_OverflowError)) {
    PyErr_SetString(PyExc_ValueError,
                    "msgpack timestamp outside datetime's range");
  }
  return when;
}

PyObject* ConvertMap(const msgpack::object& o) {
  PyObject* dict = PyDict_New();
  if (dict == nullptr) return nullptr;
  for (uint32_t i = 0; i < o.via.map.size; ++i) {
    const msgpack::object_kv& kv = o.via.map.ptr[i];
    if (kv.key.type != msgpack::type::STR && kv.key.type != msgpack::type::BIN) {
      Py_DECREF(dict);
      PyErr_SetString(PyExc_ValueError,
                      "msgpack map keys must be str or bytes");
      return nullptr;
    }
    PyObject* key = Convert(kv.key);
    if (key == nullptr) {
      Py_DECREF(dict);
      return nullptr;
    }
    PyObject* value = Convert(kv.val);
    if (value == nullptr || PyDict_SetItem(dict, key, value) != 0) {
      Py_DECREF(key);
      Py_XDECREF(value);
      Py_DECREF(dict);
      return nullptr;
    }
    Py_DECREF(key);
    Py_DECREF(value);
  }
  return dict;
}

PyObject* Convert(const msgpack::object& o) {
  switch (o.type) {
    case msgpack::type::NIL:
      Py_RETURN_NONE;
    case msgpack::type::BOOLEAN:
      return PyBool_FromLong(o.via.boolean ? 1 : 0);
    case msgpack::type::POSITIVE_INTEGER:
      return PyLong_FromUnsignedLongLong(o.via.u64);
    case msgpack::type::NEGATIVE_INTEGER:
      return PyLong_FromLongLong(o.via.i64);
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64:
      return PyFloat_FromDouble(o.via.f64);
    case msgpack::type::STR:
      return PyUnicode_DecodeUTF8(o.via.str.ptr, o.via.str.size, "strict");
    case msgpack::type::BIN:
      return PyBytes_FromStringAndSize(o.via.bin.ptr, o.via.bin.size);
    case msgpack::type::ARRAY: {
      if (Py_EnterRecursiveCall(" while decoding msgpack") != 0) return nullptr;
      PyObject* list = PyList_New(o.via.array.size);
      for (uint32_t i = 0; list != nullptr && i < o.via.array.size; ++i) {
        PyObject* item = Convert(o.via.array.ptr[i]);
        if (item == nullptr) {
          Py_CLEAR(list);
          break;
        }
        PyList_SET_ITEM(list, i, item);  // steals the reference
      }
      Py_LeaveRecursiveCall();
      return list;
    }
    case msgpack::type::MAP: {
      if (Py_EnterRecursiveCall(" while decoding msgpack") != 0) return nullptr;
      PyObject* dict = ConvertMap(o);
      Py_LeaveRecursiveCall();
      return dict;
    }
    case msgpack::type::EXT:
      if (o.via.ext.type() == kTimestampExt) {
        return ConvertTimestamp(o.via.ext.data(), o.via.ext.size);
      }
      PyErr_Format(PyExc_ValueError, "unsupported msgpack ext type %d",
                   static_cast<int>(o.via.ext.type()));
      return nullptr;
  }
  PyErr_SetString(PyExc_ValueError, "unknown msgpack object type");
  return nullptr;
}

struct StringSink {
  std::string& out;
  void write(const char* data, size_t size) { out.append(data, size); }
};
using Packer = msgpack::packer<StringSink>;

bool PackBytes(Packer& packer, const char* data, size_t size) {
  if (size > 0xffffffffu) {
    PyErr_SetString(PyExc_ValueError, "bytes too large for msgpack");
    return false;
  }
  packer.pack_bin(static_cast<uint32_t>(size));
  packer.pack_bin_body(data, static_cast<uint32_t>(size));
  return true;
}

bool Pack(Packer& packer, PyObject* object);

// An aware datetime as a timestamp ext in its smallest form; a naive one
// is refused (its instant is unknown).
bool PackDateTime(Packer& packer, PyObject* object) {
  // The C accessor, not getattr: no attribute-name string is made (a
  // looked-up name would sit in CPython's type cache, which the fuzzer's
  // leak check sees as growth).
  const bool naive = !PyDateTime_Check(object) ||
                     PyDateTime_DATE_GET_TZINFO(object) == Py_None;
  if (naive) {
    PyErr_SetString(PyExc_TypeError,
                    "agentix.codec: cannot encode a naive datetime (no "
                    "tzinfo) as a msgpack timestamp; give it one, e.g. "
                    "datetime.timezone.utc");
    return false;
  }
  PyObject* epoch = Epoch();
  if (epoch == nullptr) return false;
  PyObject* delta = PyNumber_Subtract(object, epoch);
  if (delta == nullptr) return false;
  if (!PyDelta_Check(delta)) {
    Py_DECREF(delta);
    PyErr_SetString(PyExc_TypeError, "datetime subtraction gave no timedelta");
    return false;
  }
  const int64_t seconds =
      int64_t{PyDateTime_DELTA_GET_DAYS(delta)} * 86400 +
      PyDateTime_DELTA_GET_SECONDS(delta);
  const uint32_t nanos =
      static_cast<uint32_t>(PyDateTime_DELTA_GET_MICROSECONDS(delta)) * 1000;
  Py_DECREF(delta);
  char body[12];
  uint32_t size;
  auto put = [&](char* at, uint64_t v, int bytes) {
    for (int i = bytes - 1; i >= 0; --i, v >>= 8) at[i] = static_cast<char>(v & 0xff);
  };
  if (seconds >= 0 && (seconds >> 34) == 0) {
    if (nanos == 0 && seconds <= 0xffffffff) {
      size = 4;
      put(body, static_cast<uint64_t>(seconds), 4);
    } else {
      size = 8;
      put(body, uint64_t{nanos} << 34 | static_cast<uint64_t>(seconds), 8);
    }
  } else {
    size = 12;
    put(body, nanos, 4);
    put(body + 4, static_cast<uint64_t>(seconds), 8);
  }
  packer.pack_ext(size, kTimestampExt);
  packer.pack_ext_body(body, size);
  return true;
}

bool PackSequence(Packer& packer, PyObject* sequence) {
  const Py_ssize_t size = PySequence_Fast_GET_SIZE(sequence);
  PyObject** items = PySequence_Fast_ITEMS(sequence);
  packer.pack_array(static_cast<uint32_t>(size));
  for (Py_ssize_t i = 0; i < size; ++i) {
    if (!Pack(packer, items[i])) return false;
  }
  return true;
}

bool PackDict(Packer& packer, PyObject* dict) {
  packer.pack_map(static_cast<uint32_t>(PyDict_GET_SIZE(dict)));
  Py_ssize_t pos = 0;
  PyObject* key = nullptr;
  PyObject* value = nullptr;
  Py_ssize_t seen = 0;
  const Py_ssize_t size = PyDict_GET_SIZE(dict);
  while (PyDict_Next(dict, &pos, &key, &value)) {
    // Borrowed references: packing runs no Python code, so the dict cannot
    // change underneath us.
    if (!Pack(packer, key) || !Pack(packer, value)) return false;
    ++seen;
  }
  if (seen != size) {
    PyErr_SetString(PyExc_RuntimeError, "dict changed size during encoding");
    return false;
  }
  return true;
}

bool Pack(Packer& packer, PyObject* object) {
  if (object == Py_None) {
    packer.pack_nil();
    return true;
  }
  if (PyBool_Check(object)) {
    if (object == Py_True) packer.pack_true(); else packer.pack_false();
    return true;
  }
  if (PyLong_Check(object)) {
    int overflow = 0;
    const long long value = PyLong_AsLongLongAndOverflow(object, &overflow);
    if (overflow == 0) {
      if (value == -1 && PyErr_Occurred()) return false;
      packer.pack_int64(value);
      return true;
    }
    if (overflow > 0) {
      const unsigned long long u = PyLong_AsUnsignedLongLong(object);
      if (!PyErr_Occurred()) {
        packer.pack_uint64(u);
        return true;
      }
      PyErr_Clear();
    }
    PyErr_SetString(PyExc_OverflowError, "int too big for msgpack");
    return false;
  }
  if (PyFloat_Check(object)) {
    // Always float 64: msgpack-cxx's pack_double writes a whole value
    // (2.0) as an int, which would decode as int on the other side.
    const double value = PyFloat_AS_DOUBLE(object);
    uint64_t bits;
    static_assert(sizeof bits == sizeof value);
    std::memcpy(&bits, &value, sizeof bits);
    char raw[9];
    raw[0] = static_cast<char>(0xcb);
    for (int i = 8; i >= 1; --i, bits >>= 8) raw[i] = static_cast<char>(bits & 0xff);
    packer.pack_bin_body(raw, sizeof raw);  // appends the bytes as they are
    return true;
  }
  if (PyUnicode_Check(object)) {
    Py_ssize_t size = 0;
    const char* data = PyUnicode_AsUTF8AndSize(object, &size);
    if (data == nullptr) return false;
    if (static_cast<size_t>(size) > 0xffffffffu) {
      PyErr_SetString(PyExc_ValueError, "str too large for msgpack");
      return false;
    }
    packer.pack_str(static_cast<uint32_t>(size));
    packer.pack_str_body(data, static_cast<uint32_t>(size));
    return true;
  }
  if (PyBytes_Check(object)) {
    return PackBytes(packer, PyBytes_AS_STRING(object),
                     static_cast<size_t>(PyBytes_GET_SIZE(object)));
  }
  if (PyByteArray_Check(object)) {
    return PackBytes(packer, PyByteArray_AS_STRING(object),
                     static_cast<size_t>(PyByteArray_GET_SIZE(object)));
  }
  if (PyMemoryView_Check(object)) {
    Py_buffer view;
    if (PyObject_GetBuffer(object, &view, PyBUF_CONTIG_RO) != 0) return false;
    const bool ok = PackBytes(packer, static_cast<const char*>(view.buf),
                              static_cast<size_t>(view.len));
    PyBuffer_Release(&view);
    return ok;
  }
  if (Epoch() == nullptr) return false;  // imports the datetime C API
  if (PyDateTime_Check(object)) return PackDateTime(packer, object);
  const bool is_list = PyList_Check(object);
  if (is_list || PyTuple_Check(object) || PyDict_Check(object)) {
    if (Py_EnterRecursiveCall(" while encoding msgpack") != 0) return false;
    bool ok;
    if (PyDict_Check(object)) {
      ok = PackDict(packer, object);
    } else {
      // A list could be mutated by nothing here (no Python code runs), but
      // PySequence_Fast keeps a strong reference to be safe.
      PyObject* fast = PySequence_Fast(object, "expected a sequence");
      ok = fast != nullptr && PackSequence(packer, fast);
      Py_XDECREF(fast);
    }
    Py_LeaveRecursiveCall();
    return ok;
  }
  PyErr_Format(PyExc_TypeError, "agentix.codec: cannot encode %R",
               reinterpret_cast<PyObject*>(Py_TYPE(object)));
  return false;
}

}  // namespace

PyObject* MsgpackToPython(const char* data, size_t size) {
  try {
    // msgpack-cxx reserves room for every element an array or map header
    // claims (up to 2^32 of them) before reading any, so a few hostile bytes
    // could cost gigabytes (found by //fuzz:msgpack_convert_fuzzer). A first
    // pass with the allocation-free null_visitor proves the input holds every
    // claimed element; after it, what unpack allocates is bounded by `size`.
    msgpack::null_visitor validator;
    std::size_t checked = 0;
    if (!msgpack::parse(data, size, checked, validator)) {
      PyErr_SetString(PyExc_ValueError, "malformed or truncated msgpack");
      return nullptr;
    }
    msgpack::unpack_limit limits(0xffffffff, 0xffffffff, 0xffffffff,
                                 0xffffffff, 0xffffffff, kMaxDepth);
    std::size_t offset = 0;
    msgpack::object_handle handle =
        msgpack::unpack(data, size, offset, nullptr, nullptr, limits);
    if (offset != size) {
      PyErr_SetString(PyExc_ValueError,
                      "trailing bytes after the msgpack value");
      return nullptr;
    }
    return Convert(handle.get());
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
    return nullptr;
  } catch (const std::exception& e) {
    PyErr_Format(PyExc_ValueError, "malformed msgpack: %s", e.what());
    return nullptr;
  }
}

bool PythonToMsgpack(PyObject* object, std::string& out) {
  try {
    StringSink sink{out};
    Packer packer(sink);
    return Pack(packer, object);
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
    return false;
  } catch (const std::exception& e) {
    PyErr_Format(PyExc_RuntimeError, "msgpack encoding failed: %s", e.what());
    return false;
  }
}

}  // namespace agentix::worker
