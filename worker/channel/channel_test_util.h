// Shared by the `_agentix_worker` tests (worker/channel/*_test.cc): an
// interpreter with the module registered, one end of a socketpair handed to
// a Channel, the other end spoken to with //worker/ipc from C++.
#pragma once
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "testing/status_matchers.h"
#include "worker/channel_module.h"
#include "worker/ipc/frame.h"
#include "worker/ipc/io.h"
#include "worker/ipc/payload_area.h"
#include "worker/python/py_error.h"
#include "worker/python/test_interpreter.h"

namespace agentix::worker {

inline void EnsureChannelInterpreter() {
  if (Py_IsInitialized()) return;
  signal(SIGPIPE, SIG_IGN);  // as worker_main does: EPIPE, not death
  REQUIRE_OK(RegisterChannelModule());
  testing::EnsureInterpreter();
  testing::RunPython("import _agentix_worker as w\n");
}

// Runs Python source; on failure reports the exception.
inline void Py(const std::string& source) {
  EnsureChannelInterpreter();
  PyObject* main = PyImport_AddModule("__main__");
  PyObject* globals = PyModule_GetDict(main);
  PyObject* result =
      PyRun_String(source.c_str(), Py_file_input, globals, globals);
  if (result == nullptr) {
    PythonError error = FetchPythonError();
    FAIL(error.type << ": " << error.message << "\n" << error.traceback);
  }
  Py_DECREF(result);
}

// str() of a Python expression's value.
inline std::string PyEval(const std::string& expression) {
  PyObject* value = testing::EvalPython(expression.c_str());
  if (value == nullptr) {
    PythonError error = FetchPythonError();
    FAIL(error.type << ": " << error.message << "\n" << error.traceback);
  }
  PyObject* str = PyObject_Str(value);
  Py_DECREF(value);
  std::string out = PyUnicode_AsUTF8(str);
  Py_DECREF(str);
  return out;
}

// Runs a Python statement that should raise `exception` (a Python
// expression naming the type): its str(), or kNoError when nothing was
// raised. Any other exception fails the test.
constexpr char kNoError[] = "<no error>";

inline std::string Raised(const std::string& statement, const std::string& exception) {
  Py("try:\n    " + statement + "\n    outcome = None\nexcept " + exception +
     " as e:\n    outcome = str(e)\n");
  return PyEval("outcome") == "None" ? kNoError : PyEval("outcome");
}

// A socketpair: `worker` goes to a Channel, `peer` stays in C++.
struct Pair {
  Pair() {
    int fds[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    worker = fds[0];
    peer = fds[1];
    Py(absl::StrCat("ch = w.Channel(", worker, ")\n"));
  }
  ~Pair() {
    Py("del ch\n");
    if (worker >= 0) close(worker);
    if (peer >= 0) close(peer);
  }
  void Send(const ipc::Frame& frame) {
    std::string bytes;
    REQUIRE_OK(ipc::AppendFrame(frame, bytes));
    REQUIRE_OK(ipc::WriteAll(peer, bytes));
  }
  void SendRaw(const std::string& bytes) {
    REQUIRE_OK(ipc::WriteAll(peer, bytes));
  }
  int worker = -1;
  int peer = -1;
};

// Collects every frame arriving on `fd` on a thread of its own, so that the
// worker side can write more than the socket buffer holds.
class FrameCollector {
 public:
  explicit FrameCollector(int fd) : fd_(fd) {
    thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "test-collector");
      Run();
    });
  }
  ~FrameCollector() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  // Waits until `n` frames arrived (or `timeout`); returns those received.
  std::vector<ipc::Frame> Wait(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return frames_.size() >= n || failed_;
    };
    mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
    return frames_;
  }

 private:
  void Run() {
    ipc::FrameReader reader;
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (stop_) return;
      }
      pollfd pfd{fd_, POLLIN, 0};
      if (poll(&pfd, 1, 20) <= 0) continue;
      auto n = ipc::ReadInto(fd_, reader);
      if (!n.ok() || *n == 0) break;
      while (true) {
        auto next = reader.Next();
        if (!next.ok() || !next->has_value()) {
          if (!next.ok()) {
            absl::MutexLock lock(&mu_);
            failed_ = true;
          }
          break;
        }
        absl::MutexLock lock(&mu_);
        frames_.push_back(std::move(**next));
      }
    }
    absl::MutexLock lock(&mu_);
    failed_ = true;
  }

  const int fd_;
  std::thread thread_;
  absl::Mutex mu_;
  std::vector<ipc::Frame> frames_ ABSL_GUARDED_BY(mu_);
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

// Reads every frame the channel has now (the peer wrote them all already),
// each frame record as a plain tuple of its items.
inline std::string ReadAll() {
  return PyEval(
      "repr([None if fs is None else [tuple(f) for f in fs]"
      " for fs in [ch.read_frames() for _ in range(4)]])");
}

inline ipc::Frame CallFrame(const std::string& id, const std::string& first,
                     uint64_t total) {
  ipc::Frame call;
  call.type = ipc::FrameType::kCall;
  call.call_id = id;
  call.callable = "m::f";
  call.encoding = 1;
  call.data = first;
  call.total_size = total;
  return call;
}

inline ipc::Frame ChunkFrame(const std::string& id, const std::string& data) {
  ipc::Frame chunk;
  chunk.type = ipc::FrameType::kArgChunk;
  chunk.call_id = id;
  chunk.data = data;
  return chunk;
}

// A Pair whose Channel also maps a payload area; `daemon` is the peer's
// side of it.
struct RingPair : Pair {
  explicit RingPair(size_t ring_bytes) {
    auto area = ipc::PayloadArea::Create(ring_bytes);
    REQUIRE(area.ok());
    daemon = std::move(*area);
    // The Channel closes the fd it is given; the daemon keeps its own.
    Py(absl::StrCat("ch = w.Channel(", worker, ", ", dup(daemon->fd()), ")\n"));
  }
  // The frame for `piece`, in the ring when it fits.
  ipc::Frame Place(ipc::Frame frame, const std::string& piece) {
    auto pos = daemon->Put(piece);
    if (pos) {
      frame.in_ring = true;
      frame.ring_pos = *pos;
      frame.ring_size = piece.size();
      frame.data.clear();
    } else {
      frame.data = piece;
    }
    return frame;
  }
  std::unique_ptr<ipc::PayloadArea> daemon;
};

// Reads raw bytes from `fd` until they end with `tail` (or 20 s passed).
inline std::string ReadUntilEnd(int fd, const std::string& tail) {
  std::string got;
  char buffer[65536];
  while (got.size() < tail.size() ||
         got.compare(got.size() - tail.size(), tail.size(), tail) != 0) {
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, 20000) <= 0) break;
    const ssize_t n = read(fd, buffer, sizeof buffer);
    if (n <= 0) break;
    got.append(buffer, static_cast<size_t>(n));
  }
  return got;
}

}  // namespace agentix::worker
