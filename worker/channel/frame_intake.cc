#include "worker/channel/frame_intake.h"

#include <errno.h>
#include <sys/socket.h>

#include <cstring>
#include <initializer_list>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/fresh_pages.h"
#include "base/payload_copy.h"
#include "base/unique_fd.h"
#include "wire/frame_codec.h"
#include "wire/namespace_rules.h"
#include "worker/channel/channel_state.h"
#include "worker/channel/intake_baton.h"
#include "worker/channel/pickle_splitter.h"
#include "worker/channel/py_args.h"
#include "worker/ipc/descriptors.h"
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

// The frame records' fields: the first is always the kind (so the driver
// may dispatch on frame[0]), the others are named after the frame's fields.
PyStructSequence_Field kCallFields[] = {
    {"kind", "CALL"},
    {"call_id", "the call's id (str, byte-exact)"},
    {"callable", "'module::qualname' of the target"},
    {"encoding", "1 pickle, 2 msgpack"},
    {"data", "the arguments; None while arg_chunk frames follow (ARGS)"},
    {"total_size", "the arguments' size in bytes"},
    {"context", "the caller's trace context (bytes)"},
    {"stream_window", "items the worker may send ahead of acks; 0: no stream"},
    {nullptr, nullptr},
};
PyStructSequence_Field kArgsFields[] = {
    {"kind", "ARGS"},
    {"call_id", "the call's id"},
    {"data", "the assembled arguments, or None (over-long or no memory)"},
    {"received", "bytes received"},
    {nullptr, nullptr},
};
PyStructSequence_Field kCancelFields[] = {
    {"kind", "CANCEL"},
    {"call_id", "the call's id"},
    {nullptr, nullptr},
};
PyStructSequence_Field kStreamAckFields[] = {
    {"kind", "STREAM_ACK"},
    {"call_id", "the call's id"},
    {"index", "items up to this one were delivered"},
    {nullptr, nullptr},
};
PyStructSequence_Field kShutdownFields[] = {
    {"kind", "SHUTDOWN"},
    {nullptr, nullptr},
};
PyStructSequence_Field kNamespaceEventFields[] = {
    {"kind", "NS_EVENT"},
    {"namespace", "the plugin namespace, e.g. '/abridge'"},
    {"event", "the event's name"},
    {"data", "its msgpack payload (bytes)"},
    {"request_id", "informational, may be empty"},
    {"error_type", "None, or the error's type name"},
    {"error_message", "the error's message"},
    {"status_code", "the error's status code"},
    {nullptr, nullptr},
};
PyStructSequence_Field kSetEnvFields[] = {
    {"kind", "SET_ENV"},
    {"entries", "the bytes b'K=V\\0K=V\\0...'"},
    {nullptr, nullptr},
};

struct FrameTypeSpec {
  FrameKind kind;
  PyStructSequence_Desc desc;
};
FrameTypeSpec kFrameTypes[] = {
    {kCall, {"_agentix_worker.CallFrame", "A call frame.", kCallFields, 8}},
    {kArgs,
     {"_agentix_worker.ArgsFrame", "A chunked call's complete arguments.",
      kArgsFields, 4}},
    {kCancel,
     {"_agentix_worker.CancelFrame", "A cancel frame.", kCancelFields, 2}},
    {kStreamAck,
     {"_agentix_worker.StreamAckFrame", "A stream_ack frame.",
      kStreamAckFields, 3}},
    {kShutdown,
     {"_agentix_worker.ShutdownFrame", "A shutdown frame.", kShutdownFields,
      1}},
    {kNamespaceEvent,
     {"_agentix_worker.NamespaceEventFrame",
      "A plugin-namespace event from a host.", kNamespaceEventFields, 8}},
    {kSetEnv,
     {"_agentix_worker.SetEnvFrame", "A set_env frame.", kSetEnvFields, 2}},
};

// A frame record of `kind` from new references.
PyObject* FrameRecord(PyObject* self, FrameKind kind,
                      std::initializer_list<PyObject*> items) {
  return Record(StateOfChannel(self)->frame_types[kind], items);
}

// Pickled argument values from this size on are taken out of the stream
// (pickle_splitter.h); CPython's pickler writes them outside its frames.
constexpr uint64_t kSplitValueBytes = 64 * 1024;

// Fills the fresh pages of a large buffer about to be written in full (an
// argument value, an unsplit upload) in one go, in huge pages where those
// are cheaper here: a 64 MiB value that lands in memory the worker never
// touched otherwise faults in 16,384 pages as its chunks are copied in
// (~0.3 s of the first 64 MiB echo on these VMs; docs/PERFORMANCE.md
// "stop-59"). Reused pages (the large-buffer pool's kept slot, every echo
// after the first) are skipped by the prefault's residency look, and a
// value below base::kPrefaultMinBytes by the prefault itself.
void PrefaultFresh(char* data, uint64_t size) {
  (void)base::PrefaultForWrite(data, size);
}

// The sink of an Upload's splitter: stream bytes go into `buffer`, values
// into objects of their own. An allocation that fails makes the upload's
// data None (reported as out of memory once it is complete).
class UploadSink final : public PickleSplitter::Sink {
 public:
  explicit UploadSink(Upload& upload) : upload_(upload) {}

  void Stream(std::string_view bytes) override {
    if (upload_.buffer == nullptr) return;
    if (bytes.size() >
        static_cast<uint64_t>(PyBytes_GET_SIZE(upload_.buffer)) -
            upload_.written) {
      Py_CLEAR(upload_.buffer);  // cannot happen: sized by the splitter's walk
      return;
    }
    std::memcpy(PyBytes_AS_STRING(upload_.buffer) + upload_.written,
                bytes.data(), bytes.size());
    upload_.written += bytes.size();
  }

  bool BeginValue(PickleSplitter::ValueKind kind, uint64_t size,
                  std::string_view header) override {
    if (upload_.buffer == nullptr) return false;
    // The stream shrinks by the value and its header (NEXT_BUFFER stays in
    // their place), first: its tail may then hold the value (malloc reuses
    // it; an mmap'd buffer is shrunk in place).
    const uint64_t keep =
        static_cast<uint64_t>(PyBytes_GET_SIZE(upload_.buffer)) -
        (header.size() + size - 1);
    if (_PyBytes_Resize(&upload_.buffer, static_cast<Py_ssize_t>(keep)) != 0) {
      PyErr_Clear();  // upload_.buffer is null now: out of memory
      return false;
    }
    const auto n = static_cast<Py_ssize_t>(size);
    PyObject* value = kind == PickleSplitter::ValueKind::kBytes
                          ? PyBytes_FromStringAndSize(nullptr, n)
                          : PyByteArray_FromStringAndSize(nullptr, n);
    if (value == nullptr ||
        (upload_.values == nullptr &&
         (upload_.values = PyList_New(0)) == nullptr) ||
        PyList_Append(upload_.values, value) != 0) {
      PyErr_Clear();
      Py_XDECREF(value);
      Py_CLEAR(upload_.buffer);  // the stream has no room for it any more
      return false;
    }
    Py_DECREF(value);  // the list holds it
    upload_.value_filled = 0;
    PrefaultFresh(kind == PickleSplitter::ValueKind::kBytes
                      ? PyBytes_AS_STRING(value)
                      : PyByteArray_AS_STRING(value),
                  size);
    return true;
  }

  void Value(std::string_view bytes) override {
    if (upload_.buffer == nullptr) return;
    PyObject* value = PyList_GET_ITEM(
        upload_.values, PyList_GET_SIZE(upload_.values) - 1);
    const bool is_bytes = PyBytes_Check(value);
    char* data = is_bytes ? PyBytes_AS_STRING(value) : PyByteArray_AS_STRING(value);
    const Py_ssize_t size =
        is_bytes ? PyBytes_GET_SIZE(value) : PyByteArray_GET_SIZE(value);
    base::CopyPayloadToHeap(data + upload_.value_filled, bytes.data(),
                            bytes.size(), static_cast<size_t>(size));
    upload_.value_filled += bytes.size();
  }

 private:
  Upload& upload_;
};

// Copies `data`, the next bytes of the call's arguments, into its Upload.
void Receive(Upload& upload, std::string_view data) {
  if (upload.buffer == nullptr) return;
  if (upload.splitter != nullptr) {
    UploadSink sink(upload);
    upload.splitter->Feed(data, sink);
    return;
  }
  std::memcpy(PyBytes_AS_STRING(upload.buffer) + upload.written, data.data(),
              data.size());
  upload.written += data.size();
}

// A call frame whose first piece is short of total_size starts an Upload
// (unless one runs for that id: the driver ignores the duplicate call, and
// the chunks keep going to the first). Its record then carries None for the
// data and the arguments follow in one ARGS record. An Upload whose buffer
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
    return true;
  }
  if (f.encoding != 2) {  // pickle (1, or 0 for the default); 2 is msgpack
    upload.splitter =
        std::make_unique<PickleSplitter>(f.total_size, kSplitValueBytes);
  } else {  // written in full; a pickle's buffer shrinks as values leave it
    PrefaultFresh(PyBytes_AS_STRING(upload.buffer), f.total_size);
  }
  Receive(upload, data);
  return true;
}

}  // namespace

bool LandDirectArgument(ChannelState& st, ipc::Frame& frame,
                        std::string_view bytes) {
  if (frame.type == ipc::FrameType::kCall) {
    if (bytes.size() >= frame.total_size) return false;  // no upload
    if (!StartUpload(st, frame, bytes)) return false;  // a relayed upload
    Upload& upload = st.uploads[frame.call_id];
    upload.direct = true;
    upload.received = 0;  // counted when the call frame comes
    upload.landed = bytes.size();
    frame.landed = bytes.size();
    return true;
  }
  if (frame.type != ipc::FrameType::kArgChunk || bytes.empty()) return false;
  auto it = st.uploads.find(frame.call_id);
  if (it == st.uploads.end() || !it->second.direct) return false;
  Upload& upload = it->second;
  if (bytes.size() <= upload.total - upload.landed) {
    Receive(upload, bytes);
  } else {
    Py_CLEAR(upload.buffer);  // over-long: its data will be None
  }
  upload.landed += bytes.size();
  frame.landed = bytes.size();
  return true;
}

namespace {

// Copies an arg_chunk into its Upload. Returns the ARGS record once the last
// byte arrived, Py_None while more are due (or the chunk belongs to no
// upload: cancelled, complete or never announced, dropped as before), NULL
// on error. ARGS is (ARGS, call_id, data, received): data is the complete
// bytes, or None when received != total_size (an over-long upload; the
// driver reports the count) or the buffer could not be allocated. When
// values were taken out of pickled arguments, data is the list [stream,
// value, ...] for pickle.loads(stream, buffers=values).
PyObject* AddChunk(PyObject* self, ChannelState& st, const ipc::Frame& f,
                   std::string_view data) {
  auto it = st.uploads.find(f.call_id);
  if (it == st.uploads.end()) Py_RETURN_NONE;
  Upload& upload = it->second;
  // A landed piece is in the upload already (LandDirectArgument checked
  // that it fits).
  const uint64_t size = f.landed != 0 ? f.landed : data.size();
  const bool fits = f.landed != 0 || size <= upload.total - upload.received;
  if (fits && f.landed == 0) Receive(upload, data);
  upload.received += size;
  if (upload.received < upload.total) Py_RETURN_NONE;
  PyObject* buffer = std::exchange(upload.buffer, nullptr);
  if (!fits) Py_CLEAR(buffer);
  if (buffer != nullptr && upload.values != nullptr) {
    // The stream as written (the walk sized it exactly; a shorter one only
    // if the sender's total was wrong, which the loader then reports).
    if ((upload.written != static_cast<uint64_t>(PyBytes_GET_SIZE(buffer)) &&
         _PyBytes_Resize(&buffer, static_cast<Py_ssize_t>(upload.written)) !=
             0) ||
        PyList_Insert(upload.values, 0, buffer) != 0) {
      PyErr_Clear();
      Py_CLEAR(buffer);
    } else {
      Py_SETREF(buffer, Py_NewRef(upload.values));
    }
  }
  const uint64_t received = upload.received;
  st.uploads.erase(it);
  return FrameRecord(self, kArgs,
                     {PyLong_FromLong(kArgs), Str(f.call_id),
                      buffer != nullptr ? buffer : Py_NewRef(Py_None),
                      PyLong_FromUnsignedLongLong(received)});
}

// A relayed call whose id a direct session runs: CallIdInUse, as the
// daemon answers a start of another client's running id. Py_None (no
// record), or NULL with an exception set.
PyObject* RefuseRelayedCall(PyObject* self, const ipc::Frame& f) {
  ipc::Frame error;
  error.type = ipc::FrameType::kError;
  error.call_id = f.call_id;
  error.error.code = static_cast<int>(absl::StatusCode::kAlreadyExists);
  error.error.type = "CallIdInUse";
  error.error.message =
      "a direct connection of another client runs a call with this call_id; "
      "call ids are daemon-wide: use unique ones (e.g. a UUID)";
  if (!Queue(self, error)) return nullptr;
  Py_RETURN_NONE;
}

// The record for one frame from the daemon (see channel_module.h); Py_None
// for a frame Python does not see; NULL with an exception set on error.
// `data` is the frame's payload (a view into the read buffer).
PyObject* FrameToRecord(PyObject* self, const ipc::Frame& f,
                       std::string_view data, bool relayed = true) {
  ChannelState& st = Channel(self);
  switch (f.type) {
    case ipc::FrameType::kCall: {
      if (relayed && st.direct != nullptr && st.direct->Owns(f.call_id)) {
        // One owner per call id (docs/DIRECT-CALLS.md): a direct session
        // runs this id, so the relayed call is refused, not run twice.
        return RefuseRelayedCall(self, f);
      }
      PyObject* first;
      if (f.landed != 0) {
        // Its upload was made when the first piece landed (and is gone
        // only if a later cancel came first: then no ARGS follows, as for
        // any cancelled upload).
        if (auto it = st.uploads.find(f.call_id); it != st.uploads.end()) {
          it->second.received += f.landed;
        }
        first = Py_NewRef(Py_None);
      } else {
        first = StartUpload(st, f, data) ? Py_NewRef(Py_None) : BytesOf(data);
      }
      return FrameRecord(
          self, kCall,
          {PyLong_FromLong(kCall), Str(f.call_id), Str(f.callable),
           PyLong_FromLong(f.encoding), first,
           PyLong_FromUnsignedLongLong(f.total_size), Bytes(f.context),
           PyLong_FromUnsignedLong(f.stream_window)});
    }
    case ipc::FrameType::kArgChunk:
      return AddChunk(self, st, f, data);
    case ipc::FrameType::kCancel: {
      // Releases what it received; a relayed cancel leaves the upload of a
      // call a direct session runs alone (ids have one owner; its own
      // cancel comes unrelayed). After a collapse the daemon owns the call:
      // its cancel releases the upload.
      auto it = st.uploads.find(f.call_id);
      if (it != st.uploads.end() &&
          !(relayed && it->second.direct && st.direct != nullptr &&
            st.direct->Owns(f.call_id))) {
        st.uploads.erase(it);
      }
      return FrameRecord(self, kCancel,
                         {PyLong_FromLong(kCancel), Str(f.call_id)});
    }
    case ipc::FrameType::kStreamAck:
      return FrameRecord(self, kStreamAck,
                         {PyLong_FromLong(kStreamAck), Str(f.call_id),
                          PyLong_FromUnsignedLongLong(f.index)});
    case ipc::FrameType::kShutdown:
      return FrameRecord(self, kShutdown, {PyLong_FromLong(kShutdown)});
    case ipc::FrameType::kSetEnv:
      return FrameRecord(self, kSetEnv,
                         {PyLong_FromLong(kSetEnv), BytesOf(data)});
    case ipc::FrameType::kNamespaceEvent: {
      // A direct Namespace stream's `opened` waits for this record
      // (docs/DIRECT-CALLS.md stage 8): written once it is made, the host
      // starts behind it.
      if (st.direct != nullptr && f.ns.event == sandbox::kHostConnectedEvent) {
        st.direct->OnHostConnected(f.ns.name);
      }
      PyObject* error_type = f.ns.has_error ? Str(f.ns.error_type)
                                            : Py_NewRef(Py_None);
      return FrameRecord(
          self, kNamespaceEvent,
          {PyLong_FromLong(kNamespaceEvent), Str(f.ns.name), Str(f.ns.event),
           BytesOf(data), Str(f.ns.request_id), error_type,
           Str(f.ns.error_message), PyLong_FromLong(f.ns.status_code)});
    }
    case ipc::FrameType::kBarrier: {
      if (st.direct == nullptr) break;  // never sent to such a worker
      const size_t queued = st.out.size();
      st.direct->OnBarrier(
          f, st.writer->untagged_records.load(std::memory_order_acquire), st.out);
      // Asked again (records came since): after the records, now.
      if (st.out.size() != queued) {
        st.uncaught = true;
        if (!Flush(self)) return nullptr;
      }
      return Py_NewRef(Py_None);
    }
    case ipc::FrameType::kCallsCpuAnswer:
      if (st.direct == nullptr) break;  // never sent to such a worker
      st.direct->TellCallsCpu(f.detail);
      return Py_NewRef(Py_None);
    case ipc::FrameType::kNsRelayed:
      if (st.direct == nullptr) break;  // never sent to such a worker
      st.direct->OnNamespaceRelayed(f.ns.name);
      return Py_NewRef(Py_None);
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
    const ssize_t n = st.descriptors.ReadFrom(st.fd, st.reader, kReadBufferBytes);
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

// A direct_conn this worker did not advertise (it serves no direct
// connections yet: the daemon never hands one over; defensive): STATUS 14
// to the host, which reconnects, the descriptors closed, and direct_closed
// so the daemon stops counting the connection. False with an exception set
// when the frame to the daemon cannot be written.
bool RefuseDirect(PyObject* self, const ipc::Frame& frame,
                  std::vector<base::UniqueFd>& fds) {
  const std::string status = sandbox::EncodeFrame(
      sandbox::FrameKind::kStatus,
      sandbox::EncodeStatus(absl::StatusCode::kUnavailable,
                            "this worker does not serve direct connections"));
  // Best effort and never blocking: a fresh connection has room for it.
  (void)::send(fds[0].get(), status.data(), status.size(),
               MSG_DONTWAIT | MSG_NOSIGNAL);
  fds.clear();  // closes the socket and the ring's memfd
  ipc::Frame closed;
  closed.type = ipc::FrameType::kDirectClosed;
  closed.direct_conn.conn = frame.direct_conn.conn;
  closed.detail = "refused: this worker did not advertise direct calls";
  return Queue(self, closed) && Flush(self);
}

// The daemon's `collapse{client}` (docs/DIRECT-CALLS.md, stage 4): the
// client's session goes back as session_state frames, before any later
// output of its running calls (which now goes to the link: the session no
// longer Owns them). A worker without direct calls holds no session: one
// empty piece. False with an exception set.
bool AnswerCollapse(PyObject* self, ChannelState& st, const ipc::Frame& frame) {
  std::vector<ipc::Frame> pieces;
  if (st.direct != nullptr) {
    pieces = st.direct->Collapse(frame.direct_conn.client);
  } else {
    ipc::Frame& empty = pieces.emplace_back();
    empty.type = ipc::FrameType::kSessionState;
    empty.direct_conn.client = frame.direct_conn.client;
    empty.last = true;
  }
  for (const ipc::Frame& piece : pieces) {
    if (!Queue(self, piece)) return false;
  }
  return Flush(self);
}

// The direct connections' turn in read_frames (docs/DIRECT-CALLS.md): their
// I/O, then the records their sessions made for the driver (the same
// tuples a relayed call's frames give), appended to `list`; connections
// that ended are reported to the daemon. False with an exception set.
bool AddDirectRecords(PyObject* self, ChannelState& st, PyObject* list) {
  st.direct->Drive();
  for (ipc::Frame& f : st.direct->TakeDriverFrames(
           st.writer->untagged_records.load(std::memory_order_acquire))) {
    PyObject* record = FrameToRecord(self, f, f.data, /*relayed=*/false);
    if (f.type == ipc::FrameType::kCall ||
        f.type == ipc::FrameType::kArgChunk) {
      // Copied into the call's bytes object: the argument's buffer serves
      // the next large argument (DirectSession::PutArgBytes; empty for a
      // landed piece).
      st.direct->chunk_buffers().Give(std::move(f.data));
    }
    if (record == nullptr) return false;
    if (record != Py_None && PyList_Append(list, record) != 0) {
      Py_DECREF(record);
      return false;
    }
    Py_DECREF(record);
  }
  const size_t queued = st.out.size();
  if (!QueueDirectClosed(self)) return false;
  return st.out.size() == queued || Flush(self);
}

// Serves a handed-over connection (DirectConns::Accept). Its calls' chunked
// arguments land in this channel's uploads as they are read: one copy from
// the host's ring, as a relayed call's from the daemon's.
void AcceptDirect(ChannelState& st, const ipc::Frame& frame,
                  std::vector<base::UniqueFd> fds) {
  ChannelState* state = &st;  // owns st.direct, so outlives it
  st.direct->LandArgumentsIn([state](ipc::Frame& f, std::string_view bytes) {
    return LandDirectArgument(*state, f, bytes);
  });
  st.direct->Accept(frame, std::move(fds));
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

// The holder waits in the direct connections' poll set and leaves what it
// saw for read_frames' look (DirectConns::WaitReady). The channel owns both
// the connections and the baton, and a holder waits inside a method of the
// channel, which keeps it alive.
class DirectWait final : public ChannelWait {
 public:
  explicit DirectWait(DirectConns* conns) : conns_(conns) {}
  int Wait(int timeout_ms) override { return conns_->WaitReady(timeout_ms); }
  void Wake() override { conns_->WakeWaiter(); }

 private:
  DirectConns* const conns_;
};

}  // namespace

PyObject* ChannelIntakeLead(PyObject* self, PyObject* holding) {
  std::shared_ptr<IntakeBaton> baton = Channel(self).baton;
  if (baton == nullptr) return PyLong_FromLong(1);
  const bool held = PyObject_IsTrue(holding) == 1;
  IntakeBaton::Turn turn;
  Py_BEGIN_ALLOW_THREADS
  turn = baton->Lead(held);
  Py_END_ALLOW_THREADS
  return PyLong_FromLong(turn == IntakeBaton::Turn::kReadable ? 0
                         : turn == IntakeBaton::Turn::kLeave  ? 1
                                                              : 2);
}

PyObject* ChannelIntakePass(PyObject* self, PyObject* /*unused*/) {
  IntakeBaton* baton = Channel(self).baton.get();
  return PyBool_FromLong(baton != nullptr && baton->Pass());
}

PyObject* ChannelIntakeDefer(PyObject* self, PyObject* /*unused*/) {
  IntakeBaton* baton = Channel(self).baton.get();
  return PyBool_FromLong(baton != nullptr && baton->Defer());
}

PyObject* ChannelIntakeReclaim(PyObject* self, PyObject* /*unused*/) {
  IntakeBaton* baton = Channel(self).baton.get();
  return PyBool_FromLong(baton != nullptr && baton->Reclaim());
}

PyObject* ChannelIntakeToPool(PyObject* self, PyObject* /*unused*/) {
  ChannelState& st = Channel(self);
  if (st.baton == nullptr) {
    std::unique_ptr<ChannelWait> wait;
    if (st.direct != nullptr) wait = std::make_unique<DirectWait>(st.direct.get());
    absl::StatusOr<std::unique_ptr<IntakeBaton>> baton =
        IntakeBaton::Create(st.poll_fd(), st.payloads.get(), std::move(wait));
    if (!baton.ok()) {
      PyErr_SetString(PyExc_OSError,
                      std::string(baton.status().message()).c_str());
      return nullptr;
    }
    st.baton = std::move(*baton);
  }
  st.baton->ToPool();
  Py_RETURN_NONE;
}

PyObject* ChannelIntakeToLoop(PyObject* self, PyObject* /*unused*/) {
  if (IntakeBaton* baton = Channel(self).baton.get()) baton->ToLoop();
  Py_RETURN_NONE;
}

PyObject* ChannelIntakeStop(PyObject* self, PyObject* /*unused*/) {
  if (IntakeBaton* baton = Channel(self).baton.get()) baton->Stop();
  Py_RETURN_NONE;
}

int AddFrameTypes(PyObject* module, ModuleState& state) {
  for (FrameTypeSpec& spec : kFrameTypes) {
    if (AddRecordType(module, &spec.desc, &state.frame_types[spec.kind]) < 0) {
      return -1;
    }
  }
  return 0;
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
    // With direct connections the link is read only when the poll set says
    // it is readable (DirectConns::LookReady); a direct call's frames come
    // on its own socket.
    const bool link_readable = st.direct == nullptr || st.direct->LookReady();
    if (link_readable && !ReadAvailable(st)) return nullptr;
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
      absl::StatusOr<std::vector<base::UniqueFd>> fds =
          st.descriptors.TakeFor(frame, st.reader);
      if (!fds.ok()) {
        return Desynchronised(st, ms, std::string(fds.status().message()),
                              list);
      }
      if (frame.type == ipc::FrameType::kCollapse) {
        if (!AnswerCollapse(self, st, frame)) {
          Py_DECREF(list);
          return nullptr;
        }
        continue;
      }
      if (frame.type == ipc::FrameType::kDirectConn) {
        if (st.direct != nullptr) {
          AcceptDirect(st, frame, std::move(*fds));
          continue;
        }
        if (!RefuseDirect(self, frame, *fds)) {
          Py_DECREF(list);
          return nullptr;
        }
        continue;
      }
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
      PyObject* record = FrameToRecord(self, frame, data);
      // The payload has been copied out (or dropped): the daemon may reuse
      // its space.
      if (frame.in_ring) st.payloads->Release(frame.ring_pos + frame.ring_size);
      if (record == Py_None) {
        Py_DECREF(record);
        continue;
      }
      if (record == nullptr || PyList_Append(list, record) != 0) {
        Py_XDECREF(record);
        Py_DECREF(list);
        return nullptr;
      }
      Py_DECREF(record);
    }
    if (absl::Status settled = st.descriptors.Settle(st.reader); !settled.ok()) {
      return Desynchronised(st, ms, std::string(settled.message()), list);
    }
    if (st.direct != nullptr && !AddDirectRecords(self, st, list)) {
      Py_DECREF(list);
      return nullptr;
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
