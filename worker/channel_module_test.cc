// Tests the `_agentix_worker` module in-process: an interpreter with the
// module registered, one end of a socketpair handed to a Channel, the other
// end spoken to with //worker/ipc from C++.
#include "worker/channel_module.h"

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
#include "worker/ipc/frame.h"
#include "worker/ipc/io.h"
#include "worker/ipc/payload_area.h"
#include "worker/python/py_error.h"
#include "worker/python/test_interpreter.h"

namespace agentix::worker {
namespace {

void EnsureChannelInterpreter() {
  if (Py_IsInitialized()) return;
  signal(SIGPIPE, SIG_IGN);  // as worker_main does: EPIPE, not death
  REQUIRE_OK(RegisterChannelModule());
  testing::EnsureInterpreter();
  testing::RunPython("import _agentix_worker as w\n");
}

// Runs Python source; on failure reports the exception.
void Py(const std::string& source) {
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
std::string PyEval(const std::string& expression) {
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
std::string Raised(const std::string& statement, const std::string& exception) {
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

TEST_CASE("read_frames decodes every daemon frame", "[channel]") {
  Pair pair;
  REQUIRE(PyEval("ch.read_frames()") == "[]");

  ipc::Frame call;
  call.type = ipc::FrameType::kCall;
  call.call_id = "c1";
  call.callable = "math::factorial";
  call.encoding = 1;
  call.data = std::string("\x80\x05\x00", 3);
  call.total_size = 7;
  call.context = "ctx";
  call.stream_window = 16;
  pair.Send(call);
  ipc::Frame chunk;
  chunk.type = ipc::FrameType::kArgChunk;
  chunk.call_id = "c1";
  chunk.data = "rest";
  pair.Send(chunk);
  ipc::Frame cancel;
  cancel.type = ipc::FrameType::kCancel;
  cancel.call_id = "c1";
  pair.Send(cancel);
  ipc::Frame ack;
  ack.type = ipc::FrameType::kStreamAck;
  ack.call_id = "c1";
  ack.index = 5000000000;  // beyond 32 bits
  pair.Send(ack);
  ipc::Frame shutdown;
  shutdown.type = ipc::FrameType::kShutdown;
  pair.Send(shutdown);

  Py("frames = ch.read_frames()\n");
  REQUIRE(PyEval("len(frames)") == "5");
  // The short first piece makes the channel assemble the arguments.
  REQUIRE(PyEval("frames[0] == (w.CALL, 'c1', 'math::factorial', 1, "
                 "None, 7, b'ctx', 16)") == "True");
  REQUIRE(PyEval("frames[1] == (w.ARGS, 'c1', b'\\x80\\x05\\x00rest', 7)") ==
          "True");
  REQUIRE(PyEval("frames[2] == (w.CANCEL, 'c1')") == "True");
  REQUIRE(PyEval("frames[3] == (w.STREAM_ACK, 'c1', 5000000000)") == "True");
  REQUIRE(PyEval("frames[4] == (w.SHUTDOWN,)") == "True");
  REQUIRE(PyEval("ch.read_frames()") == "[]");

  // A frame split across reads is held until complete.
  std::string bytes;
  REQUIRE_OK(ipc::AppendFrame(cancel, bytes));
  pair.SendRaw(bytes.substr(0, 5));
  REQUIRE(PyEval("ch.read_frames()") == "[]");
  pair.SendRaw(bytes.substr(5));
  REQUIRE(PyEval("ch.read_frames() == [(w.CANCEL, 'c1')]") == "True");

  // End of stream: None from then on.
  close(pair.peer);
  pair.peer = -1;
  REQUIRE(PyEval("ch.read_frames()") == "None");
  REQUIRE(PyEval("ch.read_frames()") == "None");
}

TEST_CASE("Non-UTF-8 call ids round-trip", "[channel]") {
  Pair pair;
  ipc::Frame cancel;
  cancel.type = ipc::FrameType::kCancel;
  cancel.call_id = "id\xff";
  pair.Send(cancel);
  Py("cid = ch.read_frames()[0][1]\n"
     "ch.send_error(cid, 1, 'Cancelled', 'm', '', True)\n"
     "ch.flush()\n");
  FrameCollector collector(pair.peer);
  auto frames = collector.Wait(1, absl::Seconds(5));
  REQUIRE(frames.size() == 1);
  REQUIRE(frames[0].call_id == "id\xff");
}

TEST_CASE("A garbage frame makes the channel dead", "[channel]") {
  Pair pair;
  pair.SendRaw(std::string("\x03\x00\x00\x00\xc1\xc1\xc1", 7));
  REQUIRE(Raised("ch.read_frames()", "w.ProtocolError") != kNoError);
  // Later reads keep failing even if valid bytes follow.
  ipc::Frame shutdown;
  shutdown.type = ipc::FrameType::kShutdown;
  pair.Send(shutdown);
  REQUIRE(Raised("ch.read_frames()", "w.ProtocolError") != kNoError);
}

TEST_CASE("Worker-to-daemon frames from the daemon are protocol errors",
          "[channel]") {
  Pair pair;
  ipc::Frame result;
  result.type = ipc::FrameType::kResult;
  result.call_id = "x";
  pair.Send(result);
  REQUIRE(Raised("ch.read_frames()", "w.ProtocolError") ==
          "unexpected 'result' frame from the daemon");
}

TEST_CASE("Oversized frame lengths are refused before reading the body",
          "[channel]") {
  Pair pair;
  pair.SendRaw(std::string("\xff\xff\xff\x7f", 4));
  REQUIRE(Raised("ch.read_frames()", "w.ProtocolError").find("exceeds") !=
          std::string::npos);
}

TEST_CASE("send_error carries an exception's class and bounded state",
          "[channel]") {
  Pair pair;
  FrameCollector collector(pair.peer);
  Py("ch.send_error('a', 2, 'KeyError', \"'k'\", 'tb', False, 'builtins',\n"
     "              'KeyError', b'\\x80\\x04state')\n"
     "ch.send_error('b', 2, 'ValueError', 'big', '', False, 'builtins',\n"
     "              'ValueError', b'x' * (64 * 1024 + 1))\n"
     "ch.send_error('c', 2, 'E', 'm', '', False, 'mod', 'E', None)\n"
     "try:\n"
     "    ch.send_error('d', 2, 'E', 'm', '', False, 'mod')\n"
     "except TypeError:\n"
     "    pass\n"
     "else:\n"
     "    raise AssertionError('7 arguments accepted')\n"
     "ch.flush()\n");
  auto frames = collector.Wait(3, absl::Seconds(5));
  REQUIRE(frames.size() == 3);
  REQUIRE(frames[0].error.type_module == "builtins");
  REQUIRE(frames[0].error.type_qualname == "KeyError");
  REQUIRE(frames[0].error.state == "\x80\x04state");
  // Over the bound: dropped, the error itself still sent.
  REQUIRE(frames[1].call_id == "b");
  REQUIRE(frames[1].error.message == "big");
  REQUIRE(frames[1].error.state.empty());
  REQUIRE(frames[2].error.type_module == "mod");
  REQUIRE(frames[2].error.state.empty());
}

TEST_CASE("Sends are queued until flush", "[channel]") {
  Pair pair;
  FrameCollector collector(pair.peer);
  Py("ch.send_ready(42, '3.11.2')\n"
     "ch.send_result('a', 1, b'value')\n"
     "ch.send_error('b', 2, 'ValueError', 'bad', 'Traceback...', False)\n");
  REQUIRE(PyEval("ch.pending_bytes() > 0") == "True");
  REQUIRE(collector.Wait(1, absl::Milliseconds(100)).empty());
  Py("ch.flush()\n");
  REQUIRE(PyEval("ch.pending_bytes()") == "0");
  auto frames = collector.Wait(3, absl::Seconds(5));
  REQUIRE(frames.size() == 3);
  REQUIRE(frames[0].type == ipc::FrameType::kReady);
  REQUIRE(frames[0].pid == 42);
  REQUIRE(frames[0].detail == "3.11.2");
  REQUIRE(frames[1].type == ipc::FrameType::kResult);
  REQUIRE(frames[1].call_id == "a");
  REQUIRE(frames[1].encoding == 1);
  REQUIRE(frames[1].data == "value");
  REQUIRE(frames[1].total_size == 5);
  REQUIRE(frames[2].type == ipc::FrameType::kError);
  REQUIRE(frames[2].error.code == 2);
  REQUIRE(frames[2].error.type == "ValueError");
  REQUIRE(frames[2].error.message == "bad");
  REQUIRE(frames[2].error.traceback == "Traceback...");
  REQUIRE_FALSE(frames[2].error.cancelled);
}

TEST_CASE("Namespace events go out without a flush, after earlier records",
          "[channel]") {
  Pair pair;
  FrameCollector collector(pair.peer);
  // The first record starts the log sender; the event after the second is
  // then written by the emitting thread itself (see SendSideChannelFrameNow),
  // queued records first. Neither needs flush().
  Py("ch.send_log('lg', 20, 'INFO', 'one', 1, 'f.py', 1, 'fn', 'm', '', 1, "
     "'c', '', None, '')\n"
     "ch.send_log('lg', 20, 'INFO', 'two', 1, 'f.py', 1, 'fn', 'm', '', 1, "
     "'c', '', None, '')\n"
     "ch.send_ns_event('/plugin', 'ask', b'\\x81', 'r1', None, '', 0)\n"
     "ch.send_ns_event('/plugin', 'fail', None, 'r2', 'KeyError', 'k', 404)\n");
  auto frames = collector.Wait(4, absl::Seconds(5));
  REQUIRE(frames.size() == 4);
  REQUIRE(frames[0].log.message == "one");
  REQUIRE(frames[1].log.message == "two");
  REQUIRE(frames[2].type == ipc::FrameType::kNamespaceEvent);
  REQUIRE(frames[2].ns.name == "/plugin");
  REQUIRE(frames[2].ns.event == "ask");
  REQUIRE(frames[2].ns.request_id == "r1");
  REQUIRE(frames[2].data == "\x81");
  REQUIRE_FALSE(frames[2].ns.has_error);
  REQUIRE(frames[3].ns.event == "fail");
  REQUIRE(frames[3].ns.has_error);
  REQUIRE(frames[3].ns.error_type == "KeyError");
  REQUIRE(frames[3].ns.status_code == 404);
}

TEST_CASE("send_item queues one stream_item frame", "[channel]") {
  Pair pair;
  FrameCollector collector(pair.peer);
  Py("ch.send_item('s', 0, 1, b'first')\n"
     "ch.send_item('s', 1, 2, memoryview(b'\\x01'))\n"
     "ch.flush()\n");
  auto frames = collector.Wait(2, absl::Seconds(5));
  REQUIRE(frames.size() == 2);
  for (size_t i = 0; i < frames.size(); ++i) {
    REQUIRE(frames[i].type == ipc::FrameType::kStreamItem);
    REQUIRE(frames[i].call_id == "s");
    REQUIRE(frames[i].index == i);
  }
  REQUIRE(frames[0].encoding == 1);
  REQUIRE(frames[0].data == "first");
  REQUIRE(frames[1].encoding == 2);
  REQUIRE(frames[1].data == "\x01");

  // A large item is written whole, without chunking.
  Py("ch.send_item('s', 2, 1, bytes(3 * w.CHUNK_BYTES))\n"
     "ch.flush()\n");
  frames = collector.Wait(3, absl::Seconds(10));
  REQUIRE(frames.size() == 3);
  REQUIRE(frames[2].index == 2);
  REQUIRE(frames[2].data == std::string(3 * ipc::kChunkBytes, '\0'));

  // Over the frame limit: ValueError, nothing queued, the channel usable.
  // bytes(n) is calloc'd, so the refused item costs no memory.
  REQUIRE(Raised("ch.send_item('s', 3, 1, bytes(256 * 1024 * 1024 + 1))",
                 "ValueError")
              .find("exceeds") != std::string::npos);
  REQUIRE(PyEval("ch.pending_bytes()") == "0");
  REQUIRE(Raised("ch.send_item('s', -1, 1, b'')", "ValueError") != kNoError);
}

TEST_CASE("Large results are cut into result_chunk frames", "[channel]") {
  constexpr size_t kChunk = ipc::kChunkBytes;
  const size_t size = GENERATE(size_t{0}, ipc::kChunkBytes - 1,
                               ipc::kChunkBytes, ipc::kChunkBytes + 1,
                               2 * ipc::kChunkBytes, 3 * ipc::kChunkBytes + 5);
  CAPTURE(size);
  Pair pair;
  FrameCollector collector(pair.peer);
  Py(absl::StrCat("data = bytes(i % 251 for i in range(", size, "))\n",
                  "ch.send_result('big', 1, memoryview(data))\n"
                  "ch.flush()\n"));
  const size_t want_chunks = size <= kChunk ? 0 : (size - 1) / kChunk;
  auto frames = collector.Wait(want_chunks + 1, absl::Seconds(20));
  REQUIRE(frames.size() == want_chunks + 1);
  std::string joined;
  for (size_t i = 0; i < frames.size(); ++i) {
    const bool last = i + 1 == frames.size();
    REQUIRE(frames[i].call_id == "big");
    REQUIRE(frames[i].type ==
            (last ? ipc::FrameType::kResult : ipc::FrameType::kResultChunk));
    if (!last) REQUIRE(frames[i].data.size() == kChunk);
    REQUIRE(frames[i].data.size() <= kChunk);
    joined += frames[i].data;
  }
  REQUIRE(frames.back().total_size == size);
  REQUIRE(joined.size() == size);
  for (size_t i = 0; i < size; i += 4099) {
    REQUIRE(static_cast<unsigned char>(joined[i]) == i % 251);
  }
}

TEST_CASE("A result given as a list of parts is their concatenation",
          "[channel]") {
  const size_t size = GENERATE(size_t{3}, 300 * 1024, 2 * ipc::kChunkBytes + 7);
  CAPTURE(size);
  Pair pair;
  FrameCollector collector(pair.peer);
  Py(absl::StrCat("data = bytes(i % 251 for i in range(", size, "))\n",
                  "ch.send_result('p', 1, [data[:1], bytearray(data[1:2]), "
                  "memoryview(data)[2:]])\n"
                  "ch.flush()\n"));
  const size_t want = size <= ipc::kChunkBytes ? 1 : 3;
  auto frames = collector.Wait(want, absl::Seconds(20));
  REQUIRE(frames.size() == want);
  std::string joined;
  for (const ipc::Frame& f : frames) joined += f.data;
  REQUIRE(frames.back().total_size == size);
  REQUIRE(joined.size() == size);
  for (size_t i = 0; i < size; i += 997) {
    REQUIRE(static_cast<unsigned char>(joined[i]) == i % 251);
  }
  Py("try:\n"
     "    ch.send_result('p', 1, [b'ok', 5])\n"
     "    outcome = 'no error'\n"
     "except TypeError:\n"
     "    outcome = 'TypeError'\n"
     "del data\n");
  REQUIRE(PyEval("outcome") == "TypeError");
}

// Reads every frame the channel has now (the peer wrote them all already).
std::string ReadAll() {
  return PyEval("repr([ch.read_frames() for _ in range(4)])");
}

ipc::Frame CallFrame(const std::string& id, const std::string& first,
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

ipc::Frame ChunkFrame(const std::string& id, const std::string& data) {
  ipc::Frame chunk;
  chunk.type = ipc::FrameType::kArgChunk;
  chunk.call_id = id;
  chunk.data = data;
  return chunk;
}

TEST_CASE("Chunked arguments arrive as one bytes object of total_size",
          "[channel][args]") {
  constexpr size_t kChunk = ipc::kChunkBytes;
  // Over kMaxReadPerCall (8 MiB), so it spans several read_frames calls.
  const size_t total = GENERATE(ipc::kChunkBytes + 1, 2 * ipc::kChunkBytes,
                                9 * ipc::kChunkBytes + 17);
  CAPTURE(total);
  Pair pair;
  std::string args(total, '\0');
  for (size_t i = 0; i < total; ++i) args[i] = static_cast<char>(i % 253);
  std::thread sender([&] {
    pair.Send(CallFrame("big", args.substr(0, kChunk), total));
    for (size_t off = kChunk; off < total; off += kChunk) {
      pair.Send(ChunkFrame("big", args.substr(off, kChunk)));
    }
  });
  Py("import select\n"
     "got = []\n"
     "while not any(f[0] == w.ARGS for f in got):\n"
     "    select.select([ch.fileno()], [], [], 10)\n"
     "    got += ch.read_frames()\n");
  sender.join();
  REQUIRE(PyEval("len(got)") == "2");
  REQUIRE(PyEval("got[0][:4] + got[0][5:]") ==
          absl::StrCat("(1, 'big', 'm::f', 1, ", total, ", b'', 0)"));
  REQUIRE(PyEval("got[0][4] is None") == "True");
  REQUIRE(PyEval("got[1][:2] == (w.ARGS, 'big')") == "True");
  REQUIRE(PyEval("type(got[1][2]).__name__") == "bytes");
  REQUIRE(PyEval("got[1][3]") == std::to_string(total));
  REQUIRE(PyEval(absl::StrCat("got[1][2] == bytes(i % 253 for i in range(",
                              total, "))")) == "True");
  Py("del got\n");
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

TEST_CASE("Arguments in the payload ring assemble like inline ones",
          "[channel][args][ring]") {
  constexpr size_t kChunk = ipc::kChunkBytes;
  // A ring of 2.5 chunks: some pieces fit, the rest go inline, and the ring
  // is only reusable if the channel releases what it copied.
  RingPair pair(kChunk * 5 / 2);
  const size_t total = 9 * kChunk + 17;
  std::string args(total, '\0');
  for (size_t i = 0; i < total; ++i) args[i] = static_cast<char>(i % 241);
  size_t in_ring = 0;
  std::thread sender([&] {
    ipc::Frame call =
        pair.Place(CallFrame("big", "", total), args.substr(0, kChunk));
    in_ring += call.in_ring;
    pair.Send(call);
    for (size_t off = kChunk; off < total; off += kChunk) {
      ipc::Frame chunk =
          pair.Place(ChunkFrame("big", ""), args.substr(off, kChunk));
      in_ring += chunk.in_ring;
      pair.Send(chunk);
      if (off == 4 * kChunk) absl::SleepFor(absl::Milliseconds(200));
    }
  });
  Py("import select\n"
     "got = []\n"
     "while not any(f[0] == w.ARGS for f in got):\n"
     "    select.select([ch.fileno()], [], [], 10)\n"
     "    got += ch.read_frames()\n");
  sender.join();
  // At least the first pieces, and some after the pause (space released).
  CHECK(in_ring >= 3);
  REQUIRE(PyEval("got[0][4] is None") == "True");
  REQUIRE(PyEval("got[1][3]") == std::to_string(total));
  REQUIRE(PyEval(absl::StrCat("got[1][2] == bytes(i % 241 for i in range(",
                              total, "))")) == "True");
  Py("del got\n");
}

TEST_CASE("Large results go through the payload ring while it has room",
          "[channel][ring]") {
  constexpr size_t kChunk = ipc::kChunkBytes;
  RingPair pair(2 * kChunk);
  FrameCollector collector(pair.peer);
  const size_t size = 3 * kChunk + 70 * 1024;
  // As a list of parts (a pickle written in pieces), cut across them.
  Py(absl::StrCat("data = bytes(i % 239 for i in range(", size, "))\n",
                  "ch.send_result('big', 1, [data[:5], memoryview(data)[5:",
                  kChunk + 9, "], b'', data[", kChunk + 9,
                  ":]])\n"
                  "ch.flush()\n"));
  auto frames = collector.Wait(4, absl::Seconds(20));
  REQUIRE(frames.size() == 4);
  std::string joined;
  size_t in_ring = 0;
  for (ipc::Frame& f : frames) {
    if (f.in_ring) {
      ++in_ring;
      auto piece = pair.daemon->Get(f.ring_pos, f.ring_size);
      REQUIRE(piece.ok());
      joined.append(*piece);
      pair.daemon->Release(f.ring_pos + f.ring_size);
    } else {
      joined += f.data;
    }
  }
  // The collector releases only after all were sent: two chunks fit.
  CHECK(in_ring == 2);
  REQUIRE(frames.back().type == ipc::FrameType::kResult);
  REQUIRE(frames.back().total_size == size);
  REQUIRE(joined.size() == size);
  for (size_t i = 0; i < size; i += 4093) {
    REQUIRE(static_cast<unsigned char>(joined[i]) == i % 239);
  }
  Py("del data\n");
}

TEST_CASE("A ring reference outside the ring is a protocol error",
          "[channel][ring]") {
  RingPair pair(1 << 20);
  ipc::Frame chunk = ChunkFrame("x", "");
  chunk.in_ring = true;
  chunk.ring_pos = (1 << 20) - 10;
  chunk.ring_size = 100;
  pair.Send(chunk);
  REQUIRE(Raised("ch.read_frames()", "w.ProtocolError") != kNoError);
}

TEST_CASE("A ring reference without a payload area is a protocol error",
          "[channel][ring]") {
  Pair pair;
  ipc::Frame chunk = ChunkFrame("x", "");
  chunk.in_ring = true;
  chunk.ring_size = 100;
  pair.Send(chunk);
  REQUIRE(Raised("ch.read_frames()", "w.ProtocolError") != kNoError);
}

TEST_CASE("Channel refuses a payload_fd that is not a payload area",
          "[channel][ring]") {
  Pair pair;
  Py(
      absl::StrCat("try:\n"
                   "    w.Channel(",
                   pair.worker, ", ", dup(pair.peer),
                   ")\n"
                   "    outcome = 'no error'\n"
                   "except OSError:\n"
                   "    outcome = 'OSError'\n"));
  REQUIRE(PyEval("outcome") == "OSError");
}

TEST_CASE("Over-long chunked arguments report their size without data",
          "[channel][args]") {
  Pair pair;
  pair.Send(CallFrame("c", "abcd", 10));
  pair.Send(ChunkFrame("c", "efgh"));
  pair.Send(ChunkFrame("c", "ijklm"));  // 13 bytes of 10
  pair.Send(ChunkFrame("c", "late"));   // no assembly left: dropped
  REQUIRE(ReadAll() ==
          "[[(1, 'c', 'm::f', 1, None, 10, b'', 0), (7, 'c', None, 13)], [], "
          "[], []]");
}

TEST_CASE("A cancel mid-upload drops the assembly and later chunks",
          "[channel][args]") {
  Pair pair;
  pair.Send(CallFrame("c", "abcd", 10));
  pair.Send(ChunkFrame("c", "ef"));
  ipc::Frame cancel;
  cancel.type = ipc::FrameType::kCancel;
  cancel.call_id = "c";
  pair.Send(cancel);
  pair.Send(ChunkFrame("c", "ghij"));     // after the cancel: dropped
  pair.Send(ChunkFrame("nobody", "xy"));  // unknown call: dropped
  REQUIRE(ReadAll() ==
          "[[(1, 'c', 'm::f', 1, None, 10, b'', 0), (3, 'c')], [], [], []]");
  // The id can start again, with a fresh buffer.
  pair.Send(CallFrame("c", "0123", 6));
  pair.Send(ChunkFrame("c", "45"));
  REQUIRE(ReadAll() ==
          "[[(1, 'c', 'm::f', 1, None, 6, b'', 0), (7, 'c', b'012345', 6)], "
          "[], [], []]");
}

TEST_CASE("A duplicate call frame leaves the running assembly alone",
          "[channel][args]") {
  Pair pair;
  pair.Send(CallFrame("c", "abc", 6));
  pair.Send(CallFrame("c", "xyz", 6));  // the driver ignores it
  pair.Send(ChunkFrame("c", "def"));
  // Arguments that arrive whole are passed as they are.
  pair.Send(CallFrame("small", "whole", 5));
  REQUIRE(ReadAll() ==
          "[[(1, 'c', 'm::f', 1, None, 6, b'', 0), "
          "(1, 'c', 'm::f', 1, b'xyz', 6, b'', 0), (7, 'c', b'abcdef', 6), "
          "(1, 'small', 'm::f', 1, b'whole', 5, b'', 0)], [], [], []]");
}

// Reads raw bytes from `fd` until they end with `tail` (or 20 s passed).
std::string ReadUntilEnd(int fd, const std::string& tail) {
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

TEST_CASE(
    "Large results are written unchanged on the wire, after logs and "
    "queued frames",
    "[channel]") {
  constexpr size_t kChunk = ipc::kChunkBytes;
  const size_t size =
      GENERATE(size_t{300 * 1024}, ipc::kChunkBytes, ipc::kChunkBytes + 1,
               3 * ipc::kChunkBytes, 3 * ipc::kChunkBytes + 5);
  CAPTURE(size);
  std::string data(size, '\0');
  for (size_t i = 0; i < size; ++i) data[i] = static_cast<char>(i % 251);
  // What the channel sent before it stopped copying: a small result queued
  // first, AppendFrame-encoded chunk frames, the final result frame.
  ipc::Frame small;
  small.type = ipc::FrameType::kResult;
  small.call_id = "small";
  small.encoding = 2;
  small.data = "tiny";
  small.total_size = 4;
  std::string want;
  REQUIRE_OK(ipc::AppendFrame(small, want));
  size_t last =
      size <= kChunk ? size : (size % kChunk ? size % kChunk : kChunk);
  size_t offset = 0;
  for (; size - offset > last; offset += kChunk) {
    ipc::Frame chunk = ChunkFrame("big", data.substr(offset, kChunk));
    chunk.type = ipc::FrameType::kResultChunk;
    REQUIRE_OK(ipc::AppendFrame(chunk, want));
  }
  ipc::Frame result;
  result.type = ipc::FrameType::kResult;
  result.call_id = "big";
  result.encoding = 1;
  result.data = data.substr(offset);
  result.total_size = size;
  REQUIRE_OK(ipc::AppendFrame(result, want));

  Pair pair;
  std::string got;
  std::thread reader([&] { got = ReadUntilEnd(pair.peer, want); });
  Py(absl::StrCat(
      "data = bytearray(i % 251 for i in range(", size, "))\n",
      "ch.send_result('small', 2, b'tiny')\n"
      "ch.send_log('lg', 20, 'INFO', 'before', 1, 'f.py', 1, 'fn', 'm', '', "
      "1, 'big', '', None, '')\n"
      "ch.send_result('big', 1, memoryview(data))\n"
      "ch.flush()\n"
      "data[:] = b''  # the buffer is released again: resizing works\n"));
  reader.join();
  // The log record (queued before) comes first, then `want` unchanged.
  ipc::FrameReader frames;
  frames.Append(got.data(), got.size());
  auto log = frames.Next();
  REQUIRE(log.ok());
  REQUIRE(log->has_value());
  REQUIRE((*log)->type == ipc::FrameType::kLog);
  REQUIRE((*log)->log.message == "before");
  REQUIRE(frames.buffered() == want.size());
  REQUIRE(got.substr(got.size() - want.size()) == want);
}

TEST_CASE("A record queued while the log sender sleeps wakes it", "[channel]") {
  // Producers wake the sender only when it sleeps (Writer::sender_asleep):
  // each record here is queued after the previous one went out, mostly with
  // the sender asleep, sometimes while it is still finishing its write.
  Pair pair;
  FrameCollector collector(pair.peer);
  for (int i = 0; i < 40; ++i) {
    Py(absl::StrCat("ch.send_log('lg', 20, 'INFO', 'r", i,
                    "', 1, 'f.py', 1, 'fn', 'm', '', 1, 'c', '', None, '')\n"));
    auto frames = collector.Wait(i + 1, absl::Seconds(5));
    REQUIRE(frames.size() == static_cast<size_t>(i + 1));
    REQUIRE(frames[i].log.message == absl::StrCat("r", i));
    if (i % 2 == 0) usleep(1000);
  }
}

TEST_CASE(
    "Records and trace events from several threads all go out, each "
    "thread's in order",
    "[channel]") {
  Pair pair;
  FrameCollector collector(pair.peer);
  constexpr int kThreads = 4, kEach = 3000;
  Py(absl::StrCat(
      "import threading\n"
      "def produce(t):\n"
      "    for i in range(",
      kEach,
      "):\n"
      "        if i % 3:\n"
      "            ch.send_log('lg', 20, 'INFO', f'{t} {i}', 1, 'f.py', 1, "
      "'fn', 'm', '', 1, 'c', '', None, '')\n"
      "        else:\n"
      "            ch.send_trace(3, f'{t} {i}', 'span_1', '', 's', 1, 0, None, "
      "None, 0, '', '', None, 'c')\n"
      "threads = [threading.Thread(target=produce, args=(t,)) for t in range(",
      kThreads,
      ")]\n"
      "for thread in threads: thread.start()\n"
      "for thread in threads: thread.join()\n"));
  auto frames = collector.Wait(kThreads * kEach, absl::Seconds(20));
  REQUIRE(frames.size() == static_cast<size_t>(kThreads * kEach));
  std::vector<int> next(kThreads, 0);
  for (const ipc::Frame& frame : frames) {
    const std::string& text = frame.type == ipc::FrameType::kLog
                                  ? frame.log.message
                                  : frame.trace.trace_id;
    const int t = text[0] - '0';
    REQUIRE(t >= 0);
    REQUIRE(t < kThreads);
    REQUIRE(text == absl::StrCat(t, " ", next[t]));
    REQUIRE((frame.type == ipc::FrameType::kTrace) == (next[t] % 3 == 0));
    ++next[t];
  }
}

TEST_CASE("A write to a closed peer raises ChannelError", "[channel]") {
  Pair pair;
  close(pair.peer);
  pair.peer = -1;
  Py("ch.send_result('a', 1, b'x')\n"
     "try:\n"
     "    ch.flush()\n"
     "    outcome = 'no error'\n"
     "except w.ChannelError as e:\n"
     "    outcome = str(e)\n");
  REQUIRE(PyEval("outcome").find("Broken pipe") != std::string::npos);
}

TEST_CASE("Bad arguments raise TypeError, not crashes", "[channel]") {
  Pair pair;
  Py("errors = []\n"
     "for f, a in [(ch.send_result, ('a', 1)),\n"
     "             (ch.send_result, (1, 1, b'')),\n"
     "             (ch.send_result, ('a', 1, 'not bytes')),\n"
     "             (ch.send_error, ('a', 'x', 't', 'm', 'tb', False)),\n"
     "             (ch.send_item, ('a', 0, 1)),\n"
     "             (ch.send_item, ('a', 0, 1, 'not bytes')),\n"
     "             (ch.send_ready, (1,))]:\n"
     "    try:\n"
     "        f(*a)\n"
     "    except TypeError:\n"
     "        errors.append('TypeError')\n");
  REQUIRE(PyEval("errors == ['TypeError'] * 7") == "True");
  REQUIRE(PyEval("ch.pending_bytes()") == "0");
}

TEST_CASE("Module helpers: msgpack and constants", "[channel]") {
  EnsureChannelInterpreter();
  REQUIRE(PyEval("w.msgpack_loads(w.msgpack_dumps([[1, 'a'], {'k': b'v'}]))") ==
          "[[1, 'a'], {'k': b'v'}]");
  REQUIRE(PyEval("w.CHUNK_BYTES") == std::to_string(ipc::kChunkBytes));
  Py("w.log(0, 'debug line from the channel test')\n");
}

}  // namespace
}  // namespace agentix::worker
