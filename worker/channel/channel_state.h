// The C++ side of a `_agentix_worker.Channel` object and its queue of
// call-path frames: frames queued by the send_* entry points go out in one
// write at flush() (or once 256 KiB are queued), after the queued log frames.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <memory>
#include <string>
#include <unordered_map>

#include "worker/channel/durable_log.h"
#include "worker/channel/intake_baton.h"
#include "worker/channel/pickle_splitter.h"
#include "worker/channel/stdio_capture.h"
#include "worker/channel/writer.h"
#include "worker/direct/direct_conns.h"
#include "worker/ipc/descriptors.h"
#include "worker/ipc/frame.h"
#include "worker/ipc/payload_area.h"

namespace agentix::worker {

// Queued output is written once it reaches this size, without waiting for
// flush(); from this size on a payload is written in place (writev).
inline constexpr size_t kFlushThreshold = 256 * 1024;

// Whether channels made from now on serve handed-over Calls connections
// (docs/DIRECT-CALLS.md): the worker's --direct_calls, set once at startup
// before Python runs. Off (the default), a channel polls its bare link and
// refuses a direct_conn (it does not advertise the capability): the direct
// poll set, an epoll descriptor, costs a relayed noop ~3 % (PERFORMANCE.md,
// stop 38, h-serve). On, the intake's follower waits off the holder's CPU
// when no call-path CPU is published (IntakeBaton::SetAvoidHolderCpu).
void SetServeDirectCalls(bool on);

// A call's arguments arriving in arg_chunk frames (frame_intake.h).
struct Upload {
  PyObject* buffer = nullptr;  // owned; nullptr if it could not be allocated
  uint64_t total = 0;
  uint64_t received = 0;
  // Pickled arguments: their large values are taken out of the stream into
  // `values` (pickle_splitter.h); `buffer` gets the rest, `written` bytes so
  // far. Null splitter: the bytes are copied as they come.
  std::unique_ptr<PickleSplitter> splitter;
  uint64_t written = 0;
  PyObject* values = nullptr;  // owned list, made for the first value
  uint64_t value_filled = 0;   // bytes of the last value in `values`
  // A direct call's: its pieces are copied in as the session reads them
  // (LandDirectArgument, `landed` bytes so far) and counted in `received`
  // when their driver frames come, in order with the call's other frames.
  bool direct = false;
  uint64_t landed = 0;

  ~Upload() {
    Py_XDECREF(buffer);
    Py_XDECREF(values);
  }
  Upload() = default;
  Upload(const Upload&) = delete;
  Upload& operator=(const Upload&) = delete;
};

// Touched only with the GIL held, except `out` during a write, which the
// writer's `busy` flag protects.
struct ChannelState {
  std::shared_ptr<Writer> writer;
  int fd = -1;
  ipc::FrameReader reader;
  // Descriptors that come with the daemon's frames (direct_conn), matched
  // to them as `reader` decodes; reads of `fd` go through it (recvmsg).
  ipc::DescriptorReader descriptors;
  std::string out;  // encoded frames not yet written
  // Shared with the daemon for large payload pieces (payload_area.h), or
  // nullptr. Get/Release: the reader (GIL held); Put: the write owner.
  std::unique_ptr<ipc::PayloadArea> payloads;
  // Calls whose arguments are still arriving, by call id.
  std::unordered_map<std::string, Upload> uploads;
  bool eof = false;
  bool dead = false;  // desynchronised: every later read fails
  std::string dead_reason;
  std::shared_ptr<DurableLog> durable;
  std::unique_ptr<StdioCapture> capture;  // never null
  // A call's result, item or error was queued in `out` since the last
  // CatchUp: lines its code wrote to fds 1/2 may still be in the pipes. The
  // barrier is paid once per write, not once per frame (AcquireCaughtUp).
  bool uncaught = false;
  // Leader/follower intake (intake_baton.h); made by the first
  // intake_to_pool(). Shared with the pool threads waiting in it.
  std::shared_ptr<IntakeBaton> baton;
  // Handed-over Calls connections (docs/DIRECT-CALLS.md): their poll set
  // holds `fd` too and is what fileno() gives the intake to poll. Null if
  // it could not be made (the worker then does not advertise direct calls).
  std::unique_ptr<DirectConns> direct;
  // The descriptor the intake polls: the direct poll set, or `fd`.
  int poll_fd() const { return direct != nullptr ? direct->poll_fd() : fd; }

  ChannelState() = default;
  ChannelState(const ChannelState&) = delete;
  ChannelState& operator=(const ChannelState&) = delete;
  // Deleted with the GIL held (ChannelDealloc).
  ~ChannelState();
};

struct ChannelObject {
  PyObject_HEAD
  ChannelState* state;
};

// The module's exception types and the Channel type.
struct ModuleState {
  PyObject* protocol_error;
  PyObject* channel_error;
  PyObject* channel_type;
  // The record types read_frames() returns, by FrameKind (frame_intake.h;
  // unused kinds stay nullptr), and wait_stdio_lines()'s line type.
  PyObject* frame_types[9];
  PyObject* stdio_line_type;
};

inline ModuleState* StateOfChannel(PyObject* self) {
  return static_cast<ModuleState*>(PyType_GetModuleState(Py_TYPE(self)));
}

inline ChannelState& Channel(PyObject* self) {
  return *reinterpret_cast<ChannelObject*>(self)->state;
}

// Waits (with the GIL released) while another thread has a write in flight.
// Pool threads send their own replies, so several threads use one channel:
// `out` is appended to only with the GIL held and while no Python-side
// write is in flight, and such a write starts only with the GIL held, so
// passing Enter() makes `out` ours until we let go of the GIL. (The log
// sender thread may take `busy` meanwhile; it never touches `out`.)
bool Enter(PyObject* self);

// The side-channel barrier, then the write lock: takes `busy` once every
// line written to fds 1/2 before the last call frame was queued (`uncaught`)
// is on the log queue, so it goes out ahead of that frame. Pays one
// CatchUp (an epoll_wait(0)) per write rather than one per result: at 64 callers a
// write carries ~8 results. GIL held on entry and exit; may let go of it.
void AcquireCaughtUp(ChannelState& st);

// Writes everything queued. GIL held on entry and exit. False with
// ChannelError set if the write failed.
bool Flush(PyObject* self);

// Queues one frame; writes the queue once it is large. GIL held.
bool Queue(PyObject* self, const ipc::Frame& frame);

// tp_new / tp_dealloc of Channel(fd, payload_fd=-1).
PyObject* ChannelNew(PyTypeObject* type, PyObject* args, PyObject* kwargs);
void ChannelDealloc(PyObject* self);

// send_ready(pid, detail), send_env_set(detail), flush(), pending_bytes(),
// fileno() (what to poll for frames: the link and the direct connections),
// finish_direct(code, message) (shutdown: STATUS on every direct connection,
// then direct_closed to the daemon).
PyObject* ChannelSendReady(PyObject* self, PyObject* const* args,
                           Py_ssize_t nargs);
PyObject* ChannelSendEnvSet(PyObject* self, PyObject* const* args,
                            Py_ssize_t nargs);
PyObject* ChannelFlush(PyObject* self, PyObject* unused);
PyObject* ChannelPendingBytes(PyObject* self, PyObject* unused);
PyObject* ChannelFileno(PyObject* self, PyObject* unused);
PyObject* ChannelFinishDirect(PyObject* self, PyObject* const* args,
                              Py_ssize_t nargs);
// Queues a direct_closed frame for each connection that ended. GIL held.
bool QueueDirectClosed(PyObject* self);
// The CPU the daemon placed the call path on (PayloadArea::WaitCpu), or -1.
PyObject* ChannelWaitCpu(PyObject* self, PyObject* unused);

}  // namespace agentix::worker
