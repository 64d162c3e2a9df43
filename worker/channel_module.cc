#include "worker/channel_module.h"

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>

#include "base/log.h"
#include "worker/ipc/frame.h"
#include "worker/ipc/io.h"
#include "worker/python/msgpack_convert.h"

namespace agentix::worker {
namespace {

// Frame kinds as the driver sees them.
enum FrameKind : int {
  kCall = 1,
  kArgChunk = 2,
  kCancel = 3,
  kShutdown = 4,
  kStreamAck = 5,
};

// Read syscall size; reused for every read.
constexpr size_t kReadBufferBytes = 256 * 1024;
// Bytes read per read_frames() call at most, so that a long stream of
// argument chunks cannot starve the event loop; the fd stays readable and the
// loop calls again.
constexpr size_t kMaxReadPerCall = 8 * 1024 * 1024;
// Queued output is written once it reaches this size, without waiting for
// flush().
constexpr size_t kFlushThreshold = 256 * 1024;

// The C++ side of a Channel object. Touched only with the GIL held, except
// `out`/`fd` during a write, which the `busy` flag protects.
struct ChannelState {
  int fd = -1;
  ipc::FrameReader reader;
  std::unique_ptr<char[]> read_buffer;
  std::string out;  // encoded frames not yet written
  bool eof = false;
  bool dead = false;  // desynchronised: every later read fails
  std::string dead_reason;
  bool busy = false;  // a write with the GIL released is in flight
  // Wakes threads waiting in Enter() for `busy` to clear.
  std::mutex idle_mu;
  std::condition_variable idle_cv;
};

struct ChannelObject {
  PyObject_HEAD
  ChannelState* state;
};

struct ModuleState {
  PyObject* protocol_error;
  PyObject* channel_error;
  PyObject* channel_type;
};

ModuleState* StateOfModule(PyObject* module) {
  return static_cast<ModuleState*>(PyModule_GetState(module));
}

ModuleState* StateOfChannel(PyObject* self) {
  return static_cast<ModuleState*>(PyType_GetModuleState(Py_TYPE(self)));
}

ChannelState& Channel(PyObject* self) {
  return *reinterpret_cast<ChannelObject*>(self)->state;
}

// ---- small conversions ------------------------------------------------------

PyObject* Str(const std::string& s) {
  // call ids and callable names round-trip byte-exactly.
  return PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()),
                              "surrogateescape");
}

PyObject* Bytes(const std::string& s) {
  return PyBytes_FromStringAndSize(s.data(), static_cast<Py_ssize_t>(s.size()));
}

// str -> UTF-8. `errors` is "surrogateescape" for ids that must round-trip
// and "backslashreplace" for human text that must be valid UTF-8.
bool ToUtf8(PyObject* object, const char* what, const char* errors,
            std::string& out) {
  if (!PyUnicode_Check(object)) {
    PyErr_Format(PyExc_TypeError, "%s must be str, not %.100s", what,
                 Py_TYPE(object)->tp_name);
    return false;
  }
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(object, &size);
  if (data != nullptr) {
    out.assign(data, static_cast<size_t>(size));
    return true;
  }
  if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) return false;
  PyErr_Clear();
  PyObject* bytes = PyUnicode_AsEncodedString(object, "utf-8", errors);
  if (bytes == nullptr) return false;
  out.assign(PyBytes_AS_STRING(bytes),
             static_cast<size_t>(PyBytes_GET_SIZE(bytes)));
  Py_DECREF(bytes);
  return true;
}

bool ToInt(PyObject* object, const char* what, long long& out) {
  if (!PyLong_Check(object)) {
    PyErr_Format(PyExc_TypeError, "%s must be int, not %.100s", what,
                 Py_TYPE(object)->tp_name);
    return false;
  }
  out = PyLong_AsLongLong(object);
  return !(out == -1 && PyErr_Occurred());
}

bool CheckArgs(const char* name, Py_ssize_t nargs, Py_ssize_t want) {
  if (nargs == want) return true;
  PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name,
               want, nargs);
  return false;
}

// Builds a tuple from new references; on any nullptr releases the others and
// returns nullptr (the error is already set).
PyObject* Tuple(std::initializer_list<PyObject*> items) {
  bool ok = true;
  for (PyObject* item : items) ok = ok && item != nullptr;
  PyObject* tuple = ok ? PyTuple_New(static_cast<Py_ssize_t>(items.size()))
                       : nullptr;
  Py_ssize_t i = 0;
  for (PyObject* item : items) {
    if (tuple != nullptr) {
      PyTuple_SET_ITEM(tuple, i++, item);  // steals
    } else {
      Py_XDECREF(item);
    }
  }
  return tuple;
}

// Runs `fn` (which must not touch Python) with the GIL released, converting
// C++ exceptions to a Status so none unwinds through CPython frames.
template <typename Fn>
absl::Status WithoutGil(Fn&& fn) {
  absl::Status status;
  Py_BEGIN_ALLOW_THREADS
  try {
    status = fn();
  } catch (const std::bad_alloc&) {
    status = absl::ResourceExhaustedError("out of memory");
  } catch (const std::exception& e) {
    status = absl::InternalError(e.what());
  }
  Py_END_ALLOW_THREADS
  return status;
}

// Sets the Python error for a failed status from a C++ helper.
void SetError(PyObject* type, const absl::Status& status) {
  if (status.code() == absl::StatusCode::kResourceExhausted &&
      status.message() == "out of memory") {
    PyErr_NoMemory();
    return;
  }
  PyErr_SetString(type, std::string(status.message()).c_str());
}

// Waits (with the GIL released) while another thread has a write in flight.
// Pool threads send their own replies, so several threads use one channel;
// `busy` is only read and written with the GIL held, and a waiter must let
// go of the GIL or the writer could never take it back to clear the flag.
bool Enter(PyObject* self) {
  ChannelState& st = Channel(self);
  while (st.busy) {
    Py_BEGIN_ALLOW_THREADS
    std::unique_lock<std::mutex> lock(st.idle_mu);
    // Timed: the notify may land between the check above and this wait.
    st.idle_cv.wait_for(lock, std::chrono::milliseconds(1));
    Py_END_ALLOW_THREADS
  }
  return true;
}

// Marks the end of a write begun with `busy = true`. GIL held.
void Leave(ChannelState& st) {
  st.busy = false;
  st.idle_cv.notify_all();
}

// Writes everything queued. GIL held on entry and exit.
bool Flush(PyObject* self) {
  ChannelState& st = Channel(self);
  if (st.out.empty()) return true;
  st.busy = true;
  absl::Status status = WithoutGil([&st] {
    absl::Status s = ipc::WriteAll(st.fd, st.out);
    st.out.clear();
    return s;
  });
  Leave(st);
  if (!status.ok()) {
    SetError(StateOfChannel(self)->channel_error, status);
    return false;
  }
  return true;
}

// Queues one frame; writes the queue once it is large. GIL held.
bool Queue(PyObject* self, const ipc::Frame& frame) {
  ChannelState& st = Channel(self);
  absl::Status status;
  try {
    status = ipc::AppendFrame(frame, st.out);
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
    return false;
  }
  if (!status.ok()) {
    SetError(StateOfChannel(self)->channel_error, status);
    return false;
  }
  return st.out.size() < kFlushThreshold || Flush(self);
}

// Entry points catch every C++ exception (std::bad_alloc from a string, in
// practice), so that none unwinds through CPython frames.
template <PyObject* (*Fn)(PyObject*, PyObject*)>
PyObject* Guarded(PyObject* self, PyObject* arg) {
  try {
    return Fn(self, arg);
  } catch (const std::bad_alloc&) {
    return PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

template <PyObject* (*Fn)(PyObject*, PyObject* const*, Py_ssize_t)>
PyObject* GuardedFast(PyObject* self, PyObject* const* args,
                      Py_ssize_t nargs) {
  try {
    return Fn(self, args, nargs);
  } catch (const std::bad_alloc&) {
    return PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

// PyMethodDef stores every function as a PyCFunction; METH_FASTCALL ones are
// cast back by CPython according to the flags.
template <PyObject* (*Fn)(PyObject*, PyObject* const*, Py_ssize_t)>
PyCFunction Fast() {
  return reinterpret_cast<PyCFunction>(
      reinterpret_cast<void (*)()>(&GuardedFast<Fn>));
}

// ---- Channel ----------------------------------------------------------------

PyObject* ChannelNew(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static const char* kKeywords[] = {"fd", nullptr};
  int fd = -1;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "i:Channel",
                                   const_cast<char**>(kKeywords), &fd)) {
    return nullptr;
  }
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return PyErr_SetFromErrno(PyExc_OSError);
  }
  PyObject* self = type->tp_alloc(type, 0);
  if (self == nullptr) return nullptr;
  auto* state = new (std::nothrow) ChannelState;
  char* buffer = new (std::nothrow) char[kReadBufferBytes];
  if (state == nullptr || buffer == nullptr) {
    delete state;
    delete[] buffer;
    Py_DECREF(self);
    return PyErr_NoMemory();
  }
  state->fd = fd;
  state->read_buffer.reset(buffer);
  reinterpret_cast<ChannelObject*>(self)->state = state;
  return self;
}

void ChannelDealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  delete reinterpret_cast<ChannelObject*>(self)->state;
  type->tp_free(self);
  Py_DECREF(type);  // heap types are owned by their instances
}

PyObject* FrameToTuple(PyObject* self, const ipc::Frame& f) {
  switch (f.type) {
    case ipc::FrameType::kCall:
      return Tuple({PyLong_FromLong(kCall), Str(f.call_id), Str(f.callable),
                    PyLong_FromLong(f.encoding), Bytes(f.data),
                    PyLong_FromUnsignedLongLong(f.total_size), Bytes(f.context),
                    PyLong_FromUnsignedLong(f.stream_window)});
    case ipc::FrameType::kArgChunk:
      return Tuple({PyLong_FromLong(kArgChunk), Str(f.call_id), Bytes(f.data)});
    case ipc::FrameType::kCancel:
      return Tuple({PyLong_FromLong(kCancel), Str(f.call_id)});
    case ipc::FrameType::kStreamAck:
      return Tuple({PyLong_FromLong(kStreamAck), Str(f.call_id),
                    PyLong_FromUnsignedLongLong(f.index)});
    case ipc::FrameType::kShutdown:
      return Tuple({PyLong_FromLong(kShutdown)});
    default:
      break;
  }
  ChannelState& st = Channel(self);
  st.dead = true;
  st.dead_reason = "unexpected '" + std::string(ipc::FrameTypeName(f.type)) +
                   "' frame from the daemon";
  PyErr_SetString(StateOfChannel(self)->protocol_error, st.dead_reason.c_str());
  return nullptr;
}

// Reads what the socket has now (bounded by kMaxReadPerCall). GIL held: the
// fd is non-blocking, so no call blocks.
bool ReadAvailable(ChannelState& st) {
  size_t total = 0;
  while (!st.eof && total < kMaxReadPerCall) {
    const ssize_t n = ::read(st.fd, st.read_buffer.get(), kReadBufferBytes);
    if (n > 0) {
      st.reader.Append(st.read_buffer.get(), static_cast<size_t>(n));
      total += static_cast<size_t>(n);
      // A short read means the socket is drained; skip the EAGAIN round trip.
      if (static_cast<size_t>(n) < kReadBufferBytes) break;
    } else if (n == 0) {
      st.eof = true;
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      break;
    } else {
      PyErr_SetFromErrno(PyExc_OSError);
      return false;
    }
  }
  return true;
}

PyObject* ChannelReadFrames(PyObject* self, PyObject* /*unused*/) {
  if (!Enter(self)) return nullptr;
  ChannelState& st = Channel(self);
  ModuleState* ms = StateOfChannel(self);
  if (st.dead) {
    PyErr_SetString(ms->protocol_error, st.dead_reason.c_str());
    return nullptr;
  }
  try {
    if (!ReadAvailable(st)) return nullptr;
    PyObject* list = PyList_New(0);
    if (list == nullptr) return nullptr;
    while (true) {
      absl::StatusOr<std::optional<ipc::Frame>> next = st.reader.Next();
      if (!next.ok()) {
        st.dead = true;
        st.dead_reason = std::string(next.status().message());
        PyErr_SetString(ms->protocol_error, st.dead_reason.c_str());
        Py_DECREF(list);
        return nullptr;
      }
      if (!next->has_value()) break;
      PyObject* tuple = FrameToTuple(self, **next);
      if (tuple == nullptr || PyList_Append(list, tuple) != 0) {
        Py_XDECREF(tuple);
        Py_DECREF(list);
        return nullptr;
      }
      Py_DECREF(tuple);
    }
    if (PyList_GET_SIZE(list) == 0 && st.eof) {
      // A partial frame left at EOF is dropped with the stream.
      Py_DECREF(list);
      Py_RETURN_NONE;
    }
    return list;
  } catch (const std::bad_alloc&) {
    return PyErr_NoMemory();
  }
}

PyObject* ChannelSendReady(PyObject* self, PyObject* const* args,
                           Py_ssize_t nargs) {
  if (!Enter(self) || !CheckArgs("send_ready", nargs, 2)) return nullptr;
  ipc::Frame frame;
  frame.type = ipc::FrameType::kReady;
  long long pid = 0;
  if (!ToInt(args[0], "pid", pid) ||
      !ToUtf8(args[1], "detail", "backslashreplace", frame.detail)) {
    return nullptr;
  }
  frame.pid = pid;
  if (!Queue(self, frame)) return nullptr;
  Py_RETURN_NONE;
}

// Encodes a result (chunked when large) into st.out, writing whenever the
// queue passes kFlushThreshold. Runs without the GIL.
absl::Status EncodeResult(ChannelState& st, const std::string& call_id,
                          int encoding, const char* data, size_t size) {
  constexpr size_t kChunk = ipc::kChunkBytes;
  // The final `result` frame carries the last (1..kChunk) bytes; everything
  // before it goes out in kChunk-sized `result_chunk` frames.
  size_t last = size;
  if (size > kChunk) last = size % kChunk == 0 ? kChunk : size % kChunk;
  ipc::Frame frame;
  frame.call_id = call_id;
  frame.type = ipc::FrameType::kResultChunk;
  size_t offset = 0;
  while (size - offset > last) {
    frame.data.assign(data + offset, kChunk);
    absl::Status status = ipc::AppendFrame(frame, st.out);
    if (!status.ok()) return status;
    offset += kChunk;
    if (st.out.size() >= kFlushThreshold) {
      status = ipc::WriteAll(st.fd, st.out);
      st.out.clear();
      if (!status.ok()) return status;
    }
  }
  frame.type = ipc::FrameType::kResult;
  frame.encoding = encoding;
  frame.total_size = size;
  frame.data.assign(data + offset, size - offset);
  return ipc::AppendFrame(frame, st.out);
}

PyObject* ChannelSendResult(PyObject* self, PyObject* const* args,
                            Py_ssize_t nargs) {
  if (!Enter(self) || !CheckArgs("send_result", nargs, 3)) return nullptr;
  std::string call_id;
  long long encoding = 0;
  if (!ToUtf8(args[0], "call_id", "surrogateescape", call_id) ||
      !ToInt(args[1], "encoding", encoding)) {
    return nullptr;
  }
  Py_buffer view;
  if (PyObject_GetBuffer(args[2], &view, PyBUF_CONTIG_RO) != 0) return nullptr;
  ChannelState& st = Channel(self);
  const char* data = static_cast<const char*>(view.buf);
  const size_t size = static_cast<size_t>(view.len);
  absl::Status status;
  if (size < kFlushThreshold) {
    // Small: a memcpy into the queue; no reason to drop the GIL.
    try {
      status = EncodeResult(st, call_id, static_cast<int>(encoding), data,
                            size);
    } catch (const std::bad_alloc&) {
      status = absl::ResourceExhaustedError("out of memory");
    }
  } else {
    // Large: encode and write without the GIL. `view` keeps the buffer alive.
    st.busy = true;
    status = WithoutGil([&] {
      return EncodeResult(st, call_id, static_cast<int>(encoding), data, size);
    });
    Leave(st);
  }
  PyBuffer_Release(&view);
  if (!status.ok()) {
    SetError(StateOfChannel(self)->channel_error, status);
    return nullptr;
  }
  if (st.out.size() >= kFlushThreshold && !Flush(self)) return nullptr;
  Py_RETURN_NONE;
}

PyObject* ChannelSendItem(PyObject* self, PyObject* const* args,
                          Py_ssize_t nargs) {
  if (!Enter(self) || !CheckArgs("send_item", nargs, 4)) return nullptr;
  ipc::Frame frame;
  frame.type = ipc::FrameType::kStreamItem;
  long long index = 0;
  long long encoding = 0;
  if (!ToUtf8(args[0], "call_id", "surrogateescape", frame.call_id) ||
      !ToInt(args[1], "index", index) ||
      !ToInt(args[2], "encoding", encoding)) {
    return nullptr;
  }
  if (index < 0) {
    PyErr_SetString(PyExc_ValueError, "index must not be negative");
    return nullptr;
  }
  frame.index = static_cast<uint64_t>(index);
  frame.encoding = static_cast<int>(encoding);
  Py_buffer view;
  if (PyObject_GetBuffer(args[3], &view, PyBUF_CONTIG_RO) != 0) return nullptr;
  const char* data = static_cast<const char*>(view.buf);
  const size_t size = static_cast<size_t>(view.len);
  if (size > ipc::kMaxFrameBytes) {
    // Refused before copying; AppendFrame catches the last few bytes of
    // frame overhead below.
    PyBuffer_Release(&view);
    PyErr_Format(PyExc_ValueError,
                 "stream item of %zu bytes exceeds the %u-byte frame limit",
                 size, ipc::kMaxFrameBytes);
    return nullptr;
  }
  ChannelState& st = Channel(self);
  auto encode = [&] {
    frame.data.assign(data, size);
    return ipc::AppendFrame(frame, st.out);
  };
  absl::Status status;
  if (size < kFlushThreshold) {
    try {
      status = encode();
    } catch (const std::bad_alloc&) {
      status = absl::ResourceExhaustedError("out of memory");
    }
  } else {
    // Large: copy without the GIL, as send_result does. `view` keeps the
    // buffer alive.
    st.busy = true;
    status = WithoutGil(encode);
    Leave(st);
  }
  PyBuffer_Release(&view);
  if (!status.ok()) {
    // Nothing was queued. Only the frame limit (or memory) fails here, so
    // the driver can fail the call without declaring the channel dead.
    SetError(PyExc_ValueError, status);
    return nullptr;
  }
  if (st.out.size() >= kFlushThreshold && !Flush(self)) return nullptr;
  Py_RETURN_NONE;
}

PyObject* ChannelSendError(PyObject* self, PyObject* const* args,
                           Py_ssize_t nargs) {
  if (!Enter(self) || !CheckArgs("send_error", nargs, 6)) return nullptr;
  ipc::Frame frame;
  frame.type = ipc::FrameType::kError;
  long long code = 0;
  if (!ToUtf8(args[0], "call_id", "surrogateescape", frame.call_id) ||
      !ToInt(args[1], "code", code) ||
      !ToUtf8(args[2], "type", "backslashreplace", frame.error.type) ||
      !ToUtf8(args[3], "message", "backslashreplace", frame.error.message) ||
      !ToUtf8(args[4], "traceback", "backslashreplace",
              frame.error.traceback)) {
    return nullptr;
  }
  const int cancelled = PyObject_IsTrue(args[5]);
  if (cancelled < 0) return nullptr;
  frame.error.code = static_cast<int>(code);
  frame.error.cancelled = cancelled != 0;
  if (!Queue(self, frame)) return nullptr;
  Py_RETURN_NONE;
}

PyObject* ChannelFlush(PyObject* self, PyObject* /*unused*/) {
  if (!Enter(self) || !Flush(self)) return nullptr;
  Py_RETURN_NONE;
}

PyObject* ChannelPendingBytes(PyObject* self, PyObject* /*unused*/) {
  return PyLong_FromSize_t(Channel(self).out.size());
}

PyObject* ChannelFileno(PyObject* self, PyObject* /*unused*/) {
  return PyLong_FromLong(Channel(self).fd);
}

PyMethodDef kChannelMethods[] = {
    {"read_frames", Guarded<ChannelReadFrames>, METH_NOARGS,
     "Decoded frames available now; None at end of stream."},
    {"send_ready", Fast<ChannelSendReady>(), METH_FASTCALL,
     "send_ready(pid, detail)"},
    {"send_result", Fast<ChannelSendResult>(), METH_FASTCALL,
     "send_result(call_id, encoding, data)"},
    {"send_item", Fast<ChannelSendItem>(), METH_FASTCALL,
     "send_item(call_id, index, encoding, data)"},
    {"send_error", Fast<ChannelSendError>(), METH_FASTCALL,
     "send_error(call_id, code, type, message, traceback, cancelled)"},
    {"flush", Guarded<ChannelFlush>, METH_NOARGS, "Write all queued frames."},
    {"pending_bytes", ChannelPendingBytes, METH_NOARGS,
     "Bytes queued but not yet written."},
    {"fileno", ChannelFileno, METH_NOARGS, "The channel fd."},
    {nullptr, nullptr, 0, nullptr},
};

PyType_Slot kChannelSlots[] = {
    {Py_tp_new, reinterpret_cast<void*>(ChannelNew)},
    {Py_tp_dealloc, reinterpret_cast<void*>(ChannelDealloc)},
    {Py_tp_methods, kChannelMethods},
    {Py_tp_doc, const_cast<char*>("The worker's end of the frame channel.")},
    {0, nullptr},
};

PyType_Spec kChannelSpec = {
    "_agentix_worker.Channel",
    sizeof(ChannelObject),
    0,
    Py_TPFLAGS_DEFAULT,
    kChannelSlots,
};

// ---- module functions -------------------------------------------------------

PyObject* MsgpackLoads(PyObject* /*module*/, PyObject* arg) {
  Py_buffer view;
  if (PyObject_GetBuffer(arg, &view, PyBUF_CONTIG_RO) != 0) return nullptr;
  PyObject* value = MsgpackToPython(static_cast<const char*>(view.buf),
                                    static_cast<size_t>(view.len));
  PyBuffer_Release(&view);
  return value;
}

PyObject* MsgpackDumps(PyObject* /*module*/, PyObject* arg) {
  std::string out;
  if (!PythonToMsgpack(arg, out)) return nullptr;
  return Bytes(out);
}

PyObject* Log(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (!CheckArgs("log", nargs, 2)) return nullptr;
  long long level = 0;
  std::string message;
  if (!ToInt(args[0], "severity", level) ||
      !ToUtf8(args[1], "message", "backslashreplace", message)) {
    return nullptr;
  }
  if (level < 0) level = 0;
  if (level > 3) level = 3;
  const auto severity = static_cast<base::LogSeverity>(level);
  if (severity >= base::MinLogSeverity()) {
    try {
      base::LogLine(severity, message);
    } catch (const std::exception&) {
      // Logging must never fail a call.
    }
  }
  Py_RETURN_NONE;
}

PyObject* SetThreadName(PyObject* /*module*/, PyObject* arg) {
  std::string name;
  if (!ToUtf8(arg, "name", "backslashreplace", name)) return nullptr;
  // The kernel keeps 15 bytes; longer names are cut, not refused.
  if (name.size() > 15) name.resize(15);
  pthread_setname_np(pthread_self(), name.c_str());
  Py_RETURN_NONE;
}

PyMethodDef kModuleMethods[] = {
    {"msgpack_loads", Guarded<MsgpackLoads>, METH_O,
     "Decode one msgpack value."},
    {"msgpack_dumps", Guarded<MsgpackDumps>, METH_O,
     "Encode a value as msgpack."},
    {"log", Fast<Log>(), METH_FASTCALL,
     "log(severity, message): 0 debug, 1 info, 2 warning, 3 error."},
    {"set_thread_name", Guarded<SetThreadName>, METH_O,
     "Sets the calling OS thread's name (as shown by ps/top)."},
    {nullptr, nullptr, 0, nullptr},
};

int AddInt(PyObject* module, const char* name, long value) {
  return PyModule_AddIntConstant(module, name, value);
}

int ExecModule(PyObject* module) {
  ModuleState* ms = StateOfModule(module);
  ms->protocol_error = PyErr_NewExceptionWithDoc(
      "_agentix_worker.ProtocolError",
      "The frame channel is desynchronised (bad or unexpected frame).",
      nullptr, nullptr);
  if (ms->protocol_error == nullptr) return -1;
  ms->channel_error = PyErr_NewExceptionWithDoc(
      "_agentix_worker.ChannelError",
      "Writing to the frame channel failed (the daemon is gone).", nullptr,
      nullptr);
  if (ms->channel_error == nullptr) return -1;
  ms->channel_type = PyType_FromModuleAndSpec(module, &kChannelSpec, nullptr);
  if (ms->channel_type == nullptr) return -1;
  if (PyModule_AddObjectRef(module, "ProtocolError", ms->protocol_error) < 0 ||
      PyModule_AddObjectRef(module, "ChannelError", ms->channel_error) < 0 ||
      PyModule_AddObjectRef(module, "Channel", ms->channel_type) < 0 ||
      AddInt(module, "CALL", kCall) < 0 ||
      AddInt(module, "ARG_CHUNK", kArgChunk) < 0 ||
      AddInt(module, "CANCEL", kCancel) < 0 ||
      AddInt(module, "SHUTDOWN", kShutdown) < 0 ||
      AddInt(module, "STREAM_ACK", kStreamAck) < 0 ||
      AddInt(module, "CHUNK_BYTES", static_cast<long>(ipc::kChunkBytes)) < 0) {
    return -1;
  }
  return 0;
}

int TraverseModule(PyObject* module, visitproc visit, void* arg) {
  ModuleState* ms = StateOfModule(module);
  if (ms == nullptr) return 0;
  Py_VISIT(ms->protocol_error);
  Py_VISIT(ms->channel_error);
  Py_VISIT(ms->channel_type);
  return 0;
}

int ClearModule(PyObject* module) {
  ModuleState* ms = StateOfModule(module);
  if (ms == nullptr) return 0;
  Py_CLEAR(ms->protocol_error);
  Py_CLEAR(ms->channel_error);
  Py_CLEAR(ms->channel_type);
  return 0;
}

void FreeModule(void* module) { ClearModule(static_cast<PyObject*>(module)); }

PyModuleDef_Slot kModuleSlots[] = {
    {Py_mod_exec, reinterpret_cast<void*>(ExecModule)},
    {0, nullptr},
};

// CPython requires the definition to outlive the interpreter; it holds no
// PyObject*, only function pointers and constants.
PyModuleDef kModuleDef = {
    PyModuleDef_HEAD_INIT,
    kChannelModuleName,
    "The agentix worker's frame channel and C++ helpers.",
    sizeof(ModuleState),
    kModuleMethods,
    kModuleSlots,
    TraverseModule,
    ClearModule,
    FreeModule,
};

PyObject* InitModule() { return PyModuleDef_Init(&kModuleDef); }

}  // namespace

absl::Status RegisterChannelModule() {
  if (PyImport_AppendInittab(kChannelModuleName, &InitModule) != 0) {
    return absl::InternalError("PyImport_AppendInittab(_agentix_worker) failed");
  }
  return absl::OkStatus();
}

}  // namespace agentix::worker
