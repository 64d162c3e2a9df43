#include "worker/channel/side_channels.h"

#include <string>

#include "worker/channel/channel_state.h"
#include "worker/channel/log_sender.h"
#include "worker/channel/plain_records.h"
#include "worker/channel/proto_fields.h"
#include "worker/channel/py_args.h"
#include "worker/ipc/frame.h"
#include "worker/ipc/io.h"

namespace agentix::worker {
namespace {

// Room for a frame's header and msgpack keys around its record, and for
// a common log record's bytes: reserved up front, each string is allocated
// once instead of growing through several reallocations.
constexpr size_t kFrameOverhead = 64;
constexpr size_t kRecordBytes = 512;

// The call_id field of runtime.proto's LogRecord and TraceEvent.
constexpr uint32_t kLogRecordCallId = 14;
constexpr uint32_t kTraceEventCallId = 18;

bool ReadVarint(std::string_view& in, uint64_t& value) {
  value = 0;
  for (int shift = 0; shift < 64 && !in.empty(); shift += 7) {
    const auto byte = static_cast<uint8_t>(in.front());
    in.remove_prefix(1);
    value |= uint64_t{byte & 0x7fu} << shift;
    if ((byte & 0x80u) == 0) return true;
  }
  return false;
}

// The top-level string field `field` of a serialized message ("" if absent
// or the bytes are not a message): the call id a record names.
std::string_view StringField(std::string_view message, uint32_t field) {
  std::string_view found;
  while (!message.empty()) {
    uint64_t key = 0;
    uint64_t value = 0;
    if (!ReadVarint(message, key)) return {};
    switch (key & 7) {
      case 0:
        if (!ReadVarint(message, value)) return {};
        break;
      case 1:
      case 5: {
        const size_t size = (key & 7) == 1 ? 8 : 4;
        if (message.size() < size) return {};
        message.remove_prefix(size);
        break;
      }
      case 2:
        if (!ReadVarint(message, value) || value > message.size()) return {};
        if ((key >> 3) == field) found = message.substr(0, value);
        message.remove_prefix(value);
        break;
      default:
        return {};
    }
  }
  return found;
}

// Encodes `frame` into `frames` (empty) and puts it on the log queue (see
// ChannelSendTrace for why side-channel frames do not go through `out`).
// With direct calls, a record of one is tagged with its connection and one
// that names no call is counted (docs/DIRECT-CALLS.md, stage 5). GIL held.
bool QueueSideChannelFrame(PyObject* self, ipc::Frame& frame,
                           std::string& frames) {
  ChannelState& st = Channel(self);
  bool untagged = false;
  frame.direct_conn.conn = 0;
  if (st.direct != nullptr && (frame.type == ipc::FrameType::kLog ||
                               frame.type == ipc::FrameType::kTrace)) {
    const std::string_view call_id = StringField(
        frame.record, frame.type == ipc::FrameType::kLog ? kLogRecordCallId
                                                         : kTraceEventCallId);
    if (call_id.empty()) {
      untagged = true;
    } else {
      frame.direct_conn.conn = st.direct->TagRecord(call_id);
    }
  }
  frames.reserve(frame.record.size() + kFrameOverhead);
  absl::Status status = ipc::AppendFrame(frame, frames);
  if (!status.ok()) {
    SetError(PyExc_ValueError, status);
    return false;
  }
  QueueLogsFromPython(st.writer, frames);
  if (untagged) {
    st.writer->untagged_records.fetch_add(1, std::memory_order_release);
  }
  return true;
}

bool QueueSideChannelFrame(PyObject* self, ipc::Frame& frame) {
  std::string frames;
  return QueueSideChannelFrame(self, frame, frames);
}

// A span event's frame and its encoding, reused by each thread: their
// buffers keep their capacity, so the two events of a span allocate no
// frame and no string here. Buffers that grew past kScratchBytes (a span
// with large attributes) are released at the thread's next span event.
struct SpanScratch {
  static constexpr size_t kScratchBytes = 16 * 1024;

  ipc::Frame frame;
  std::string frames;

  SpanScratch() {
    frame.type = ipc::FrameType::kTrace;
    frame.record.reserve(kRecordBytes);
  }

  void Reset() {
    frame.record.clear();
    frames.clear();
    if (frame.record.capacity() > kScratchBytes) {
      std::string().swap(frame.record);
    }
    if (frames.capacity() > kScratchBytes) std::string().swap(frames);
  }
};

// Like QueueSideChannelFrame, but when no write is in flight the calling
// thread writes the queued log frames and this one itself instead of waking
// the log sender thread: a namespace request's round trip waits on it (a
// thread wake-up is tens of microseconds here). Order is kept: queued
// records go first. GIL held on entry and exit.
bool SendSideChannelFrameNow(PyObject* self, ipc::Frame& frame) {
  Writer& w = *Channel(self).writer;
  bool write_now = false;
  {
    std::lock_guard<std::mutex> lock(w.mu);
    // Otherwise a writer is busy (the frame queues behind it, as before), or
    // the queue's own rules apply (dropping after a failure, forked child).
    write_now = !w.busy && !w.failed && w.sender_running &&
                !InForkedChild();
    if (write_now) w.busy = true;
  }
  if (!write_now) return QueueSideChannelFrame(self, frame);
  std::string frames;
  absl::Status status = ipc::AppendFrame(frame, frames);
  if (!status.ok()) {
    Leave(w);
    SetError(PyExc_ValueError, status);
    return false;
  }
  status = WithoutGil([&w, &frames] {
    std::string out = TakeLogs(w);
    out.append(frames);
    return ipc::WriteAll(w.fd, out);
  });
  if (!status.ok()) {
    std::lock_guard<std::mutex> lock(w.mu);
    w.failed = true;  // as the sender thread does: the daemon is gone
  }
  Leave(w);
  return true;
}

// One record frame of `type` carrying the message `fields` describes, from
// a send_* call's keyword arguments. Record frames ride the log queue, not
// `out`: they come from any thread, must stay ordered with the records
// around them and go out promptly, without the caller taking the channel.
PyObject* SendRecord(PyObject* self, ipc::FrameType type,
                     MessageFields& fields, const char* function,
                     PyObject* const* args, Py_ssize_t nargs,
                     PyObject* kwnames) {
  ipc::Frame frame;
  frame.type = type;
  if (!fields.Encode(function, args, nargs, kwnames, frame.record) ||
      !QueueSideChannelFrame(self, frame)) {
    return nullptr;
  }
  Py_RETURN_NONE;
}

}  // namespace

PyObject* ChannelSendLog(PyObject* self, PyObject* const* args,
                         Py_ssize_t nargs, PyObject* kwnames) {
  return SendRecord(self, ipc::FrameType::kLog, LogRecordFields(), "send_log", args,
                    nargs, kwnames);
}

PyObject* ChannelSendLogRecord(PyObject* self, PyObject* const* args,
                               Py_ssize_t nargs) {
  if (!CheckArgs("send_log_record", nargs, 5)) return nullptr;
  ipc::Frame frame;
  frame.type = ipc::FrameType::kLog;
  frame.record.reserve(kRecordBytes);
  const int encoded = EncodePlainLogRecord(args[0], args[1], args[2], args[3],
                                           args[4], frame.record);
  if (encoded <= 0) return encoded < 0 ? nullptr : Py_NewRef(Py_False);
  if (!QueueSideChannelFrame(self, frame)) return nullptr;
  Py_RETURN_TRUE;
}

PyObject* ChannelSendTrace(PyObject* self, PyObject* const* args,
                           Py_ssize_t nargs, PyObject* kwnames) {
  return SendRecord(self, ipc::FrameType::kTrace, TraceEventFields(), "send_trace",
                    args, nargs, kwnames);
}

PyObject* ChannelSendSpan(PyObject* self, PyObject* const* args,
                          Py_ssize_t nargs) {
  if (!CheckArgs("send_span", nargs, 4)) return nullptr;
  static thread_local SpanScratch scratch;
  scratch.Reset();
  const int encoded = EncodePlainSpan(args[0], args[1], args[2], args[3],
                                      scratch.frame.record);
  if (encoded <= 0) return encoded < 0 ? nullptr : Py_NewRef(Py_False);
  if (!QueueSideChannelFrame(self, scratch.frame, scratch.frames)) {
    return nullptr;
  }
  Py_RETURN_TRUE;
}

// send_ns_event(namespace, event, data, request_id, error_type,
// error_message, status_code): one plugin-namespace event for the hosts.
// `data` is the msgpack payload; error_type None means no error. Rides the
// log queue like trace frames: emitted from any thread, kept in order with
// the records around it.
PyObject* ChannelSendNamespaceEvent(PyObject* self, PyObject* const* args,
                                    Py_ssize_t nargs) {
  if (!CheckArgs("send_ns_event", nargs, 7)) return nullptr;
  ipc::Frame frame;
  frame.type = ipc::FrameType::kNamespaceEvent;
  ipc::NamespaceEntry& ns = frame.ns;
  long long status_code = 0;
  constexpr const char* kText = "surrogateescape";
  if (!ToUtf8(args[0], "namespace", kText, ns.name) ||
      !ToUtf8(args[1], "event", kText, ns.event) ||
      !OptionalBuffer(args[2], frame.data) ||
      !ToUtf8(args[3], "request_id", kText, ns.request_id) ||
      !ToUtf8(args[5], "error_message", "backslashreplace",
              ns.error_message) ||
      !ToInt(args[6], "status_code", status_code)) {
    return nullptr;
  }
  if (args[4] != Py_None) {
    if (!ToUtf8(args[4], "error_type", "backslashreplace", ns.error_type)) {
      return nullptr;
    }
    ns.has_error = true;
  }
  ns.status_code = static_cast<int>(status_code);
  // A name whose host stream was handed over (docs/DIRECT-CALLS.md stage
  // 8) gets it written there; the link carries it otherwise, or too.
  ChannelState& st = Channel(self);
  if (st.direct != nullptr && st.direct->SendNamespaceEvent(frame)) {
    Py_RETURN_NONE;
  }
  if (!SendSideChannelFrameNow(self, frame)) return nullptr;
  Py_RETURN_NONE;
}

}  // namespace agentix::worker
