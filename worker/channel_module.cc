#include "worker/channel_module.h"

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <msgpack.hpp>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/log.h"
#include "base/utf8.h"
#include "worker/ipc/chunking.h"
#include "worker/ipc/frame.h"
#include "worker/ipc/io.h"
#include "worker/ipc/payload_area.h"
#include "worker/python/msgpack_convert.h"

namespace agentix::worker {
namespace {

// Frame kinds as the driver sees them.
enum FrameKind : int {
  kCall = 1,
  kCancel = 3,
  kShutdown = 4,
  kStreamAck = 5,
  kNamespaceEvent = 6,
  kArgs = 7,  // a chunked call's complete arguments (see Upload)
  kSetEnv = 8,
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
// Encoded log frames waiting for the sender beyond this make producers wait
// (Python senders with the GIL released, drainers before their next read):
// a daemon that stops reading must not make the worker grow without bound.
constexpr size_t kMaxQueuedLogBytes = 16u * 1024 * 1024;
// Captured lines waiting for the durable-log thread beyond this are dropped:
// the file is a best-effort copy and must never slow user output down.
constexpr size_t kMaxDurableBytes = 16u * 1024 * 1024;
// Once woken, the log sender waits this long before taking the queue unless
// kLingerBytes are already there: a burst of records then goes out in one
// write, and its producers wake the sender once per batch instead of once per
// record (each wake cost the producer more than encoding its record). Calls'
// results and namespace events do not wait for it: they take the queue
// themselves (TakeLogs).
constexpr auto kLinger = std::chrono::microseconds(200);
constexpr size_t kLingerBytes = 64 * 1024;
// Longest captured line; longer output is cut into lines of this size.
constexpr size_t kMaxLineBytes = 64 * 1024;

constexpr int kOriginStdout = 2;
constexpr int kOriginStderr = 3;

// One captured line for the durable log file.
struct StdioLine {
  int origin = kOriginStdout;
  int64_t time_unix_nanos = 0;
  std::string text;
};

// Set in a child forked by user code: it has no sender thread, may have
// been forked while another thread held a Writer's lock, and shares the
// channel fd with the worker. Its records are dropped (the driver also
// points its sys.stdout/sys.stderr back at the fds, which the worker's
// drainers still read).
std::atomic<bool> g_in_forked_child{false};

// The read end of one capture pipe (fd 1 or fd 2). Its drainer thread reads
// it, and so does a thread about to send a call's result (CatchUpCapture):
// whoever holds `mu` reads what the pipe holds and queues its lines, so
// once a thread has taken `mu` and found the pipe empty, every line written
// before is on the log queue. Lock order: `mu` before Writer::mu; nobody
// waits for it while holding the GIL.
struct CapturePipe {
  std::mutex mu;
  int fd = -1;  // non-blocking; -1 when capture is off or the drainer ended
  int origin = 2;
  std::string pending;  // bytes of the current, unfinished line
  std::unique_ptr<char[]> buffer;
};

// The part of a channel that threads without the GIL use too: the fd, the
// write lock and the log queue. Shared (shared_ptr) between the Channel and
// the sender and drainer threads, so a thread abandoned at shutdown never
// outlives what it touches.
//
// Lock order: `mu` is a leaf. Nobody waits for the GIL while holding it, and
// a thread holding the GIL takes it only briefly or after releasing the GIL
// (AcquireWrite, WaitIdle), so it cannot deadlock against the GIL.
struct Writer {
  int fd = -1;
  std::mutex mu;
  // A write to `fd` is in flight: the channel's fd is written by one thread
  // at a time, whichever holds `busy` (a Python sender with the GIL released,
  // or the log sender thread).
  bool busy = false;
  std::condition_variable idle_cv;  // `busy` cleared
  // Encoded log frames not yet written, in the order they were produced.
  std::string logs;
  std::condition_variable logs_cv;   // logs queued, or the sender must stop
  // The sender sleeps on logs_cv. Producers wake it only then (and only
  // once): a futex wake per record cost more than encoding it, and a sender
  // that is busy writing finds what was queued meanwhile by itself.
  bool sender_asleep = false;
  std::condition_variable space_cv;  // `logs` shrank (or logging gave up)
  bool sender_running = false;
  bool sender_stop = false;
  bool failed = false;  // a log write failed: later records are dropped
  std::thread sender;
  // Captured lines for the durable log, when enabled.
  bool durable = false;
  bool capture_done = false;  // no more lines will come
  std::deque<StdioLine> durable_lines;
  size_t durable_bytes = 0;
  std::condition_variable durable_cv;
  // The capture pipes (stdout, stderr), once capture started.
  CapturePipe pipes[2];
  std::atomic<bool> capturing{false};
  // Drainer threads still reading.
  int drainers = 0;
  std::condition_variable drainers_cv;
  // What stdout/stderr log frames carry (set when capture starts).
  std::string context;
  std::string stdout_extras;
  std::string stderr_extras;
};

// fd-level capture of stdout/stderr; owned by the ChannelState.
struct Capture {
  int saved_stderr = -1;
  std::vector<std::thread> drainers;
  bool stopped = false;
};

// A call's arguments arriving in arg_chunk frames, assembled where they end
// up: the bytes object is allocated once with the announced total_size and
// each chunk is copied into it straight from the read buffer. Python sees it
// only once complete (until then a bytes object may still be filled).
struct Upload {
  PyObject* buffer = nullptr;  // owned; nullptr if it could not be allocated
  uint64_t total = 0;
  uint64_t received = 0;
};

// The C++ side of a Channel object. Touched only with the GIL held, except
// `out` during a write, which the writer's `busy` flag protects.
struct ChannelState {
  std::shared_ptr<Writer> writer;
  int fd = -1;
  ipc::FrameReader reader;
  std::string out;  // encoded frames not yet written
  // Shared with the daemon for large payload pieces (payload_area.h), or
  // nullptr. Get/Release: the reader (GIL held); Put: the write owner.
  std::unique_ptr<ipc::PayloadArea> payloads;
  // Calls whose arguments are still arriving, by call id.
  std::unordered_map<std::string, Upload> uploads;
  bool eof = false;
  bool dead = false;  // desynchronised: every later read fails
  std::string dead_reason;
  std::unique_ptr<Capture> capture;

  ChannelState() = default;
  ChannelState(const ChannelState&) = delete;
  ChannelState& operator=(const ChannelState&) = delete;
  // Deleted with the GIL held (ChannelDealloc).
  ~ChannelState() {
    for (auto& [id, upload] : uploads) Py_XDECREF(upload.buffer);
  }
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
// Pool threads send their own replies, so several threads use one channel:
// `out` is appended to only with the GIL held and while no Python-side
// write is in flight, and such a write starts only with the GIL held, so
// passing Enter() makes `out` ours until we let go of the GIL. (The log
// sender thread may take `busy` meanwhile; it never touches `out`.)
bool Enter(PyObject* self) {
  Writer& w = *Channel(self).writer;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(w.mu);
      if (!w.busy) return true;
    }
    // A waiter must let go of the GIL: the writer may need it to finish.
    // Checked again once the GIL is back: another thread may have started
    // a write while this one waited for the GIL.
    Py_BEGIN_ALLOW_THREADS
    {
      std::unique_lock<std::mutex> lock(w.mu);
      w.idle_cv.wait(lock, [&w] { return !w.busy; });
    }
    Py_END_ALLOW_THREADS
  }
}

// Takes the write lock (`busy`), waiting with the GIL released. GIL held on
// entry and exit.
void AcquireWrite(Writer& w) {
  {
    std::lock_guard<std::mutex> lock(w.mu);
    if (!w.busy) {
      w.busy = true;
      return;
    }
  }
  Py_BEGIN_ALLOW_THREADS
  {
    std::unique_lock<std::mutex> lock(w.mu);
    w.idle_cv.wait(lock, [&w] { return !w.busy; });
    w.busy = true;
  }
  Py_END_ALLOW_THREADS
}

// Ends a write begun with AcquireWrite. Any thread.
void Leave(Writer& w) {
  std::lock_guard<std::mutex> lock(w.mu);
  w.busy = false;
  w.idle_cv.notify_all();
}

// With the write lock held: takes the queued log frames, so they go out
// ahead of what the caller writes next (a record logged before a call
// returned then precedes its result). No GIL needed.
std::string TakeLogs(Writer& w) {
  std::string logs;
  std::lock_guard<std::mutex> lock(w.mu);
  logs.swap(w.logs);
  w.space_cv.notify_all();
  return logs;
}

// With the write lock held and without the GIL: writes the queued logs and
// then `out`.
absl::Status WriteQueued(Writer& w, std::string& out) {
  std::string logs = TakeLogs(w);
  absl::Status status;
  if (!logs.empty()) status = ipc::WriteAll(w.fd, logs);
  if (status.ok()) status = ipc::WriteAll(w.fd, out);
  out.clear();
  return status;
}

// Writes everything queued. GIL held on entry and exit.
bool Flush(PyObject* self) {
  ChannelState& st = Channel(self);
  if (st.out.empty()) return true;
  Writer& w = *st.writer;
  AcquireWrite(w);
  absl::Status status =
      WithoutGil([&w, &st] { return WriteQueued(w, st.out); });
  Leave(w);
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

// ---- worker diagnostics -----------------------------------------------------

// Once stdout/stderr are captured, fd 2 is a pipe into the log stream; the
// worker's own diagnostics go to the saved original stderr instead, in
// //base:log's line format (base::LogLine always writes fd 2). -1: fd 2.
std::atomic<int> g_diag_fd{-1};
// "agentix-worker[<id>]"; set before g_diag_fd, never changed afterwards.
std::string* g_diag_tag = nullptr;

void DiagLine(base::LogSeverity severity, const std::string& message) {
  const int fd = g_diag_fd.load();
  if (fd < 0) {
    base::LogLine(severity, message);
    return;
  }
  static constexpr char kLetters[] = "DIWE";
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  tm tm_utc;
  gmtime_r(&ts.tv_sec, &tm_utc);
  const std::string line = fmt::format(
      "{:02}:{:02}:{:02}.{:03} {} {} {}\n", tm_utc.tm_hour, tm_utc.tm_min,
      tm_utc.tm_sec, ts.tv_nsec / 1000000, *g_diag_tag,
      kLetters[static_cast<int>(severity) & 3], message);
  // One write per line so concurrent lines do not interleave.
  ssize_t ignored = ::write(fd, line.data(), line.size());
  (void)ignored;
}

// ---- log frames -------------------------------------------------------------

int64_t NowUnixNanos() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Appends `data` to `out` as valid UTF-8, each invalid sequence replaced by
// U+FFFD (Python's errors="replace" for captured bytes, without the GIL).
void AppendUtf8Replacing(const char* data, size_t size, std::string& out) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  std::string_view rest(data, size);
  while (!rest.empty()) {
    size_t ascii = 0;
    while (ascii < rest.size() &&
           static_cast<unsigned char>(rest[ascii]) < 0x80) {
      ++ascii;
    }
    out.append(rest.data(), ascii);
    rest.remove_prefix(ascii);
    if (rest.empty()) break;
    size_t invalid = 0;
    const size_t length = base::Utf8SequenceLength(rest, &invalid);
    if (length > 0) {
      out.append(rest.data(), length);
      rest.remove_prefix(length);
    } else {
      // The maximal invalid prefix becomes one U+FFFD, as CPython does.
      out.append(kReplacement);
      rest.remove_prefix(invalid);
    }
  }
}

// msgpack {"agentix_stream": stream, "worker_id": id}: the extras of a
// captured line (as the original's /log records carried).
std::string StdioExtras(const char* stream, const std::string& worker_id) {
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> packer(buffer);
  packer.pack_map(2);
  packer.pack(std::string("agentix_stream"));
  packer.pack(std::string(stream));
  packer.pack(std::string("worker_id"));
  packer.pack(worker_id);
  return std::string(buffer.data(), buffer.size());
}

// Encodes the log frame of one captured line (text already valid UTF-8).
absl::Status AppendStdioFrame(const Writer& w, int origin, int64_t time_ns,
                              const std::string& text,
                              const std::string& call_id, std::string& out) {
  ipc::Frame frame;
  frame.type = ipc::FrameType::kLog;
  ipc::LogEntry& log = frame.log;
  const bool is_stdout = origin == kOriginStdout;
  log.logger = is_stdout ? "agentix.sandbox.stdout" : "agentix.sandbox.stderr";
  log.level = 20;
  log.level_name = "INFO";
  log.message = text;
  log.time_unix_nanos = time_ns;
  log.module = "stdio";
  log.origin = origin;
  log.call_id = call_id;
  log.context = w.context;
  log.extras = is_stdout ? w.stdout_extras : w.stderr_extras;
  return ipc::AppendFrame(frame, out);
}

// With `mu` held, after queueing: whether the caller must wake the sender
// (notify logs_cv once `mu` is released, so the sender does not wake up
// only to block on it). True at most once per sleep of the sender.
bool TakeSenderWake(Writer& w) {
  if (!w.sender_asleep) return false;
  w.sender_asleep = false;
  return true;
}

// Appends encoded log frames to the queue and wakes the sender. Waits while
// the queue is over kMaxQueuedLogBytes; must be called without the GIL.
// Records are dropped once a log write failed or the sender has stopped.
void QueueLogs(Writer& w, std::string& frames,
               std::vector<StdioLine>* durable) {
  std::unique_lock<std::mutex> lock(w.mu);
  w.space_cv.wait(lock, [&w] {
    return w.logs.size() < kMaxQueuedLogBytes || w.failed ||
           !w.sender_running;
  });
  if (w.failed || !w.sender_running) return;
  if (w.logs.empty()) {
    w.logs.swap(frames);
  } else {
    w.logs.append(frames);
  }
  const bool wake = TakeSenderWake(w);
  if (durable != nullptr && w.durable && !w.capture_done) {
    for (StdioLine& line : *durable) {
      if (w.durable_bytes + line.text.size() > kMaxDurableBytes) break;
      w.durable_bytes += line.text.size();
      w.durable_lines.push_back(std::move(line));
    }
    w.durable_cv.notify_one();
  }
  lock.unlock();
  if (wake) w.logs_cv.notify_one();
}

// The log sender thread: writes queued log frames as soon as the channel is
// free, so records from any thread reach the daemon promptly (within
// kLinger), batched by whatever accumulated during the linger and the previous
// write. Never touches Python.
void SendLogs(std::shared_ptr<Writer> writer) {
  pthread_setname_np(pthread_self(), "agx-log-sender");
  Writer& w = *writer;
  std::string batch;
  std::unique_lock<std::mutex> lock(w.mu);
  while (true) {
    while (w.logs.empty() && !w.sender_stop) {
      w.sender_asleep = true;
      w.logs_cv.wait(lock);
      w.sender_asleep = false;  // also when woken spuriously or by StopSender
    }
    if (w.logs.empty()) break;  // stopping, and everything is written
    if (w.logs.size() < kLingerBytes && !w.sender_stop) {
      // Not asleep meanwhile: producers just queue.
      lock.unlock();
      std::this_thread::sleep_for(kLinger);
      lock.lock();
      if (w.logs.empty()) continue;  // taken by a call's result meanwhile
    }
    w.idle_cv.wait(lock, [&w] { return !w.busy; });
    w.busy = true;
    batch.swap(w.logs);  // whatever is queued now, in order
    w.space_cv.notify_all();
    lock.unlock();
    const absl::Status status = ipc::WriteAll(w.fd, batch);
    batch.clear();
    lock.lock();
    w.busy = false;
    w.idle_cv.notify_all();
    if (!status.ok()) {
      // The daemon is gone; the driver finds out from its own writes.
      w.failed = true;
      w.logs.clear();
      w.space_cv.notify_all();
      break;
    }
  }
  w.sender_running = false;
  w.space_cv.notify_all();
}

// Starts the sender thread unless it runs (or was stopped: then records
// are dropped). `mu` held (and the GIL).
void EnsureSenderLocked(const std::shared_ptr<Writer>& writer) {
  Writer& w = *writer;
  if (w.sender_running || w.sender_stop || w.failed) return;
  try {
    w.sender = std::thread(SendLogs, writer);
    w.sender_running = true;
  } catch (const std::exception&) {
    // No thread: logging degrades to dropping records, calls are unaffected.
    w.failed = true;
  }
}

// Stops the sender after it wrote what is queued, waiting at most
// `timeout_ms` (it may be stuck writing to a daemon that stopped reading;
// then it is abandoned, which is safe: it owns its Writer). No GIL.
void StopSender(const std::shared_ptr<Writer>& writer, int timeout_ms) {
  Writer& w = *writer;
  std::unique_lock<std::mutex> lock(w.mu);
  if (!w.sender.joinable()) return;
  w.sender_stop = true;
  w.logs_cv.notify_all();
  const bool done = w.space_cv.wait_for(
      lock, std::chrono::milliseconds(timeout_ms),
      [&w] { return !w.sender_running; });
  std::thread sender = std::move(w.sender);
  lock.unlock();
  if (done) {
    sender.join();
  } else {
    sender.detach();
  }
}

// With `p.mu` held and without the GIL: reads what pipe `p` holds (it is
// non-blocking), turns each complete line into a log frame and queues them.
// Returns false at EOF or on a read error; `at_eof` also sends the
// unfinished line.
bool ReadAvailable(Writer& w, CapturePipe& p, bool at_eof_flushes) {
  std::string frames;
  std::vector<StdioLine> lines;
  const std::string no_call_id;  // fd-level output cannot be attributed
  const int origin = p.origin;
  auto emit = [&](const char* data, size_t size, int64_t now) {
    if (size > 0 && data[size - 1] == '\r') --size;
    StdioLine line;
    line.origin = origin;
    line.time_unix_nanos = now;
    AppendUtf8Replacing(data, size, line.text);
    absl::Status status =
        AppendStdioFrame(w, origin, now, line.text, no_call_id, frames);
    (void)status;  // a 64 KiB line always fits a frame
    lines.push_back(std::move(line));
  };
  bool open = true;
  while (true) {
    const ssize_t n = ::read(p.fd, p.buffer.get(), kMaxLineBytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n <= 0) {
      open = false;
      break;
    }
    const int64_t now = NowUnixNanos();
    const char* data = p.buffer.get();
    size_t size = static_cast<size_t>(n);
    std::string& pending = p.pending;
    while (size > 0) {
      const void* nl = memchr(data, '\n', size);
      if (nl == nullptr) {
        pending.append(data, size);
        break;
      }
      const size_t len = static_cast<size_t>(static_cast<const char*>(nl) - data);
      if (pending.empty()) {
        emit(data, len, now);
      } else {
        pending.append(data, len);
        emit(pending.data(), pending.size(), now);
        pending.clear();
      }
      data += len + 1;
      size -= len + 1;
    }
    // A line without a newline is cut once it reaches the limit.
    size_t cut = 0;
    while (pending.size() - cut >= kMaxLineBytes) {
      emit(pending.data() + cut, kMaxLineBytes, now);
      cut += kMaxLineBytes;
    }
    if (cut > 0) pending.erase(0, cut);
    if (frames.size() >= kLingerBytes) {
      QueueLogs(w, frames, &lines);
      frames.clear();
      lines.clear();
    }
    // A pipe read returns all it holds up to the size asked: a short read
    // emptied it.
    if (static_cast<size_t>(n) < kMaxLineBytes) break;
  }
  if (!open && at_eof_flushes && !p.pending.empty()) {
    emit(p.pending.data(), p.pending.size(), NowUnixNanos());
    p.pending.clear();
  }
  if (!frames.empty()) QueueLogs(w, frames, &lines);
  return open;
}

// A drainer thread: reads one capture pipe until EOF and turns each line into
// a log frame. It never takes the GIL, so a full pipe cannot wait on Python.
void Drain(std::shared_ptr<Writer> writer, int index) {
  Writer& w = *writer;
  CapturePipe& p = w.pipes[index];
  pthread_setname_np(pthread_self(), p.origin == kOriginStdout ? "agx-stdout"
                                                               : "agx-stderr");
  while (true) {
    pollfd pfd{};
    {
      std::lock_guard<std::mutex> lock(p.mu);
      pfd.fd = p.fd;
    }
    pfd.events = POLLIN;
    const int ready = ::poll(&pfd, 1, -1);
    if (ready < 0 && errno != EINTR) break;
    std::lock_guard<std::mutex> lock(p.mu);
    if (!ReadAvailable(w, p, /*at_eof_flushes=*/true)) {
      ::close(p.fd);
      p.fd = -1;
      break;
    }
  }
  std::lock_guard<std::mutex> lock(w.mu);
  --w.drainers;
  w.drainers_cv.notify_all();
}

// The side-channel barrier's worker half: before a call's result, item or
// error is queued, the lines already written to fds 1 and 2 (by the call,
// os.write, a child process) are read and queued, so they reach the daemon
// ahead of it. Costs one poll() when the pipes are empty. GIL held on entry
// and exit; released only to wait for a drainer or to read.
void CatchUpCapture(Writer& w) {
  if (!w.capturing.load(std::memory_order_acquire) ||
      g_in_forked_child.load(std::memory_order_relaxed)) {
    return;
  }
  std::unique_lock<std::mutex> locks[2];
  for (int i = 0; i < 2; ++i) {
    locks[i] = std::unique_lock<std::mutex>(w.pipes[i].mu, std::try_to_lock);
    if (!locks[i].owns_lock()) {
      // A drainer is queueing lines (its lock is only ever held without the
      // GIL): wait for it with the GIL released.
      Py_BEGIN_ALLOW_THREADS
      locks[i].lock();
      Py_END_ALLOW_THREADS
    }
  }
  pollfd fds[2];
  int count = 0;
  int which[2];
  for (int i = 0; i < 2; ++i) {
    if (w.pipes[i].fd < 0) continue;
    fds[count] = pollfd{w.pipes[i].fd, POLLIN, 0};
    which[count++] = i;
  }
  if (count == 0 || ::poll(fds, count, 0) <= 0) return;
  Py_BEGIN_ALLOW_THREADS
  for (int k = 0; k < count; ++k) {
    if (fds[k].revents & POLLIN) {
      ReadAvailable(w, w.pipes[which[k]], /*at_eof_flushes=*/false);
    }
  }
  Py_END_ALLOW_THREADS
}

// ---- Channel ----------------------------------------------------------------

void StopCapture(ChannelState& st, int timeout_ms);  // below

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
  } catch (const std::bad_alloc&) {
    delete state;
    Py_DECREF(self);
    return PyErr_NoMemory();
  }
  state->writer->fd = fd;
  state->fd = fd;
  state->payloads = std::move(payloads);
  reinterpret_cast<ChannelObject*>(self)->state = state;
  return self;
}

void ChannelDealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  ChannelState* state = reinterpret_cast<ChannelObject*>(self)->state;
  // The drainers and the sender use the channel's fd: they end (or are
  // abandoned, still owning the Writer) before the owner may close it.
  Py_BEGIN_ALLOW_THREADS
  StopCapture(*state, 1000);
  StopSender(state->writer, 1000);
  Py_END_ALLOW_THREADS
  delete state;
  type->tp_free(self);
  Py_DECREF(type);  // heap types are owned by their instances
}

PyObject* BytesOf(std::string_view data) {
  return PyBytes_FromStringAndSize(data.data(),
                                   static_cast<Py_ssize_t>(data.size()));
}

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
        st.dead = true;
        st.dead_reason = std::string(next.status().message());
        PyErr_SetString(ms->protocol_error, st.dead_reason.c_str());
        Py_DECREF(list);
        return nullptr;
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
          st.dead = true;
          st.dead_reason = std::string(piece.status().message());
          PyErr_SetString(ms->protocol_error, st.dead_reason.c_str());
          Py_DECREF(list);
          return nullptr;
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

// Sends encoded frames given as pieces (headers, slices of the caller's
// payload, trailers). Small ones are copied into st.out like any frame; from
// kFlushThreshold on, the pieces are written where they are, with writev,
// after the queued logs and st.out, holding the channel's write side with
// the GIL released, so the payload is never copied and no other thread's
// frames interleave. GIL held on entry and exit; the caller's Py_buffer
// keeps the payload alive throughout. kUnavailable if the write failed.
absl::Status SendPieces(ChannelState& st,
                        const std::vector<std::string_view>& pieces) {
  size_t size = 0;
  for (std::string_view piece : pieces) size += piece.size();
  if (size < kFlushThreshold) {
    try {
      for (std::string_view piece : pieces) st.out.append(piece);
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError("out of memory");
    }
    return absl::OkStatus();
  }
  Writer& w = *st.writer;
  AcquireWrite(w);
  absl::Status status = WithoutGil([&w, &st, &pieces] {
    const std::string logs = TakeLogs(w);
    std::vector<std::string_view> all;
    all.reserve(pieces.size() + 2);
    all.push_back(logs);
    all.push_back(st.out);
    all.insert(all.end(), pieces.begin(), pieces.end());
    absl::Status written = ipc::WriteAll(w.fd, all);
    st.out.clear();
    return written;
  });
  Leave(w);
  return status;
}

// The frames of a result as pieces: kChunkBytes-sized `result_chunk` frames
// (all sharing one header) and the final `result` frame with the last
// (1..kChunkBytes) bytes, so the payload is referenced, not copied. The
// header strings are stored in `headers` and must outlive the pieces.
absl::Status ResultPieces(const std::string& call_id, int encoding,
                          std::string_view data, std::string (&headers)[3],
                          std::vector<std::string_view>& pieces) {
  constexpr size_t kChunk = ipc::kChunkBytes;
  const size_t size = data.size();
  const auto [chunks, last] = ipc::SplitWithTail(size);
  ipc::Frame frame;
  frame.call_id = call_id;
  std::string unused_tail;  // chunk frames end with their payload
  if (chunks > 0) {
    frame.type = ipc::FrameType::kResultChunk;
    absl::Status status =
        ipc::EncodeFrameAround(frame, kChunk, headers[0], unused_tail);
    if (!status.ok()) return status;
  }
  frame.type = ipc::FrameType::kResult;
  frame.encoding = encoding;
  frame.total_size = size;
  absl::Status status =
      ipc::EncodeFrameAround(frame, last, headers[1], headers[2]);
  if (!status.ok()) return status;
  pieces.reserve(2 * chunks + 3);
  for (size_t i = 0; i < chunks; ++i) {
    pieces.push_back(headers[0]);
    pieces.push_back(data.substr(i * kChunk, kChunk));
  }
  pieces.push_back(headers[1]);
  pieces.push_back(data.substr(chunks * kChunk));
  pieces.push_back(headers[2]);
  return absl::OkStatus();
}

// The bytes [offset, offset + size) of the concatenation of `parts`, as
// views into them.
std::vector<std::string_view> SliceParts(
    const std::vector<std::string_view>& parts, size_t offset, size_t size) {
  std::vector<std::string_view> out;
  for (std::string_view part : parts) {
    if (size == 0) break;
    if (offset >= part.size()) {
      offset -= part.size();
      continue;
    }
    const std::string_view piece = part.substr(offset, size);
    out.push_back(piece);
    size -= piece.size();
    offset = 0;
  }
  return out;
}

// A large result with a payload area: each piece is copied into the ring
// and announced by a small frame written at once (so the daemon copies it
// out while the next is copied in); a piece that does not fit now (or is
// small) goes inline around the caller's buffers. The result is the
// concatenation of `parts` (a pickle written as pieces: its large values
// are never joined). Like SendPieces' large path: queued logs and st.out
// first, the write side held, the GIL released.
absl::Status SendResultViaRing(ChannelState& st, const std::string& call_id,
                               int encoding,
                               const std::vector<std::string_view>& parts,
                               size_t size) {
  Writer& w = *st.writer;
  AcquireWrite(w);
  absl::Status status = WithoutGil([&]() -> absl::Status {
    const std::string logs = TakeLogs(w);
    const std::string_view queued[] = {logs, st.out};
    absl::Status written = ipc::WriteAll(w.fd, queued);
    st.out.clear();
    if (!written.ok()) return written;
    constexpr size_t kChunk = ipc::kChunkBytes;
    const auto [chunks, last] = ipc::SplitWithTail(size);
    std::string head, tail;
    for (size_t i = 0; i <= chunks; ++i) {
      const bool final = i == chunks;
      const size_t piece_size = final ? last : kChunk;
      std::vector<std::string_view> piece =
          SliceParts(parts, i * kChunk, piece_size);
      ipc::Frame frame;
      frame.type =
          final ? ipc::FrameType::kResult : ipc::FrameType::kResultChunk;
      frame.call_id = call_id;
      if (final) {
        frame.encoding = encoding;
        frame.total_size = size;
      }
      std::optional<uint64_t> pos;
      if (piece_size >= ipc::kRingMinPieceBytes) {
        pos = st.payloads->Put(piece);
      }
      if (pos) {
        frame.in_ring = true;
        frame.ring_pos = *pos;
        frame.ring_size = piece_size;
        head.clear();
        written = ipc::AppendFrame(frame, head);
        if (written.ok()) written = ipc::WriteAll(w.fd, head);
      } else {
        written = ipc::EncodeFrameAround(frame, piece_size, head, tail);
        piece.insert(piece.begin(), head);
        piece.push_back(tail);
        if (written.ok()) written = ipc::WriteAll(w.fd, piece);
      }
      if (!written.ok()) return written;
    }
    return absl::OkStatus();
  });
  Leave(w);
  return status;
}

// Buffers of the parts of a result, released when done.
class ResultParts {
 public:
  ResultParts() = default;
  ResultParts(const ResultParts&) = delete;
  ResultParts& operator=(const ResultParts&) = delete;
  ~ResultParts() {
    for (Py_buffer& view : views_) PyBuffer_Release(&view);
  }
  // `data`: one buffer, or a list of buffers. False with a Python error set.
  bool Take(PyObject* data) {
    if (!PyList_Check(data)) return Add(data);
    views_.reserve(static_cast<size_t>(PyList_GET_SIZE(data)));
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(data); ++i) {
      if (!Add(PyList_GET_ITEM(data, i))) return false;
    }
    return true;
  }
  const std::vector<std::string_view>& parts() const { return parts_; }
  size_t size() const { return size_; }

 private:
  bool Add(PyObject* object) {
    Py_buffer view;
    if (PyObject_GetBuffer(object, &view, PyBUF_CONTIG_RO) != 0) return false;
    views_.push_back(view);
    parts_.emplace_back(static_cast<const char*>(view.buf),
                        static_cast<size_t>(view.len));
    size_ += static_cast<size_t>(view.len);
    return true;
  }
  std::vector<Py_buffer> views_;
  std::vector<std::string_view> parts_;
  size_t size_ = 0;
};

PyObject* ChannelSendResult(PyObject* self, PyObject* const* args,
                            Py_ssize_t nargs) {
  // Before Enter(): it may let go of the GIL.
  CatchUpCapture(*Channel(self).writer);
  if (!Enter(self) || !CheckArgs("send_result", nargs, 3)) return nullptr;
  std::string call_id;
  long long encoding = 0;
  if (!ToUtf8(args[0], "call_id", "surrogateescape", call_id) ||
      !ToInt(args[1], "encoding", encoding)) {
    return nullptr;
  }
  ChannelState& st = Channel(self);
  absl::Status status;
  {
    ResultParts result;
    // The list is not changed while we hold the GIL; its items' buffers stay
    // exported (hence unchanged) until `result` ends.
    if (!result.Take(args[2])) return nullptr;
    if (st.payloads != nullptr && result.size() >= kFlushThreshold) {
      status = SendResultViaRing(st, call_id, static_cast<int>(encoding),
                                 result.parts(), result.size());
    } else {
      std::string joined;
      std::string_view data;
      if (result.parts().size() == 1) {
        data = result.parts()[0];
      } else {
        joined.reserve(result.size());
        for (std::string_view part : result.parts()) joined.append(part);
        data = joined;
      }
      std::string headers[3];
      std::vector<std::string_view> pieces;
      status = ResultPieces(call_id, static_cast<int>(encoding), data, headers,
                            pieces);
      if (status.ok()) status = SendPieces(st, pieces);
    }
  }
  if (!status.ok()) {
    SetError(StateOfChannel(self)->channel_error, status);
    return nullptr;
  }
  if (st.out.size() >= kFlushThreshold && !Flush(self)) return nullptr;
  Py_RETURN_NONE;
}

PyObject* ChannelSendItem(PyObject* self, PyObject* const* args,
                          Py_ssize_t nargs) {
  // Before Enter(): it may let go of the GIL.
  CatchUpCapture(*Channel(self).writer);
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
  std::string head, tail;
  absl::Status status = ipc::EncodeFrameAround(frame, size, head, tail);
  if (!status.ok()) {
    // Nothing was queued. Only the frame limit fails here, so the driver
    // can fail the call without declaring the channel dead.
    PyBuffer_Release(&view);
    SetError(PyExc_ValueError, status);
    return nullptr;
  }
  status = SendPieces(st, {head, std::string_view(data, size), tail});
  PyBuffer_Release(&view);
  if (!status.ok()) {
    SetError(StateOfChannel(self)->channel_error, status);
    return nullptr;
  }
  if (st.out.size() >= kFlushThreshold && !Flush(self)) return nullptr;
  Py_RETURN_NONE;
}

PyObject* ChannelSendError(PyObject* self, PyObject* const* args,
                           Py_ssize_t nargs) {
  // Before Enter(): it may let go of the GIL.
  CatchUpCapture(*Channel(self).writer);
  if (!Enter(self)) return nullptr;
  if (nargs != 6 && nargs != 9) {
    PyErr_Format(PyExc_TypeError,
                 "send_error() takes 6 or 9 arguments (%zd given)", nargs);
    return nullptr;
  }
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
  if (nargs == 9) {
    if (!ToUtf8(args[6], "type_module", "backslashreplace",
                frame.error.type_module) ||
        !ToUtf8(args[7], "type_qualname", "backslashreplace",
                frame.error.type_qualname)) {
      return nullptr;
    }
    if (args[8] != Py_None) {
      Py_buffer view;
      if (PyObject_GetBuffer(args[8], &view, PyBUF_CONTIG_RO) != 0) {
        return nullptr;
      }
      // An over-large state is dropped, not refused: the error still goes.
      if (static_cast<size_t>(view.len) <= ipc::kMaxExceptionStateBytes) {
        frame.error.state.assign(static_cast<const char*>(view.buf),
                                 static_cast<size_t>(view.len));
      }
      PyBuffer_Release(&view);
    }
  }
  if (!Queue(self, frame)) return nullptr;
  Py_RETURN_NONE;
}

// ---- logs and capture ---------------------------------------------------------


// Queues encoded log frames. GIL held: the common case only appends under the
// leaf lock; a full queue is waited on with the GIL released.
void QueueLogsFromPython(const std::shared_ptr<Writer>& writer,
                         std::string& frames,
                         std::vector<StdioLine>* durable) {
  if (g_in_forked_child.load(std::memory_order_relaxed)) return;
  Writer& w = *writer;
  {
    std::unique_lock<std::mutex> lock(w.mu);
    EnsureSenderLocked(writer);
    if (w.failed || !w.sender_running) return;  // dropped
    if (w.logs.size() < kMaxQueuedLogBytes &&
        (durable == nullptr || !w.durable)) {
      w.logs.append(frames);
      const bool wake = TakeSenderWake(w);
      lock.unlock();
      if (wake) w.logs_cv.notify_one();
      return;
    }
  }
  Py_BEGIN_ALLOW_THREADS
  QueueLogs(w, frames, durable);
  Py_END_ALLOW_THREADS
}

// Copies a msgpack buffer argument (bytes or None) into `out`. GIL held.
bool OptionalBuffer(PyObject* object, std::string& out) {
  if (object == Py_None) return true;
  Py_buffer view;
  if (PyObject_GetBuffer(object, &view, PyBUF_CONTIG_RO) != 0) return false;
  out.assign(static_cast<const char*>(view.buf), static_cast<size_t>(view.len));
  PyBuffer_Release(&view);
  return true;
}

// Encodes `frame` and puts it on the log queue (see ChannelSendTrace for
// why side-channel frames do not go through `out`). GIL held.
bool QueueSideChannelFrame(PyObject* self, const ipc::Frame& frame) {
  std::string frames;
  absl::Status status = ipc::AppendFrame(frame, frames);
  if (!status.ok()) {
    SetError(PyExc_ValueError, status);
    return false;
  }
  QueueLogsFromPython(Channel(self).writer, frames, nullptr);
  return true;
}

// Like QueueSideChannelFrame, but when no write is in flight the calling
// thread writes the queued log frames and this one itself instead of waking
// the log sender thread: a namespace request's round trip waits on it (a
// thread wake-up is tens of microseconds here). Order is kept: queued
// records go first. GIL held on entry and exit.
bool SendSideChannelFrameNow(PyObject* self, const ipc::Frame& frame) {
  Writer& w = *Channel(self).writer;
  bool write_now = false;
  {
    std::lock_guard<std::mutex> lock(w.mu);
    // Otherwise a writer is busy (the frame queues behind it, as before), or
    // the queue's own rules apply (dropping after a failure, forked child).
    write_now = !w.busy && !w.failed && w.sender_running &&
                !g_in_forked_child.load(std::memory_order_relaxed);
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

PyObject* ChannelSendLog(PyObject* self, PyObject* const* args,
                         Py_ssize_t nargs) {
  if (!CheckArgs("send_log", nargs, 15)) return nullptr;
  ipc::Frame frame;
  frame.type = ipc::FrameType::kLog;
  ipc::LogEntry& log = frame.log;
  long long level = 0, time_ns = 0, line = 0, origin = 0;
  constexpr const char* kText = "backslashreplace";
  if (!ToUtf8(args[0], "logger", kText, log.logger) ||
      !ToInt(args[1], "level", level) ||
      !ToUtf8(args[2], "level_name", kText, log.level_name) ||
      !ToUtf8(args[3], "message", kText, log.message) ||
      !ToInt(args[4], "time_unix_nanos", time_ns) ||
      !ToUtf8(args[5], "file", kText, log.file) ||
      !ToInt(args[6], "line", line) ||
      !ToUtf8(args[7], "function", kText, log.function) ||
      !ToUtf8(args[8], "module", kText, log.module) ||
      !ToUtf8(args[9], "exception_text", kText, log.exception_text) ||
      !ToInt(args[10], "origin", origin) ||
      !ToUtf8(args[11], "call_id", "surrogateescape", log.call_id) ||
      !ToUtf8(args[12], "context", kText, log.context) ||
      !ToUtf8(args[14], "stack_info", kText, log.stack_info)) {
    return nullptr;
  }
  if (!OptionalBuffer(args[13], log.extras)) return nullptr;
  log.level = static_cast<int>(level);
  log.time_unix_nanos = time_ns;
  log.line = static_cast<int>(line);
  log.origin = static_cast<int>(origin);
  if (!QueueSideChannelFrame(self, frame)) return nullptr;
  Py_RETURN_NONE;
}

// One `trace` frame. It rides the log queue, not `out`: trace events come
// from any thread (like records), must stay ordered with the records around
// them and go out promptly, without the caller taking the channel.
PyObject* ChannelSendTrace(PyObject* self, PyObject* const* args,
                           Py_ssize_t nargs) {
  if (!CheckArgs("send_trace", nargs, 14)) return nullptr;
  ipc::Frame frame;
  frame.type = ipc::FrameType::kTrace;
  ipc::TraceEntry& t = frame.trace;
  long long kind = 0, start_ns = 0, end_ns = 0, status = 0;
  constexpr const char* kText = "backslashreplace";
  // Ids are generated by agentix.trace or given by user code: they must
  // reach the host unchanged, as call ids do.
  constexpr const char* kId = "surrogateescape";
  if (!ToInt(args[0], "kind", kind) ||
      !ToUtf8(args[1], "trace_id", kId, t.trace_id) ||
      !ToUtf8(args[2], "span_id", kId, t.span_id) ||
      !ToUtf8(args[3], "parent_id", kId, t.parent_id) ||
      !ToUtf8(args[4], "name", kText, t.name) ||
      !ToInt(args[5], "start_time_unix_nanos", start_ns) ||
      !ToInt(args[6], "end_time_unix_nanos", end_ns) ||
      !OptionalBuffer(args[7], t.attributes) ||
      !OptionalBuffer(args[8], t.events) ||
      !ToInt(args[9], "status", status) ||
      !ToUtf8(args[10], "status_description", kText, t.status_description) ||
      !ToUtf8(args[11], "error_message", kText, t.error_message) ||
      !OptionalBuffer(args[12], t.error_data) ||
      !ToUtf8(args[13], "call_id", kId, t.call_id)) {
    return nullptr;
  }
  if (kind < 1 || kind > 4) {
    PyErr_SetString(PyExc_ValueError, "kind must be 1..4 (TraceEventKind)");
    return nullptr;
  }
  if (status < 0 || status > 2) {
    PyErr_SetString(PyExc_ValueError, "status must be 0..2 (SpanStatusCode)");
    return nullptr;
  }
  t.kind = static_cast<int>(kind);
  t.start_time_unix_nanos = start_ns;
  t.end_time_unix_nanos = end_ns;
  t.status = static_cast<int>(status);
  if (!QueueSideChannelFrame(self, frame)) return nullptr;
  Py_RETURN_NONE;
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
  if (!SendSideChannelFrameNow(self, frame)) return nullptr;
  Py_RETURN_NONE;
}

PyObject* ChannelSendStdio(PyObject* self, PyObject* const* args,
                           Py_ssize_t nargs) {
  if (!CheckArgs("send_stdio", nargs, 3)) return nullptr;
  long long origin = 0;
  std::string text;
  std::string call_id;
  if (!ToInt(args[0], "origin", origin) ||
      !ToUtf8(args[1], "text", "backslashreplace", text) ||
      !ToUtf8(args[2], "call_id", "surrogateescape", call_id)) {
    return nullptr;
  }
  if (origin != kOriginStdout && origin != kOriginStderr) {
    PyErr_SetString(PyExc_ValueError, "origin must be 2 (stdout) or 3");
    return nullptr;
  }
  const std::shared_ptr<Writer>& writer = Channel(self).writer;
  std::vector<StdioLine> lines(1);
  lines[0].origin = static_cast<int>(origin);
  lines[0].time_unix_nanos = NowUnixNanos();
  std::string frames;
  absl::Status status =
      AppendStdioFrame(*writer, lines[0].origin, lines[0].time_unix_nanos,
                       text, call_id, frames);
  if (!status.ok()) {
    SetError(PyExc_ValueError, status);
    return nullptr;
  }
  lines[0].text = std::move(text);
  QueueLogsFromPython(writer, frames, &lines);
  Py_RETURN_NONE;
}

// Restores fds 0..2 and ends the drainers (bounded). No GIL: touches no
// Python.
void StopCapture(ChannelState& st, int timeout_ms) {
  Capture* capture = st.capture.get();
  if (capture == nullptr || capture->stopped) return;
  capture->stopped = true;
  Writer& w = *st.writer;
  w.capturing.store(false, std::memory_order_release);
  // Closing our write ends (fds 1 and 2) gives the drainers EOF once every
  // child that inherited them is gone too.
  const int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull >= 0) {
    ::dup2(devnull, 1);
    ::close(devnull);
  }
  g_diag_fd.store(-1);
  ::dup2(capture->saved_stderr, 2);
  ::close(capture->saved_stderr);
  capture->saved_stderr = -1;
  bool drained = false;
  {
    std::unique_lock<std::mutex> lock(w.mu);
    drained = w.drainers_cv.wait_for(lock,
                                     std::chrono::milliseconds(timeout_ms),
                                     [&w] { return w.drainers == 0; });
    w.capture_done = true;
    w.durable_cv.notify_all();
  }
  for (std::thread& t : capture->drainers) {
    // A child still holding a pipe keeps its drainer reading: abandoned, it
    // owns the Writer it uses.
    if (drained) {
      t.join();
    } else {
      t.detach();
    }
  }
  capture->drainers.clear();
  if (!drained) {
    DiagLine(base::LogSeverity::kWarning,
             "captured output still open after shutdown (a child process "
             "holds stdout/stderr); its later lines are lost");
  }
}

PyObject* ChannelStartCapture(PyObject* self, PyObject* const* args,
                              Py_ssize_t nargs) {
  if (!CheckArgs("start_capture", nargs, 2)) return nullptr;
  std::string worker_id;
  std::string context;
  if (!ToUtf8(args[0], "worker_id", "backslashreplace", worker_id) ||
      !ToUtf8(args[1], "context", "backslashreplace", context)) {
    return nullptr;
  }
  ChannelState& st = Channel(self);
  if (st.capture != nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "stdio capture already started");
    return nullptr;
  }
  Writer& w = *st.writer;
  w.context = context;
  w.stdout_extras = StdioExtras("stdout", worker_id);
  w.stderr_extras = StdioExtras("stderr", worker_id);
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    return PyErr_SetFromErrno(PyExc_OSError);
  }
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    PyErr_SetFromErrno(PyExc_OSError);
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    return nullptr;
  }
  // The worker's own diagnostics keep the real stderr (/dev/null if it had
  // none). CLOEXEC: children see only the capture pipes.
  int saved = ::fcntl(2, F_DUPFD_CLOEXEC, 3);
  if (saved < 0) saved = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (saved < 0) {
    PyErr_SetFromErrno(PyExc_OSError);
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) {
      ::close(fd);
    }
    return nullptr;
  }
  auto capture = std::make_unique<Capture>();
  capture->saved_stderr = saved;
  if (g_diag_tag == nullptr) {
    g_diag_tag = new std::string("agentix-worker[" + worker_id + "]");
  }
  g_diag_fd.store(saved);
  // Children must not read what the daemon's stdin holds.
  const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull >= 0) {
    ::dup2(devnull, 0);
    ::close(devnull);
  }
  // dup2 clears FD_CLOEXEC on 1 and 2: children inherit the write ends.
  ::dup2(out_pipe[1], 1);
  ::dup2(err_pipe[1], 2);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  {
    std::lock_guard<std::mutex> lock(w.mu);
    EnsureSenderLocked(st.writer);
    w.drainers = 2;
  }
  const int read_ends[2] = {out_pipe[0], err_pipe[0]};
  for (int i = 0; i < 2; ++i) {
    CapturePipe& pipe = w.pipes[i];
    std::lock_guard<std::mutex> lock(pipe.mu);
    pipe.origin = i == 0 ? kOriginStdout : kOriginStderr;
    pipe.buffer.reset(new char[kMaxLineBytes]);
    const int flags = ::fcntl(read_ends[i], F_GETFL);
    ::fcntl(read_ends[i], F_SETFL, flags | O_NONBLOCK);
    pipe.fd = read_ends[i];
  }
  st.capture = std::move(capture);
  for (int i = 0; i < 2; ++i) {
    try {
      st.capture->drainers.emplace_back(Drain, st.writer, i);
    } catch (const std::exception&) {
      std::lock_guard<std::mutex> pipe_lock(w.pipes[i].mu);
      ::close(w.pipes[i].fd);
      w.pipes[i].fd = -1;
      std::lock_guard<std::mutex> lock(w.mu);
      --w.drainers;
    }
  }
  w.capturing.store(true, std::memory_order_release);
  if (st.capture->drainers.size() != 2) {
    // Without a drainer a pipe would fill and block its writers for good.
    Py_BEGIN_ALLOW_THREADS
    StopCapture(st, 1000);
    Py_END_ALLOW_THREADS
    PyErr_SetString(PyExc_RuntimeError, "cannot start the capture threads");
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* ChannelStopCapture(PyObject* self, PyObject* arg) {
  long long timeout_ms = 0;
  if (!ToInt(arg, "timeout_ms", timeout_ms)) return nullptr;
  ChannelState& st = Channel(self);
  const int ms = static_cast<int>(std::max(0LL, std::min(timeout_ms, 60000LL)));
  Py_BEGIN_ALLOW_THREADS
  const auto start = std::chrono::steady_clock::now();
  StopCapture(st, ms);
  const auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  StopSender(st.writer,
             std::max(100, ms - static_cast<int>(spent.count())));
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

PyObject* ChannelSetDurable(PyObject* self, PyObject* arg) {
  const int enabled = PyObject_IsTrue(arg);
  if (enabled < 0) return nullptr;
  Writer& w = *Channel(self).writer;
  std::lock_guard<std::mutex> lock(w.mu);
  w.durable = enabled != 0;
  if (!w.durable) {
    w.durable_lines.clear();
    w.durable_bytes = 0;
  }
  w.durable_cv.notify_all();
  Py_RETURN_NONE;
}

PyObject* ChannelWaitStdioLines(PyObject* self, PyObject* /*unused*/) {
  std::shared_ptr<Writer> writer = Channel(self).writer;
  Writer& w = *writer;
  std::deque<StdioLine> lines;
  Py_BEGIN_ALLOW_THREADS
  {
    std::unique_lock<std::mutex> lock(w.mu);
    w.durable_cv.wait(lock, [&w] {
      return !w.durable_lines.empty() || w.capture_done || !w.durable;
    });
    lines.swap(w.durable_lines);
    w.durable_bytes = 0;
  }
  Py_END_ALLOW_THREADS
  if (lines.empty()) Py_RETURN_NONE;
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(lines.size()));
  if (list == nullptr) return nullptr;
  Py_ssize_t i = 0;
  for (const StdioLine& line : lines) {
    PyObject* tuple =
        Tuple({PyLong_FromLong(line.origin),
               PyLong_FromLongLong(line.time_unix_nanos),
               PyUnicode_DecodeUTF8(line.text.data(),
                                    static_cast<Py_ssize_t>(line.text.size()),
                                    "replace")});
    if (tuple == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, i++, tuple);
  }
  return list;
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
    {"send_env_set", Fast<ChannelSendEnvSet>(), METH_FASTCALL,
     "send_env_set(detail): answers set_env ('' = applied)"},
    {"send_result", Fast<ChannelSendResult>(), METH_FASTCALL,
     "send_result(call_id, encoding, data)"},
    {"send_item", Fast<ChannelSendItem>(), METH_FASTCALL,
     "send_item(call_id, index, encoding, data)"},
    {"send_error", Fast<ChannelSendError>(), METH_FASTCALL,
     "send_error(call_id, code, type, message, traceback, cancelled"
     "[, type_module, type_qualname, state])"},
    {"send_log", Fast<ChannelSendLog>(), METH_FASTCALL,
     "send_log(logger, level, level_name, message, time_unix_nanos, file, "
     "line, function, module, exception_text, origin, call_id, context, "
     "extras, stack_info)"},
    {"send_trace", Fast<ChannelSendTrace>(), METH_FASTCALL,
     "send_trace(kind, trace_id, span_id, parent_id, name, start_time_unix_"
     "nanos, end_time_unix_nanos, attributes, events, status, "
     "status_description, error_message, error_data, call_id): one `trace` "
     "frame, queued with the log frames"},
    {"send_ns_event", Fast<ChannelSendNamespaceEvent>(), METH_FASTCALL,
     "send_ns_event(namespace, event, data, request_id, error_type, "
     "error_message, status_code): a plugin-namespace event for the hosts."},
    {"send_stdio", Fast<ChannelSendStdio>(), METH_FASTCALL,
     "send_stdio(origin, text, call_id): one captured line"},
    {"start_capture", Fast<ChannelStartCapture>(), METH_FASTCALL,
     "start_capture(worker_id, context)"},
    {"stop_capture", Guarded<ChannelStopCapture>, METH_O,
     "stop_capture(timeout_ms)"},
    {"set_durable", Guarded<ChannelSetDurable>, METH_O,
     "set_durable(enabled): queue captured lines for wait_stdio_lines()"},
    {"wait_stdio_lines", Guarded<ChannelWaitStdioLines>, METH_NOARGS,
     "Captured lines for the durable log; None once capture ended."},
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
      DiagLine(severity, message);
    } catch (const std::exception&) {
      // Logging must never fail a call.
    }
  }
  Py_RETURN_NONE;
}

// The fd of the worker's original stderr (the daemon reads it; crash reports
// belong there), or 2 before capture started.
PyObject* DiagnosticFd(PyObject* /*module*/, PyObject* /*unused*/) {
  const int fd = g_diag_fd.load();
  return PyLong_FromLong(fd < 0 ? 2 : fd);
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
    {"diagnostic_fd", DiagnosticFd, METH_NOARGS,
     "The fd of the worker's original stderr (the daemon's diagnostics)."},
    {"set_thread_name", Guarded<SetThreadName>, METH_O,
     "Sets the calling OS thread's name (as shown by ps/top)."},
    {nullptr, nullptr, 0, nullptr},
};

int AddInt(PyObject* module, const char* name, long value) {
  return PyModule_AddIntConstant(module, name, value);
}

int ExecModule(PyObject* module) {
  static std::once_flag atfork_once;
  std::call_once(atfork_once, [] {
    pthread_atfork(nullptr, nullptr, [] { g_in_forked_child.store(true); });
  });
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
      AddInt(module, "ARGS", kArgs) < 0 ||
      AddInt(module, "CANCEL", kCancel) < 0 ||
      AddInt(module, "SHUTDOWN", kShutdown) < 0 ||
      AddInt(module, "STREAM_ACK", kStreamAck) < 0 ||
      AddInt(module, "NS_EVENT", kNamespaceEvent) < 0 ||
      AddInt(module, "SET_ENV", kSetEnv) < 0 ||
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
