#include "worker/channel/channel_state.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <new>
#include <utility>

#include "worker/channel/log_sender.h"
#include "worker/channel/py_args.h"

namespace agentix::worker {

namespace {
std::atomic<bool> serve_direct_calls{false};
}  // namespace

void SetServeDirectCalls(bool on) {
  serve_direct_calls.store(on, std::memory_order_relaxed);
  // Direct calls end in the worker, so the daemon publishes no call-path
  // CPU for the intake's follower to avoid: it avoids the holder's.
  IntakeBaton::SetAvoidHolderCpu(on);
}

ChannelState::~ChannelState() = default;  // uploads release their objects

bool Enter(PyObject* self) {
  WaitIdle(*Channel(self).writer);
  return true;
}

void AcquireCaughtUp(ChannelState& st) {
  Writer& w = *st.writer;
  while (true) {
    while (st.uncaught) {
      st.uncaught = false;
      // May let go of the GIL: a sender queueing meanwhile sets it again.
      st.capture->CatchUp();
    }
    AcquireWrite(w);  // may let go of the GIL too
    if (!st.uncaught) return;
    // A call frame was queued while we waited: its lines first.
    Leave(w);
  }
}

bool Flush(PyObject* self) {
  ChannelState& st = Channel(self);
  // Direct calls' replies go out at the same points as the link's.
  if (st.direct != nullptr) st.direct->FlushReplies();
  if (st.out.empty()) return true;
  Writer& w = *st.writer;
  AcquireCaughtUp(st);
  if (st.out.empty()) {  // written by another thread while we waited
    Leave(w);
    return true;
  }
  absl::Status status =
      WithoutGil([&w, &st] { return WriteQueued(w, st.out); });
  Leave(w);
  if (!status.ok()) {
    SetError(StateOfChannel(self)->channel_error, status);
    return false;
  }
  return true;
}

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

PyObject* ChannelNew(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static const char* kKeywords[] = {"fd", "payload_fd", nullptr};
  int fd = -1;
  int payload_fd = -1;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "i|i:Channel",
                                   const_cast<char**>(kKeywords), &fd,
                                   &payload_fd)) {
    return nullptr;
  }
  std::unique_ptr<ipc::PayloadArea> payloads;
  if (payload_fd >= 0) {
    // Mapped, then closed: the mapping is all we use, and the fd must not
    // leak into processes user code starts.
    auto area = ipc::PayloadArea::Map(payload_fd);
    if (!area.ok()) {
      PyErr_SetString(PyExc_OSError,
                      std::string(area.status().message()).c_str());
      return nullptr;
    }
    ::close(payload_fd);
    payloads = std::move(*area);
  }
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return PyErr_SetFromErrno(PyExc_OSError);
  }
  PyObject* self = type->tp_alloc(type, 0);
  if (self == nullptr) return nullptr;
  auto* state = new (std::nothrow) ChannelState;
  if (state == nullptr) {
    Py_DECREF(self);
    return PyErr_NoMemory();
  }
  try {
    state->writer = std::make_shared<Writer>();
    state->durable = std::make_shared<DurableLog>();
    state->capture =
        std::make_unique<StdioCapture>(state->writer, state->durable);
  } catch (const std::bad_alloc&) {
    delete state;
    Py_DECREF(self);
    return PyErr_NoMemory();
  }
  state->writer->fd = fd;
  state->fd = fd;
  state->payloads = std::move(payloads);
  if (serve_direct_calls.load(std::memory_order_relaxed)) {
    if (auto direct = DirectConns::Create(fd, state->payloads.get());
        direct.ok()) {
      state->direct = std::move(*direct);
    }
  }
  reinterpret_cast<ChannelObject*>(self)->state = state;
  return self;
}

void ChannelDealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  ChannelState* state = reinterpret_cast<ChannelObject*>(self)->state;
  // The drainers and the sender use the channel's fd: they end (or are
  // abandoned, still owning what they use) before the owner may close it.
  Py_BEGIN_ALLOW_THREADS
  if (state->capture != nullptr) state->capture->Stop(1000);
  if (state->writer != nullptr) StopSender(state->writer, 1000);
  Py_END_ALLOW_THREADS
  delete state;
  type->tp_free(self);
  Py_DECREF(type);  // heap types are owned by their instances
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
  frame.direct = Channel(self).direct != nullptr;
  if (!Queue(self, frame)) return nullptr;
  Py_RETURN_NONE;
}

PyObject* ChannelSendEnvSet(PyObject* self, PyObject* const* args,
                            Py_ssize_t nargs) {
  if (!Enter(self) || !CheckArgs("send_env_set", nargs, 1)) return nullptr;
  ipc::Frame frame;
  frame.type = ipc::FrameType::kEnvSet;
  if (!ToUtf8(args[0], "detail", "backslashreplace", frame.detail)) {
    return nullptr;
  }
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
  return PyLong_FromLong(Channel(self).poll_fd());
}

bool QueueDirectClosed(PyObject* self) {
  DirectConns* direct = Channel(self).direct.get();
  if (direct == nullptr) return true;
  for (auto& [conn, why] : direct->TakeClosed()) {
    ipc::Frame closed;
    closed.type = ipc::FrameType::kDirectClosed;
    closed.direct_conn.conn = conn;
    closed.detail = std::move(why);
    if (!Queue(self, closed)) return false;
  }
  return true;
}

PyObject* ChannelFinishDirect(PyObject* self, PyObject* const* args,
                              Py_ssize_t nargs) {
  if (!Enter(self) || !CheckArgs("finish_direct", nargs, 2)) return nullptr;
  long long code = 0;
  std::string message;
  if (!ToInt(args[0], "code", code) ||
      !ToUtf8(args[1], "message", "backslashreplace", message)) {
    return nullptr;
  }
  if (code < 0 || code > 16) {
    PyErr_SetString(PyExc_ValueError, "code must be a status code (0..16)");
    return nullptr;
  }
  DirectConns* direct = Channel(self).direct.get();
  if (direct == nullptr) Py_RETURN_NONE;
  Py_BEGIN_ALLOW_THREADS
  direct->FinishAll(static_cast<absl::StatusCode>(code), message);
  Py_END_ALLOW_THREADS
  // The GIL was let go: the queue is ours again only after Enter.
  if (!Enter(self) || !QueueDirectClosed(self) || !Flush(self)) return nullptr;
  Py_RETURN_NONE;
}

PyObject* ChannelWaitCpu(PyObject* self, PyObject* /*unused*/) {
  const ipc::PayloadArea* payloads = Channel(self).payloads.get();
  return PyLong_FromLong(payloads != nullptr ? payloads->WaitCpu() : -1);
}

}  // namespace agentix::worker
