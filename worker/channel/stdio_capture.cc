#include "worker/channel/stdio_capture.h"

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <msgpack.hpp>
#include <mutex>
#include <utility>

#include "agentix/runtime/v1/runtime.pb.h"
#include "base/utf8.h"
#include "worker/channel/diagnostics.h"
#include "worker/channel/log_sender.h"
#include "worker/ipc/frame.h"

namespace agentix::worker {

// The read end of one capture pipe (fd 1 or fd 2). Its drainer thread reads
// it, and so does a thread about to write a call's result (CatchUp):
// whoever holds `mu` reads what the pipe holds and queues its lines, so
// once a thread has taken `mu` and found the pipe empty, every line written
// before is on the log queue. Lock order: `mu` before Writer::mu; nobody
// waits for it while holding the GIL.
struct CapturePipe {
  std::mutex mu;
  int fd = -1;  // non-blocking; -1 when capture is off or the drainer ended
  int origin = kOriginStdout;
  std::string pending;  // bytes of the current, unfinished line
  std::unique_ptr<char[]> buffer;
};

struct StdioCapture::Shared {
  std::shared_ptr<Writer> writer;
  std::shared_ptr<DurableLog> durable;
  CapturePipe pipes[2];
  // Level-triggered epoll over both read ends (data: the pipe's index), or
  // -1: CatchUp asks it whether either pipe holds bytes with one
  // epoll_wait(0), which costs about half a poll() of both (PERFORMANCE.md,
  // stop-41, h-stdio); the check every direct reply pays.
  int ready_fd = -1;
  std::atomic<bool> capturing{false};
  // Drainer threads still reading.
  std::mutex mu;  // a leaf
  int drainers = 0;
  std::condition_variable drainers_cv;
  // What stdout/stderr log frames carry (set before the drainers start).
  std::string context;
  std::string stdout_extras;
  std::string stderr_extras;

  ~Shared() {
    if (ready_fd >= 0) ::close(ready_fd);
  }
};

namespace {

int64_t NowUnixNanos() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
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

}  // namespace

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

namespace {

// Encodes the log frame of one captured line (text already valid UTF-8).
absl::Status AppendStdioFrame(const StdioCapture::Shared& s, int origin,
                              int64_t time_ns, const std::string& text,
                              const std::string& call_id, std::string& out,
                              uint64_t direct_conn = 0) {
  runtime::v1::LogRecord log;
  const bool is_stdout = origin == kOriginStdout;
  log.set_logger(is_stdout ? "agentix.sandbox.stdout"
                           : "agentix.sandbox.stderr");
  log.set_level(20);
  log.set_level_name("INFO");
  log.set_message(text);
  log.set_time_unix_nanos(time_ns);
  log.set_module("stdio");
  log.set_origin(static_cast<runtime::v1::LogOrigin>(origin));
  log.set_call_id(call_id);
  log.set_context(s.context);
  log.set_extras(is_stdout ? s.stdout_extras : s.stderr_extras);
  ipc::Frame frame;
  frame.type = ipc::FrameType::kLog;
  frame.direct_conn.conn = direct_conn;
  log.SerializeToString(&frame.record);
  return ipc::AppendFrame(frame, out);
}

// Queues a drainer's frames, and their lines for the durable log if they
// were not dropped. No GIL.
void QueueLines(StdioCapture::Shared& s, std::string& frames,
                std::vector<StdioLine>& lines) {
  if (QueueLogs(*s.writer, frames)) s.durable->Offer(lines);
  // fd-level output names no call: a direct call running meanwhile asks
  // for the daemon's barrier (docs/DIRECT-CALLS.md, stage 5).
  s.writer->untagged_records.fetch_add(1, std::memory_order_release);
}

// With `p.mu` held and without the GIL: reads what pipe `p` holds (it is
// non-blocking), turns each complete line into a log frame and queues them.
// Returns false at EOF or on a read error; `at_eof_flushes` also sends the
// unfinished line.
bool ReadAvailable(StdioCapture::Shared& s, CapturePipe& p,
                   bool at_eof_flushes) {
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
        AppendStdioFrame(s, origin, now, line.text, no_call_id, frames);
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
      QueueLines(s, frames, lines);
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
  if (!frames.empty()) QueueLines(s, frames, lines);
  return open;
}

}  // namespace

StdioCapture::StdioCapture(std::shared_ptr<Writer> writer,
                           std::shared_ptr<DurableLog> durable)
    : shared_(std::make_shared<Shared>()) {
  shared_->writer = std::move(writer);
  shared_->durable = std::move(durable);
}

StdioCapture::~StdioCapture() { Stop(1000); }

// A drainer thread: reads one capture pipe until EOF and turns each line into
// a log frame. It never takes the GIL, so a full pipe cannot wait on Python.
void StdioCapture::Drain(std::shared_ptr<Shared> shared, int index) {
  Shared& s = *shared;
  CapturePipe& p = s.pipes[index];
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
    if (!ReadAvailable(s, p, /*at_eof_flushes=*/true)) {
      ::close(p.fd);
      p.fd = -1;
      break;
    }
  }
  std::lock_guard<std::mutex> lock(s.mu);
  --s.drainers;
  s.drainers_cv.notify_all();
}

absl::Status StdioCapture::Start(const std::string& worker_id,
                                 const std::string& context) {
  Shared& s = *shared_;
  s.context = context;
  s.stdout_extras = StdioExtras("stdout", worker_id);
  s.stderr_extras = StdioExtras("stderr", worker_id);
  auto os_error = [](const char* what) {
    return absl::UnavailableError(
        std::string(what) + ": " + std::strerror(errno));
  };
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) return os_error("pipe2");
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    absl::Status status = os_error("pipe2");
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    return status;
  }
  // The worker's own diagnostics keep the real stderr (/dev/null if it had
  // none). CLOEXEC: children see only the capture pipes.
  int saved = ::fcntl(2, F_DUPFD_CLOEXEC, 3);
  if (saved < 0) saved = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (saved < 0) {
    absl::Status status = os_error("open /dev/null");
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) {
      ::close(fd);
    }
    return status;
  }
  started_ = true;
  saved_stderr_ = saved;
  SetDiagnosticFd(saved, worker_id);
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
    std::lock_guard<std::mutex> lock(s.writer->mu);
    EnsureSenderLocked(s.writer);
  }
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.drainers = 2;
  }
  const int read_ends[2] = {out_pipe[0], err_pipe[0]};
  for (int i = 0; i < 2; ++i) {
    CapturePipe& pipe = s.pipes[i];
    std::lock_guard<std::mutex> lock(pipe.mu);
    pipe.origin = i == 0 ? kOriginStdout : kOriginStderr;
    pipe.buffer.reset(new char[kMaxLineBytes]);
    const int flags = ::fcntl(read_ends[i], F_GETFL);
    ::fcntl(read_ends[i], F_SETFL, flags | O_NONBLOCK);
    pipe.fd = read_ends[i];
  }
  // Without it CatchUp polls the pipes instead.
  s.ready_fd = ::epoll_create1(EPOLL_CLOEXEC);
  for (int i = 0; i < 2 && s.ready_fd >= 0; ++i) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u32 = static_cast<uint32_t>(i);
    if (::epoll_ctl(s.ready_fd, EPOLL_CTL_ADD, read_ends[i], &event) != 0) {
      ::close(s.ready_fd);
      s.ready_fd = -1;
    }
  }
  for (int i = 0; i < 2; ++i) {
    try {
      drainers_.emplace_back(Drain, shared_, i);
    } catch (const std::exception&) {
      std::lock_guard<std::mutex> pipe_lock(s.pipes[i].mu);
      ::close(s.pipes[i].fd);
      s.pipes[i].fd = -1;
      std::lock_guard<std::mutex> lock(s.mu);
      --s.drainers;
    }
  }
  s.capturing.store(true, std::memory_order_release);
  if (drainers_.size() != 2) {
    // Without a drainer a pipe would fill and block its writers for good.
    return absl::InternalError("cannot start the capture threads");
  }
  return absl::OkStatus();
}

void StdioCapture::Stop(int timeout_ms) {
  if (!started_ || stopped_) return;
  stopped_ = true;
  Shared& s = *shared_;
  s.capturing.store(false, std::memory_order_release);
  // Closing our write ends (fds 1 and 2) gives the drainers EOF once every
  // child that inherited them is gone too.
  const int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull >= 0) {
    ::dup2(devnull, 1);
    ::close(devnull);
  }
  SetDiagnosticFd(-1, "");
  ::dup2(saved_stderr_, 2);
  ::close(saved_stderr_);
  saved_stderr_ = -1;
  bool drained = false;
  {
    std::unique_lock<std::mutex> lock(s.mu);
    drained = s.drainers_cv.wait_for(lock,
                                     std::chrono::milliseconds(timeout_ms),
                                     [&s] { return s.drainers == 0; });
  }
  s.durable->Finish();
  for (std::thread& t : drainers_) {
    // A child still holding a pipe keeps its drainer reading: abandoned, it
    // owns the state it uses.
    if (drained) {
      t.join();
    } else {
      t.detach();
    }
  }
  drainers_.clear();
  if (!drained) {
    DiagLine(base::LogSeverity::kWarning,
             "captured output still open after shutdown (a child process "
             "holds stdout/stderr); its later lines are lost");
  }
}

bool StdioCapture::CatchUp() {
  Shared& s = *shared_;
  if (!s.capturing.load(std::memory_order_acquire) || InForkedChild()) {
    return false;
  }
  bool released = false;
  std::unique_lock<std::mutex> locks[2];
  for (int i = 0; i < 2; ++i) {
    locks[i] = std::unique_lock<std::mutex>(s.pipes[i].mu, std::try_to_lock);
    if (!locks[i].owns_lock()) {
      // A drainer is queueing lines (its lock is only ever held without the
      // GIL): wait for it with the GIL released.
      released = true;
      Py_BEGIN_ALLOW_THREADS
      locks[i].lock();
      Py_END_ALLOW_THREADS
    }
  }
  // With both locks held no drainer is between a read and its queueing, so
  // pipes that hold no bytes now have every earlier line queued.
  bool ready[2] = {false, false};
  if (s.ready_fd >= 0) {
    epoll_event events[2];
    int n;
    do {
      n = ::epoll_wait(s.ready_fd, events, 2, 0);
    } while (n < 0 && errno == EINTR);
    for (int k = 0; k < n; ++k) ready[events[k].data.u32 & 1] = true;
  } else {
    pollfd fds[2];
    int count = 0;
    int which[2];
    for (int i = 0; i < 2; ++i) {
      if (s.pipes[i].fd < 0) continue;
      fds[count] = pollfd{s.pipes[i].fd, POLLIN, 0};
      which[count++] = i;
    }
    if (count > 0 && ::poll(fds, count, 0) > 0) {
      for (int k = 0; k < count; ++k) {
        if (fds[k].revents & POLLIN) ready[which[k]] = true;
      }
    }
  }
  if (!ready[0] && !ready[1]) return released;
  Py_BEGIN_ALLOW_THREADS
  for (int i = 0; i < 2; ++i) {
    // A pipe the drainer closed at EOF left the epoll set with it.
    if (ready[i] && s.pipes[i].fd >= 0) {
      ReadAvailable(s, s.pipes[i], /*at_eof_flushes=*/false);
    }
  }
  Py_END_ALLOW_THREADS
  return true;
}

absl::Status StdioCapture::SendLine(int origin, uint64_t direct_conn,
                                    std::string text,
                                    const std::string& call_id) {
  std::vector<StdioLine> lines(1);
  lines[0].origin = origin;
  lines[0].time_unix_nanos = NowUnixNanos();
  std::string frames;
  absl::Status status = AppendStdioFrame(*shared_, origin,
                                         lines[0].time_unix_nanos, text,
                                         call_id, frames, direct_conn);
  if (!status.ok()) return status;
  lines[0].text = std::move(text);
  if (QueueLogsFromPython(shared_->writer, frames)) {
    shared_->durable->Offer(lines);
  }
  return absl::OkStatus();
}

}  // namespace agentix::worker
