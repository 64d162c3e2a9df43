// Shared by the end-to-end tests of the agentix-worker binary
// (worker/worker_*_test.cc): spawn it with a socketpair on fd 3 (as
// agentix-sandboxd does), speak frames with //worker/ipc, and check replies.
// Pickles are made and read by Debian's /usr/bin/python3 so that the bytes
// are compared against the real thing. Every wait is bounded.
#pragma once
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <deque>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <memory>
#include <msgpack.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/child_process.h"
#include "base/unique_fd.h"
#include "agentix/runtime/v1/runtime.pb.h"
#include "testing/status_matchers.h"
#include "worker/ipc/frame.h"
#include "worker/ipc/io.h"
#include "worker/ipc/payload_area.h"

namespace agentix::worker {

namespace fs = std::filesystem;
using LogRecord = runtime::v1::LogRecord;
using TraceEvent = runtime::v1::TraceEvent;

using ipc::Frame;

using ipc::FrameType;

constexpr char kPython[] = "/usr/bin/python3";

inline std::string Runfile(const std::string& path) {
  return (fs::current_path() / path).string();
}

inline std::string WorkerBinary() { return Runfile("worker/agentix-worker"); }
inline std::string FixtureDir() { return Runfile("worker/testdata"); }

inline std::string TempRoot() {
  const char* dir = getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

// Runs /usr/bin/python3 -I with `args`; returns its stdout. Bounded.
inline std::string RunPython(const std::vector<std::string>& args,
                      const std::string& python = kPython) {
  static int counter = 0;
  const std::string out_path =
      absl::StrCat(TempRoot(), "/python_out_", getpid(), "_", counter++);
  base::UniqueFd out(open(out_path.c_str(),
                          O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  REQUIRE(out.valid());
  base::SpawnOptions spawn;
  spawn.path = python;
  spawn.argv = {python, "-I"};
  spawn.argv.insert(spawn.argv.end(), args.begin(), args.end());
  spawn.env = {"PATH=/usr/bin:/bin", "LANG=C.UTF-8"};
  spawn.fd_map = {{out.get(), 1}};
  REQUIRE_OK_AND_ASSIGN(base::ChildProcess child,
                        base::ChildProcess::Spawn(spawn));
  REQUIRE_OK_AND_ASSIGN(base::ExitStatus exit,
                        child.AwaitExit(absl::Seconds(60)));
  REQUIRE(exit.returncode() == 0);
  std::string text = ReadFile(out_path);
  fs::remove(out_path);
  return text;
}

// pickle.dumps(eval(expression), protocol=5), made by Debian's Python.
inline std::string Pickle(const std::string& expression) {
  return RunPython(
      {"-c",
       "import pickle, sys\n"
       "sys.stdout.buffer.write(pickle.dumps(eval(sys.argv[1]), protocol=5))",
       expression});
}

// repr() of the sys.path a worker running on `python` must have: the
// fixtures' import root, then what `python -I` itself has (less the missing
// .zip archive).
inline std::string ExpectedSysPath(const std::string& python = kPython) {
  return RunPython({"-c",
                    "import sys\n"
                    "print(repr([sys.argv[1]] + [p for p in sys.path "
                    "if not p.endswith('.zip')]), end='')",
                    FixtureDir()},
                   python);
}

// eval(expression) with v = pickle.loads(bytes), as a str.
inline std::string Unpickle(const std::string& bytes,
                     const std::string& expression = "repr(v)") {
  static int counter = 0;
  const std::string path =
      absl::StrCat(TempRoot(), "/pickle_in_", getpid(), "_", counter++);
  WriteFile(path, bytes);
  std::string out = RunPython(
      {"-c",
       "import pickle, sys\n"
       "v = pickle.load(open(sys.argv[1], 'rb'))\n"
       "sys.stdout.write(str(eval(sys.argv[2])))",
       path, expression});
  fs::remove(path);
  return out;
}

inline std::string Msgpack(const std::function<void(msgpack::packer<msgpack::sbuffer>&)>& fill) {
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> packer(buffer);
  fill(packer);
  return std::string(buffer.data(), buffer.size());
}

// What a call ended with.
struct Reply {
  bool done = false;
  bool ok = false;  // result (true) or error (false)
  std::string value;  // result bytes, chunks joined
  int encoding = 0;
  uint64_t total_size = 0;
  int chunks = 0;  // result_chunk frames before the result
  ipc::ErrorInfo error;
};

// What a streaming call produced.
struct StreamReply {
  std::vector<std::string> items;  // encoded items, by index
  Reply end;                       // the terminal frame
};

// How to start a worker.
struct WorkerArgs {
  std::vector<std::string> args;  // besides --channel-fd
  // A payload area's memfd (the caller's), passed as --payload-fd as the
  // daemon passes it; -1: none.
  int payload_fd = -1;
  bool python_path = true;        // pass --python-path worker/testdata
  std::vector<std::string> env = {
      // Isolation: none of these may influence the worker.
      "PATH=/root/.pyenv/shims:/root/.pyenv/bin:/usr/bin:/bin",
      "PYTHONHOME=/nonexistent/pythonhome",
      "PYTHONPATH=/nonexistent/pythonpath",
      "PYTHONSTARTUP=/nonexistent/startup.py",
      "AGENTIX_WORKER_ID=test-worker",
  };
};

// One running agentix-worker and the daemon's end of its channel.
class Worker {
 public:

  explicit Worker(const WorkerArgs& options = WorkerArgs()) {
    int fds[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    channel_.Reset(fds[0]);
    base::UniqueFd child_end(fds[1]);
    base::SpawnOptions spawn;
    spawn.path = WorkerBinary();
    spawn.argv = {spawn.path,
                  absl::StrCat("--channel-fd=", ipc::kWorkerChannelFd)};
    if (options.python_path) {
      spawn.argv.push_back(absl::StrCat("--python-path=", FixtureDir()));
    }
    spawn.argv.insert(spawn.argv.end(), options.args.begin(),
                      options.args.end());
    spawn.env = options.env;
    // Durable logs go to the test's temporary directory unless a test says
    // otherwise.
    bool has_log_dir = false;
    for (const std::string& var : spawn.env) {
      has_log_dir = has_log_dir || var.rfind("AGENTIX_LOG_DIR=", 0) == 0;
    }
    if (!has_log_dir) {
      spawn.env.push_back(
          absl::StrCat("AGENTIX_LOG_DIR=", TempRoot(), "/agentix-logs"));
    }
    spawn.fd_map = {{child_end.get(), ipc::kWorkerChannelFd}};
    if (options.payload_fd >= 0) {
      spawn.argv.push_back(
          absl::StrCat("--payload-fd=", ipc::kWorkerPayloadFd));
      spawn.fd_map.push_back({options.payload_fd, ipc::kWorkerPayloadFd});
    }
    REQUIRE_OK_AND_ASSIGN(child_, base::ChildProcess::Spawn(spawn));
  }

  ~Worker() {
    // ChildProcess's destructor SIGKILLs and reaps.
  }

  // Reads the ready frame; fails the test otherwise.
  void AwaitReady() {
    REQUIRE_OK_AND_ASSIGN(Frame ready, Next(absl::Seconds(20)));
    INFO(ready.error.message);
    REQUIRE(ready.type == FrameType::kReady);
    REQUIRE(ready.pid == child_.pid());
  }

  void Send(const Frame& frame) {
    std::string bytes;
    REQUIRE_OK(ipc::AppendFrame(frame, bytes));
    SendRaw(bytes);
  }
  // The link's daemon end (for frames that carry descriptors).
  int fd() const { return channel_.get(); }
  void SendRaw(const std::string& bytes) {
    REQUIRE_OK(ipc::WriteAll(channel_.get(), bytes));
  }

  // Starts a call; arguments over kChunkBytes follow as arg_chunk frames.
  // A non-zero `stream_window` makes it a streaming call.
  void Call(const std::string& id, const std::string& callable,
            const std::string& args, int encoding = 1,
            uint32_t stream_window = 0) {
    Frame call;
    call.type = FrameType::kCall;
    call.call_id = id;
    call.callable = callable;
    call.encoding = encoding;
    call.stream_window = stream_window;
    call.total_size = args.size();
    const size_t first = std::min(args.size(), ipc::kChunkBytes);
    call.data = args.substr(0, first);
    Send(call);
    for (size_t off = first; off < args.size(); off += ipc::kChunkBytes) {
      Frame chunk;
      chunk.type = FrameType::kArgChunk;
      chunk.call_id = id;
      chunk.data = args.substr(off, ipc::kChunkBytes);
      Send(chunk);
    }
  }

  void Cancel(const std::string& id) {
    Frame cancel;
    cancel.type = FrameType::kCancel;
    cancel.call_id = id;
    Send(cancel);
  }

  void Ack(const std::string& id, uint64_t index) {
    Frame ack;
    ack.type = FrameType::kStreamAck;
    ack.call_id = id;
    ack.index = index;
    Send(ack);
  }

  void Shutdown() {
    Frame shutdown;
    shutdown.type = FrameType::kShutdown;
    Send(shutdown);
  }

  void CloseChannel() { channel_.Reset(); }

  // The next frame that is not a `log` or `trace` frame (those are set
  // aside in logs() / traces()), or kDeadlineExceeded / kUnavailable (EOF).
  absl::StatusOr<Frame> Next(absl::Duration timeout) {
    if (!held_.empty()) {
      Frame frame = std::move(held_.front());
      held_.pop_front();
      return frame;
    }
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      absl::StatusOr<Frame> frame = NextAny(deadline - absl::Now());
      if (!frame.ok() || !SetAside(*frame)) return frame;
    }
  }

  // Keeps a `log` or `trace` frame in logs() / traces(); false for others.
  bool SetAside(Frame& frame) {
    if (frame.type == FrameType::kLog) {
      LogRecord record;
      // A record that does not parse shows as an empty one (and fails the
      // test looking for it).
      record.ParseFromString(frame.record);
      logs_.push_back(std::move(record));
      return true;
    }
    if (frame.type == FrameType::kTrace) {
      TraceEvent event;
      event.ParseFromString(frame.record);  // as for records
      traces_.push_back(std::move(event));
      return true;
    }
    return false;
  }

  // Reads frames until traces() holds at least `count` events; other frames
  // are kept for Next(). False on timeout or end of stream.
  bool AwaitTraces(size_t count, absl::Duration timeout = absl::Seconds(20)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (traces_.size() < count) {
      absl::StatusOr<Frame> frame = NextAny(deadline - absl::Now());
      if (!frame.ok()) return false;
      if (!SetAside(*frame)) held_.push_back(std::move(*frame));
    }
    return true;
  }

  // Trace events received so far, in arrival order.
  const std::vector<TraceEvent>& traces() const { return traces_; }

  // Reads frames until `done(logs())` holds; other frames are kept for
  // Next(). False on timeout or end of stream.
  bool AwaitLogs(
      const std::function<bool(const std::vector<LogRecord>&)>& done,
      absl::Duration timeout = absl::Seconds(20)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (!done(logs_)) {
      absl::StatusOr<Frame> frame = NextAny(deadline - absl::Now());
      if (!frame.ok()) return false;
      if (!SetAside(*frame)) held_.push_back(std::move(*frame));
    }
    return true;
  }

  // Log records received so far, in arrival order.
  const std::vector<LogRecord>& logs() const { return logs_; }

  // Every frame, `log` frames included.
  absl::StatusOr<Frame> NextAny(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      auto next = reader_.Next();
      if (!next.ok()) return next.status();
      if (next->has_value()) return std::move(**next);
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError("no frame in time");
      }
      pollfd pfd{channel_.get(), POLLIN, 0};
      const int ms =
          static_cast<int>(absl::ToInt64Milliseconds(left)) + 1;
      if (poll(&pfd, 1, ms) <= 0) continue;
      auto n = ipc::ReadInto(channel_.get(), reader_);
      if (!n.ok()) return n.status();
      if (*n == 0) return absl::UnavailableError("channel closed");
    }
  }

  // Reads frames until every id in `ids` has its terminal frame. Frames for
  // other ids fail the test.
  std::map<std::string, Reply> AwaitReplies(const std::set<std::string>& ids,
                                            absl::Duration timeout) {
    std::map<std::string, Reply> replies;
    const absl::Time deadline = absl::Now() + timeout;
    size_t done = 0;
    while (done < ids.size()) {
      auto frame = Next(deadline - absl::Now());
      INFO("waiting for " << ids.size() - done << " replies");
      REQUIRE_OK(frame);
      INFO("frame " << ipc::FrameTypeName(frame->type) << " for "
                    << frame->call_id);
      REQUIRE(ids.count(frame->call_id) == 1);
      Reply& reply = replies[frame->call_id];
      REQUIRE_FALSE(reply.done);
      switch (frame->type) {
        case FrameType::kResultChunk:
          REQUIRE(frame->data.size() == ipc::kChunkBytes);
          reply.value += frame->data;
          ++reply.chunks;
          continue;
        case FrameType::kResult:
          reply.ok = true;
          reply.value += frame->data;
          reply.encoding = frame->encoding;
          reply.total_size = frame->total_size;
          break;
        case FrameType::kError:
          reply.error = frame->error;
          break;
        default:
          FAIL("unexpected frame " << ipc::FrameTypeName(frame->type));
      }
      reply.done = true;
      ++done;
    }
    return replies;
  }

  // Reads the frames of streaming call `id` until its terminal frame,
  // acknowledging each item as it arrives. Items must come in index order;
  // frames for other ids fail the test.
  StreamReply AwaitStream(const std::string& id,
                          absl::Duration timeout = absl::Seconds(20)) {
    StreamReply stream;
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      auto frame = Next(deadline - absl::Now());
      INFO("stream " << id << " after " << stream.items.size() << " items");
      REQUIRE_OK(frame);
      REQUIRE(frame->call_id == id);
      if (frame->type == FrameType::kStreamItem) {
        REQUIRE(frame->index == stream.items.size());
        stream.items.push_back(frame->data);
        Ack(id, stream.items.size());
        continue;
      }
      if (frame->type == FrameType::kResult) {
        stream.end.ok = true;
        stream.end.value = frame->data;
        stream.end.total_size = frame->total_size;
      } else {
        REQUIRE(frame->type == FrameType::kError);
        stream.end.error = frame->error;
      }
      stream.end.done = true;
      return stream;
    }
  }

  // The next frame, which must be stream item `index` of call `id`; returns
  // its data.
  std::string NextItem(const std::string& id, uint64_t index) {
    REQUIRE_OK_AND_ASSIGN(Frame frame, Next(absl::Seconds(10)));
    INFO("frame " << ipc::FrameTypeName(frame.type) << " for " << frame.call_id
                  << ": " << frame.error.type << " " << frame.error.message);
    REQUIRE(frame.type == FrameType::kStreamItem);
    REQUIRE(frame.call_id == id);
    REQUIRE(frame.index == index);
    return frame.data;
  }

  Reply AwaitReply(const std::string& id,
                   absl::Duration timeout = absl::Seconds(20)) {
    return AwaitReplies({id}, timeout)[id];
  }

  // Calls and waits; the result must be a success. Returns the value bytes.
  std::string CallOk(const std::string& callable, const std::string& args,
                     int encoding = 1) {
    const std::string id = absl::StrCat("ok-", ++ids_);
    Call(id, callable, args, encoding);
    return OkValue(AwaitReply(id));
  }

  // A cold start's first call: sent before the ready frame is read, so it is
  // there when the worker starts reading, whatever the load. The result must
  // be a success; returns the value bytes.
  std::string FirstCallOk(const std::string& callable,
                          const std::string& args) {
    const std::string id = absl::StrCat("first-", ++ids_);
    Call(id, callable, args);
    AwaitReady();
    return OkValue(AwaitReply(id));
  }

  // The value bytes of `reply`, which must be a whole success.
  static std::string OkValue(const Reply& reply) {
    INFO(reply.error.type << ": " << reply.error.message << "\n"
                          << reply.error.traceback);
    REQUIRE(reply.ok);
    REQUIRE(reply.total_size == reply.value.size());
    return reply.value;
  }

  // Calls and waits; the result must be an error.
  ipc::ErrorInfo CallError(const std::string& callable,
                           const std::string& args, int encoding = 1) {
    const std::string id = absl::StrCat("err-", ++ids_);
    Call(id, callable, args, encoding);
    Reply reply = AwaitReply(id);
    REQUIRE_FALSE(reply.ok);
    return reply.error;
  }

  // Asserts no frame arrives within `quiet`.
  void ExpectSilence(absl::Duration quiet) {
    auto frame = Next(quiet);
    if (frame.ok()) {
      FAIL("unexpected frame " << ipc::FrameTypeName(frame->type) << " for "
                               << frame->call_id);
    }
    REQUIRE(frame.status().code() == absl::StatusCode::kDeadlineExceeded);
  }

  base::ExitStatus AwaitExit(absl::Duration timeout = absl::Seconds(10)) {
    auto exit = child_.AwaitExit(timeout);
    REQUIRE_OK(exit);
    return *exit;
  }

  pid_t pid() const { return child_.pid(); }

 private:
  base::UniqueFd channel_;
  base::ChildProcess child_;
  ipc::FrameReader reader_;
  int ids_ = 0;
  std::vector<LogRecord> logs_;
  std::vector<TraceEvent> traces_;
  std::deque<Frame> held_;  // read by AwaitLogs, not yet by Next
};

// A worker that has sent ready.
inline std::unique_ptr<Worker> ReadyWorker(
    const WorkerArgs& options = WorkerArgs()) {
  auto worker = std::make_unique<Worker>(options);
  worker->AwaitReady();
  return worker;
}

// The records of `logger` among `logs`.
inline std::vector<LogRecord> LogsOf(const std::vector<LogRecord>& logs,
                                  const std::string& logger) {
  std::vector<LogRecord> out;
  for (const LogRecord& log : logs) {
    if (log.logger() == logger) out.push_back(log);
  }
  return out;
}

// Waits until `logger` has a record with `message`; returns it.
inline LogRecord AwaitLog(Worker& worker, const std::string& logger,
                       const std::string& message) {
  LogRecord found;
  const bool ok = worker.AwaitLogs([&](const std::vector<LogRecord>& logs) {
    for (const LogRecord& log : logs) {
      if (log.logger() == logger && log.message() == message) {
        found = log;
        return true;
      }
    }
    return false;
  });
  INFO("waiting for " << logger << ": " << message);
  REQUIRE(ok);
  return found;
}

inline const std::string kStdout = "agentix.sandbox.stdout";

inline const std::string kStderr = "agentix.sandbox.stderr";

// The msgpack map `extras` as key -> the value's msgpack text form.
inline std::map<std::string, std::string> Extras(const std::string& extras) {
  std::map<std::string, std::string> out;
  if (extras.empty()) return out;
  msgpack::object_handle handle = msgpack::unpack(extras.data(), extras.size());
  const msgpack::object& map = handle.get();
  REQUIRE(map.type == msgpack::type::MAP);
  for (uint32_t i = 0; i < map.via.map.size; ++i) {
    const msgpack::object_kv& kv = map.via.map.ptr[i];
    std::ostringstream value;
    value << kv.val;
    out[kv.key.as<std::string>()] = value.str();
  }
  return out;
}

}  // namespace agentix::worker
