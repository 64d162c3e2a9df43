#include "worker/channel/frame_intake.h"

#include <errno.h>

#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <string_view>

#include "worker/channel/channel_state.h"
#include "worker/channel/py_args.h"
#include "worker/ipc/frame.h"

namespace agentix::worker {
namespace {

// Read syscall size; reused for every read.
constexpr size_t kReadBufferBytes = 256 * 1024;
// Bytes read per read_frames() call at most, so that a long stream of
// argument chunks cannot starve the event loop; the fd stays readable and the
// loop calls again.
constexpr size_t kMaxReadPerCall = 8 * 1024 * 1024;

PyObject* Bytes(const std::string& s) { return BytesOf(s); }

// A call frame whose first piece is short of total_size starts an Upload
// (unless one runs for that id: the driver ignores the duplicate call, and
// the chunks keep going to the first). Its tuple then carries None for the
// data and the arguments follow in one ARGS tuple. An Upload whose buffer
// cannot be allocated still counts the bytes, so the driver can fail the
// call once the last one arrived.
bool StartUpload(ChannelState& st, const ipc::Frame& f, std::string_view data) {
  if (data.size() >= f.total_size || st.uploads.count(f.call_id) != 0) {
    return false;
  }
  // Inserted before allocating: a throwing emplace then leaks nothing.
  Upload& upload = st.uploads[f.call_id];
  upload.total = f.total_size;
  upload.received = data.size();
  if (f.total_size <= static_cast<uint64_t>(PY_SSIZE_T_MAX)) {
    // total_size >= 1 here, so this is a fresh object, never a shared one.
    upload.buffer = PyBytes_FromStringAndSize(
        nullptr, static_cast<Py_ssize_t>(f.total_size));
  }
  if (upload.buffer == nullptr) {
    PyErr_Clear();  // reported as the call's error when complete
  } else {
    std::memcpy(PyBytes_AS_STRING(upload.buffer), data.data(), data.size());
  }
  return true;
}

// Copies an arg_chunk into its Upload. Returns the ARGS tuple once the last
// byte arrived, Py_None while more are due (or the chunk belongs to no
// upload: cancelled, complete or never announced, dropped as before), NULL
// on error. ARGS is (ARGS, call_id, data, received): data is the complete
// bytes, or None when received != total_size (an over-long upload; the
// driver reports the count) or the buffer could not be allocated.
PyObject* AddChunk(ChannelState& st, const ipc::Frame& f,
                   std::string_view data) {
  auto it = st.uploads.find(f.call_id);
  if (it == st.uploads.end()) Py_RETURN_NONE;
  Upload& upload = it->second;
  const bool fits = data.size() <= upload.total - upload.received;
  if (fits && upload.buffer != nullptr) {
    std::memcpy(PyBytes_AS_STRING(upload.buffer) + upload.received,
                data.data(), data.size());
  }
  upload.received += data.size();
  if (upload.received < upload.total) Py_RETURN_NONE;
  PyObject* buffer = upload.buffer;
  if (!fits) Py_CLEAR(buffer);
  const uint64_t received = upload.received;
  st.uploads.erase(it);
  return Tuple({PyLong_FromLong(kArgs), Str(f.call_id),
                buffer != nullptr ? buffer : Py_NewRef(Py_None),
                PyLong_FromUnsignedLongLong(received)});
}

// The tuple for one frame from the daemon (see channel_module.h); Py_None
// for a frame Python does not see; NULL with an exception set on error.
// `data` is the frame's payload (a view into the read buffer).
PyObject* FrameToTuple(PyObject* self, const ipc::Frame& f,
                       std::string_view data) {
  ChannelState& st = Channel(self);
  switch (f.type) {
    case ipc::FrameType::kCall: {
      PyObject* first =
          StartUpload(st, f, data) ? Py_NewRef(Py_None) : BytesOf(data);
      return Tuple({PyLong_FromLong(kCall), Str(f.call_id), Str(f.callable),
                    PyLong_FromLong(f.encoding), first,
                    PyLong_FromUnsignedLongLong(f.total_size), Bytes(f.context),
                    PyLong_FromUnsignedLong(f.stream_window)});
    }
    case ipc::FrameType::kArgChunk:
      return AddChunk(st, f, data);
    case ipc::FrameType::kCancel: {
      auto it = st.uploads.find(f.call_id);
      if (it != st.uploads.end()) {
        Py_XDECREF(it->second.buffer);
        st.uploads.erase(it);
      }
      return Tuple({PyLong_FromLong(kCancel), Str(f.call_id)});
    }
    case ipc::FrameType::kStreamAck:
      return Tuple({PyLong_FromLong(kStreamAck), Str(f.call_id),
                    PyLong_FromUnsignedLongLong(f.index)});
    case ipc::FrameType::kShutdown:
      return Tuple({PyLong_FromLong(kShutdown)});
    case ipc::FrameType::kSetEnv:
      return Tuple({PyLong_FromLong(kSetEnv), BytesOf(data)});
    case ipc::FrameType::kNamespaceEvent: {
      PyObject* error_type = f.ns.has_error ? Str(f.ns.error_type)
                                            : Py_NewRef(Py_None);
      return Tuple({PyLong_FromLong(kNamespaceEvent), Str(f.ns.name),
                    Str(f.ns.event), BytesOf(data), Str(f.ns.request_id),
                    error_type, Str(f.ns.error_message),
                    PyLong_FromLong(f.ns.status_code)});
    }
    default:
      break;
  }
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
    const ssize_t n = st.reader.ReadFrom(st.fd, kReadBufferBytes);
    if (n > 0) {
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

// Marks the channel dead with `reason` and raises ProtocolError.
PyObject* Desynchronised(ChannelState& st, ModuleState* ms,
                         const std::string& reason, PyObject* list) {
  st.dead = true;
  st.dead_reason = reason;
  PyErr_SetString(ms->protocol_error, st.dead_reason.c_str());
  Py_DECREF(list);
  return nullptr;
}

}  // namespace

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
      std::string_view data;  // valid until the next ReadAvailable
      absl::StatusOr<std::optional<ipc::Frame>> next = st.reader.Next(&data);
      if (!next.ok()) {
        return Desynchronised(st, ms, std::string(next.status().message()),
                              list);
      }
      if (!next->has_value()) break;
      const ipc::Frame& frame = **next;
      if (frame.in_ring) {
        absl::StatusOr<std::string_view> piece =
            st.payloads != nullptr
                ? st.payloads->Get(frame.ring_pos, frame.ring_size)
                : absl::InvalidArgumentError(
                      "ring payload reference without a payload area");
        if (!piece.ok()) {
          return Desynchronised(st, ms, std::string(piece.status().message()),
                                list);
        }
        data = *piece;
      }
      PyObject* tuple = FrameToTuple(self, frame, data);
      // The payload has been copied out (or dropped): the daemon may reuse
      // its space.
      if (frame.in_ring) st.payloads->Release(frame.ring_pos + frame.ring_size);
      if (tuple == Py_None) {
        Py_DECREF(tuple);
        continue;
      }
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

}  // namespace agentix::worker
