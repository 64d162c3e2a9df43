#include "worker/python/msgpack_convert.h"

#include <msgpack.hpp>

#include <exception>
#include <new>

namespace agentix::worker {
namespace {

// Deep enough for any sane payload, shallow enough for the C stack.
constexpr uint32_t kMaxDepth = 512;

PyObject* Convert(const msgpack::object& o);

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
    packer.pack_double(PyFloat_AS_DOUBLE(object));
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
