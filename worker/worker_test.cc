// End-to-end tests of the agentix-worker binary: spawn it with a socketpair
// on fd 3 (as agentix-sandboxd does), speak frames with //worker/ipc, and
// check replies. Pickles are made and read by Debian's /usr/bin/python3 so
// that the bytes are compared against the real thing. Every wait is bounded.
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
#include "testing/status_matchers.h"
#include "worker/ipc/frame.h"
#include "worker/ipc/io.h"

namespace agentix::worker {
namespace {

namespace fs = std::filesystem;
using ipc::Frame;
using ipc::FrameType;

constexpr char kPython[] = "/usr/bin/python3";

std::string Runfile(const std::string& path) {
  return (fs::current_path() / path).string();
}

std::string WorkerBinary() { return Runfile("worker/agentix-worker"); }
std::string FixtureDir() { return Runfile("worker/testdata"); }

std::string TempRoot() {
  const char* dir = getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

// Runs /usr/bin/python3 -I with `args`; returns its stdout. Bounded.
std::string RunPython(const std::vector<std::string>& args,
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
std::string Pickle(const std::string& expression) {
  return RunPython(
      {"-c",
       "import pickle, sys\n"
       "sys.stdout.buffer.write(pickle.dumps(eval(sys.argv[1]), protocol=5))",
       expression});
}

// eval(expression) with v = pickle.loads(bytes), as a str.
std::string Unpickle(const std::string& bytes,
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

std::string Msgpack(const std::function<void(msgpack::packer<msgpack::sbuffer>&)>& fill) {
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
      logs_.push_back(std::move(frame.log));
      return true;
    }
    if (frame.type == FrameType::kTrace) {
      traces_.push_back(std::move(frame.trace));
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
  const std::vector<ipc::TraceEntry>& traces() const { return traces_; }

  // Reads frames until `done(logs())` holds; other frames are kept for
  // Next(). False on timeout or end of stream.
  bool AwaitLogs(
      const std::function<bool(const std::vector<ipc::LogEntry>&)>& done,
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
  const std::vector<ipc::LogEntry>& logs() const { return logs_; }

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
    Reply reply = AwaitReply(id);
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
  std::vector<ipc::LogEntry> logs_;
  std::vector<ipc::TraceEntry> traces_;
  std::deque<Frame> held_;  // read by AwaitLogs, not yet by Next
};

// A worker that has sent ready.
std::unique_ptr<Worker> ReadyWorker(
    const WorkerArgs& options = WorkerArgs()) {
  auto worker = std::make_unique<Worker>(options);
  worker->AwaitReady();
  return worker;
}

TEST_CASE("The worker reports ready with its Python version", "[worker]") {
  Worker worker;
  REQUIRE_OK_AND_ASSIGN(Frame ready, worker.Next(absl::Seconds(20)));
  REQUIRE(ready.type == FrameType::kReady);
  REQUIRE(ready.pid == worker.pid());
  REQUIRE(ready.detail == "3.11.2");
  worker.Shutdown();
  REQUIRE(worker.AwaitExit().returncode() == 0);
}

TEST_CASE("Builtins run and return protocol-5 pickles", "[worker]") {
  auto worker = ReadyWorker();
  std::string value = worker->CallOk("math::factorial", Pickle("((10,), {})"));
  REQUIRE(value == Pickle("3628800"));
  REQUIRE(Unpickle(value) == "3628800");
  value = worker->CallOk("builtins::len", Pickle("(([1, 2, 3],), {})"));
  REQUIRE(value == std::string("\x80\x05K\x03.", 5));
  value = worker->CallOk("asyncio::sleep", Pickle("((0, 'slept'), {})"));
  REQUIRE(Unpickle(value) == "'slept'");
}

TEST_CASE("Fixture targets: sync, async, static, stateful", "[worker]") {
  auto worker = ReadyWorker();
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::add",
                                  Pickle("((2,), {'b': 3})"))) == "5");
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::async_add",
                                  Pickle("((2, 40), {})"))) == "42");
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::Echo.echo",
                                  Pickle("(('hi',), {})"))) == "'hi'");
  REQUIRE(Unpickle(worker->CallOk(
              "worker_fixture::Echo.method",
              Pickle("((__import__('types').SimpleNamespace(), 7), {})"))) ==
          "('method', 7)");
  // A sync function returning a coroutine: the coroutine is awaited.
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::returns_coroutine",
                                  Pickle("((), {})"))) == "3");
  // Module state persists between calls.
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::count",
                                  Pickle("((), {})"))) == "1");
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::count",
                                  Pickle("((), {})"))) == "2");
  // Sync targets run on named pool threads (Python and OS names).
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::thread_name",
                                  Pickle("((), {})")),
                   "v[0].startswith('agentix-call_') and v[1]") ==
          "agentix-call");
  // User output on fd 1/2 does not disturb the channel.
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::noisy",
                                  Pickle("((), {})"))) == "'ok'");
}

TEST_CASE("The interpreter is Debian's, isolated from the environment",
          "[worker]") {
  auto worker = ReadyWorker();
  const std::string info =
      worker->CallOk("worker_fixture::interpreter_info", Pickle("((), {})"));
  REQUIRE(Unpickle(info, "v['executable']") == "/usr/bin/python3");
  REQUIRE(Unpickle(info, "v['prefix']") == "/usr");
  REQUIRE(Unpickle(info, "v['version']") == "3.11.2");
  REQUIRE(Unpickle(info, "v['isolated']") == "1");
  REQUIRE(Unpickle(info, "v['os_file']") == "/usr/lib/python3.11/os.py");
  REQUIRE(Unpickle(info, "v['argv']") == "['agentix-worker']");
  // PYTHONPATH / PYTHONHOME in the environment were ignored; the import
  // roots come first, then the stdlib, then Debian's dist-packages.
  const std::string path =
      worker->CallOk("worker_fixture::sys_path", Pickle("((), {})"));
  REQUIRE(Unpickle(path) ==
          RunPython({"-c",
                     "import sys\n"
                     "print(repr([sys.argv[1]] + [p for p in sys.path "
                     "if not p.endswith('.zip')]), end='')",
                     FixtureDir()}));
  REQUIRE(Unpickle(path, "v[:3]") ==
          absl::StrCat("['", FixtureDir(),
                       "', '/usr/lib/python3.11', "
                       "'/usr/lib/python3.11/lib-dynload']"));
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::env",
                                  Pickle("(('AGENTIX_WORKER_ID',), {})"))) ==
          "'test-worker'");
}

TEST_CASE("Resolve failures are typed errors with code 3", "[worker]") {
  auto worker = ReadyWorker();
  const std::string no_args = Pickle("((), {})");

  ipc::ErrorInfo e = worker->CallError("no_such_module_xyz::f", no_args);
  REQUIRE(e.type == "ModuleNotFoundError");
  REQUIRE(e.code == 3);
  REQUIRE(e.message == "No module named 'no_such_module_xyz'");
  REQUIRE_FALSE(e.cancelled);

  e = worker->CallError("worker_fixture::missing", no_args);
  REQUIRE(e.type == "AttributeError");
  REQUIRE(e.code == 3);

  e = worker->CallError("worker_fixture::Echo.missing", no_args);
  REQUIRE(e.type == "AttributeError");

  e = worker->CallError("worker_fixture::NOT_CALLABLE", no_args);
  REQUIRE(e.type == "TypeError");
  REQUIRE(e.code == 3);
  REQUIRE(e.message.find("not callable") != std::string::npos);

  e = worker->CallError("worker_fixture.add", no_args);
  REQUIRE(e.type == "ValueError");
  REQUIRE(e.code == 3);
  REQUIRE(e.message.rfind("invalid remote callable reference", 0) == 0);

  e = worker->CallError("worker_broken::f", no_args);
  REQUIRE(e.type == "RuntimeError");
  REQUIRE(e.message == "worker_broken refuses to import");
  REQUIRE(e.traceback.find("worker_broken.py") != std::string::npos);
}

TEST_CASE("Undecodable arguments are ArgumentsDecodeError", "[worker]") {
  auto worker = ReadyWorker();
  ipc::ErrorInfo e = worker->CallError("worker_fixture::add", "not a pickle");
  REQUIRE(e.type == "ArgumentsDecodeError");
  REQUIRE(e.code == 3);
  REQUIRE(e.message.rfind("failed to decode arguments: ", 0) == 0);
  REQUIRE_FALSE(e.traceback.empty());

  e = worker->CallError("worker_fixture::add", Pickle("5"));
  REQUIRE(e.type == "ArgumentsDecodeError");
  REQUIRE(e.message == "arguments must be an (args, kwargs) pair, got int");

  // A pickle naming a module that does not exist (STACK_GLOBAL no_such_mod.f).
  constexpr char kMissingGlobal[] =
      "\x80\x04\x8c\x0bno_such_mod\x94\x8c\x01" "f\x94\x93\x94.";
  e = worker->CallError("worker_fixture::add",
                        std::string(kMissingGlobal, sizeof(kMissingGlobal) - 1));
  REQUIRE(e.type == "ArgumentsDecodeError");
  REQUIRE(e.message.find("ModuleNotFoundError") != std::string::npos);
}

TEST_CASE("User exceptions, BaseExceptions included, become error frames",
          "[worker]") {
  auto worker = ReadyWorker();
  ipc::ErrorInfo e =
      worker->CallError("worker_fixture::fail", Pickle("(('boom',), {})"));
  REQUIRE(e.type == "ValueError");
  REQUIRE(e.message == "boom");
  REQUIRE(e.code == 2);
  REQUIRE(e.traceback.find("worker_fixture.py") != std::string::npos);
  REQUIRE(e.traceback.find("in fail") != std::string::npos);
  REQUIRE(e.traceback.find("ValueError: boom") != std::string::npos);
  // The driver's own wrapper frame is trimmed.
  REQUIRE(e.traceback.find("driver.py") == std::string::npos);

  e = worker->CallError("math::factorial", Pickle("((-1,), {})"));
  REQUIRE(e.type == "ValueError");
  REQUIRE(e.traceback == "ValueError: factorial() not defined for negative "
                         "values\n");

  e = worker->CallError("worker_fixture::exit_now", Pickle("((3,), {})"));
  REQUIRE(e.type == "SystemExit");
  REQUIRE(e.message == "3");
  REQUIRE(e.code == 2);

  e = worker->CallError("worker_fixture::interrupt", Pickle("((), {})"));
  REQUIRE(e.type == "KeyboardInterrupt");
  REQUIRE(e.message == "stop");

  e = worker->CallError("worker_fixture::add", Pickle("((), {'c': 1})"));
  REQUIRE(e.type == "TypeError");
  REQUIRE(e.code == 2);

  // The worker keeps serving.
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::add",
                                  Pickle("((1, 2), {})"))) == "3");
}

TEST_CASE("Unpicklable results are ResultEncodeError", "[worker]") {
  auto worker = ReadyWorker();
  ipc::ErrorInfo e =
      worker->CallError("worker_fixture::unpicklable", Pickle("((), {})"));
  REQUIRE(e.type == "ResultEncodeError");
  REQUIRE(e.code == 3);
  REQUIRE(e.message.rfind("failed to pickle return value: ", 0) == 0);
}

TEST_CASE("Coroutines run concurrently on the loop", "[worker][timing]") {
  auto worker = ReadyWorker();
  const std::string args = Pickle("((0.2,), {})");
  std::set<std::string> ids;
  const absl::Time start = absl::Now();
  for (int i = 0; i < 10; ++i) {
    ids.insert(absl::StrCat("s", i));
    worker->Call(absl::StrCat("s", i), "worker_fixture::sleep_async", args);
  }
  auto replies = worker->AwaitReplies(ids, absl::Seconds(10));
  const absl::Duration took = absl::Now() - start;
  INFO("10 x 0.2 s took " << absl::FormatDuration(took));
  // Serially this would take 2 s; concurrently ~0.2 s plus start-up noise.
  REQUIRE(took < absl::Milliseconds(1200));
  for (auto& [id, reply] : replies) REQUIRE(reply.ok);
}

TEST_CASE("Sync calls run in parallel on the pool", "[worker][timing]") {
  auto worker = ReadyWorker();
  const std::string args = Pickle("((0.3,), {})");
  std::set<std::string> ids;
  const absl::Time start = absl::Now();
  for (int i = 0; i < 8; ++i) {
    ids.insert(absl::StrCat("b", i));
    worker->Call(absl::StrCat("b", i), "worker_fixture::sleep_sync", args);
  }
  worker->AwaitReplies(ids, absl::Seconds(10));
  const absl::Duration took = absl::Now() - start;
  INFO("8 x 0.3 s blocking took " << absl::FormatDuration(took));
  REQUIRE(took < absl::Milliseconds(1600));  // serially: 2.4 s
}

TEST_CASE("A blocking sync call does not stall async calls",
          "[worker][timing]") {
  auto worker = ReadyWorker();
  worker->Call("blocking", "worker_fixture::sleep_sync", Pickle("((2.0,), {})"));
  const absl::Time start = absl::Now();
  worker->Call("quick", "worker_fixture::async_add", Pickle("((1, 1), {})"));
  REQUIRE_OK_AND_ASSIGN(Frame first, worker->Next(absl::Seconds(5)));
  REQUIRE(first.call_id == "quick");
  REQUIRE(first.type == FrameType::kResult);
  REQUIRE(absl::Now() - start < absl::Seconds(1));
  Reply blocking = worker->AwaitReply("blocking");
  REQUIRE(blocking.ok);
}

TEST_CASE("Cancelling a coroutine answers Cancelled and stops the task",
          "[worker]") {
  auto worker = ReadyWorker();
  const std::string marker = absl::StrCat(TempRoot(), "/cancel_marker_",
                                          getpid());
  fs::remove(marker);
  worker->Call("c1", "worker_fixture::cancellable",
               Pickle(absl::StrCat("(('", marker, "',), {})")));
  worker->ExpectSilence(absl::Milliseconds(200));
  worker->Cancel("c1");
  Reply reply = worker->AwaitReply("c1", absl::Seconds(5));
  REQUIRE_FALSE(reply.ok);
  REQUIRE(reply.error.type == "Cancelled");
  REQUIRE(reply.error.message == "remote call cancelled");
  REQUIRE(reply.error.code == 1);
  REQUIRE(reply.error.cancelled);
  // The coroutine really got CancelledError.
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::exists",
                                  Pickle(absl::StrCat("(('", marker,
                                                      "',), {})")))) == "True");
  // Nothing more for c1; cancelling again or an unknown id is a no-op.
  worker->Cancel("c1");
  worker->Cancel("never-started");
  worker->ExpectSilence(absl::Milliseconds(300));
}

TEST_CASE("Cancelling a sync call drops its late result", "[worker]") {
  auto worker = ReadyWorker();
  worker->Call("s1", "worker_fixture::sleep_sync", Pickle("((0.5,), {})"));
  worker->ExpectSilence(absl::Milliseconds(100));
  worker->Cancel("s1");
  Reply reply = worker->AwaitReply("s1", absl::Seconds(5));
  REQUIRE(reply.error.type == "Cancelled");
  REQUIRE(reply.error.cancelled);
  worker->ExpectSilence(absl::Milliseconds(1000));
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::add",
                                  Pickle("((1, 2), {})"))) == "3");
}

TEST_CASE("A sync call cancelled while waiting for a pool thread never runs",
          "[worker]") {
  auto worker = ReadyWorker();
  const std::string marker =
      absl::StrCat(TempRoot(), "/pool_marker_", getpid());
  const std::string touch_args = Pickle(absl::StrCat("(('", marker, "',), {})"));
  const std::string second = Pickle("((1.0,), {})");
  const std::string half = Pickle("((0.5,), {})");
  // Every one of the pool's 64 threads busy for a second.
  std::set<std::string> ids;
  for (int i = 0; i < 64; ++i) {
    ids.insert(absl::StrCat("busy", i));
    worker->Call(absl::StrCat("busy", i), "worker_fixture::sleep_sync", second);
  }
  fs::remove(marker);
  worker->Call("queued", "worker_fixture::touch", touch_args);
  worker->Cancel("queued");
  ids.insert("queued");
  // (Starting 64 threads takes a while, so the replies come in any order.)
  auto replies = worker->AwaitReplies(ids, absl::Seconds(30));
  REQUIRE(replies["queued"].error.type == "Cancelled");
  for (int i = 0; i < 64; ++i) REQUIRE(replies[absl::StrCat("busy", i)].ok);
  // The freed threads took nothing left over: the cancelled call never ran.
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::exists", touch_args)) ==
          "False");
  // One queued behind busy threads and not cancelled runs once one is free.
  ids.erase("queued");
  for (const std::string& id : ids) {
    worker->Call(id, "worker_fixture::sleep_sync", half);
  }
  worker->Call("later", "worker_fixture::touch", touch_args);
  ids.insert("later");
  REQUIRE(worker->AwaitReplies(ids, absl::Seconds(30))["later"].ok);
  REQUIRE(fs::exists(marker));
  fs::remove(marker);
}

TEST_CASE("A finished sync call lets go of its arguments at once",
          "[worker]") {
  auto worker = ReadyWorker();
  // Without the cycle collector, only reference counting frees them: a
  // call's arguments must not wait for it (a big one would keep its pages).
  worker->CallOk("worker_fixture::disable_gc", Pickle("((), {})"));
  worker->CallOk("worker_fixture::echo", Pickle("((b'x' * 100000,), {})"));
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::pool_jobs_holding_arguments",
                                  Pickle("((), {})"))) == "0");
}

TEST_CASE("Cancelling while arguments arrive", "[worker]") {
  auto worker = ReadyWorker();
  const std::string args = Pickle("((b'z' * 3000000,), {})");
  Frame call;
  call.type = FrameType::kCall;
  call.call_id = "partial";
  call.callable = "worker_fixture::length";
  call.encoding = 1;
  call.total_size = args.size();
  call.data = args.substr(0, ipc::kChunkBytes);
  worker->Send(call);
  worker->Cancel("partial");
  Reply reply = worker->AwaitReply("partial", absl::Seconds(5));
  REQUIRE(reply.error.type == "Cancelled");
  Frame chunk;
  chunk.type = FrameType::kArgChunk;
  chunk.call_id = "partial";
  chunk.data = args.substr(ipc::kChunkBytes);
  worker->Send(chunk);
  worker->ExpectSilence(absl::Milliseconds(300));
}

TEST_CASE("Over-long chunked arguments are ArgumentsDecodeError", "[worker]") {
  auto worker = ReadyWorker();
  const std::string args = Pickle("((b'z' * 1500000,), {})");
  Frame call;
  call.type = FrameType::kCall;
  call.call_id = "long";
  call.callable = "worker_fixture::length";
  call.encoding = 1;
  call.total_size = args.size() - 10;
  call.data = args.substr(0, ipc::kChunkBytes);
  worker->Send(call);
  Frame chunk;
  chunk.type = FrameType::kArgChunk;
  chunk.call_id = "long";
  chunk.data = args.substr(ipc::kChunkBytes);
  worker->Send(chunk);
  Reply reply = worker->AwaitReply("long", absl::Seconds(5));
  REQUIRE(reply.error.type == "ArgumentsDecodeError");
  REQUIRE(reply.error.code == 3);
  REQUIRE(reply.error.message ==
          absl::StrCat("received ", args.size(), " argument bytes, but "
                       "total_size is ", args.size() - 10));
  // The call is over: its later chunks are dropped.
  worker->Send(chunk);
  worker->ExpectSilence(absl::Milliseconds(300));
}

TEST_CASE("Large arguments and results travel in chunks", "[worker]") {
  auto worker = ReadyWorker();
  // 3 MiB of arguments: a call frame plus arg_chunk frames.
  std::string value = worker->CallOk("worker_fixture::length",
                                     Pickle("((b'y' * 3145728,), {})"));
  REQUIRE(Unpickle(value) == "3145728");

  // A 20 MiB result: result_chunks + the final result with total_size.
  worker->Call("big", "worker_fixture::big", Pickle("((20 * 1024 * 1024,), {})"));
  Reply reply = worker->AwaitReply("big", absl::Seconds(60));
  REQUIRE(reply.ok);
  REQUIRE(reply.chunks == 20);
  REQUIRE(reply.total_size == reply.value.size());
  REQUIRE(reply.total_size > 20u * 1024 * 1024);
  REQUIRE(Unpickle(reply.value, "len(v) == 20 * 1024 * 1024 and v == b'x' * len(v)") ==
          "True");
}

TEST_CASE("Encoding 2 (msgpack) in and out", "[worker]") {
  auto worker = ReadyWorker();
  std::string args = Msgpack([](auto& p) {
    p.pack_array(2);
    p.pack_array(2);
    p.pack(2);
    p.pack(3);
    p.pack_map(0);
  });
  std::string value = worker->CallOk("worker_fixture::add", args, 2);
  msgpack::object_handle result = msgpack::unpack(value.data(), value.size());
  REQUIRE(result.get().as<int>() == 5);

  args = Msgpack([](auto& p) {
    p.pack_array(2);
    p.pack_array(1);
    p.pack_array(4);
    p.pack(std::string("text"));
    p.pack(1.5);
    p.pack_nil();
    p.pack_bin(2);
    p.pack_bin_body("\x00\x01", 2);
    p.pack_map(0);
  });
  value = worker->CallOk("worker_fixture::echo", args, 2);
  // The echoed list is the arguments' inner array, byte for byte.
  REQUIRE(value.size() == args.size() - 3);
  REQUIRE(value == args.substr(2, value.size()));

  ipc::ErrorInfo e =
      worker->CallError("worker_fixture::unencodable_for_msgpack",
                        Msgpack([](auto& p) {
                          p.pack_array(2);
                          p.pack_array(0);
                          p.pack_map(0);
                        }),
                        2);
  REQUIRE(e.type == "ResultEncodeError");
  REQUIRE(e.message.rfind("failed to encode return value as msgpack", 0) == 0);

  e = worker->CallError("worker_fixture::add", "\xc1", 2);
  REQUIRE(e.type == "ArgumentsDecodeError");
}

TEST_CASE("Unknown encodings are refused", "[worker]") {
  auto worker = ReadyWorker();
  ipc::ErrorInfo e =
      worker->CallError("worker_fixture::add", Pickle("((1,), {})"), 7);
  REQUIRE(e.type == "UnsupportedEncoding");
  REQUIRE(e.code == 3);
  // Encoding 0 (unspecified) means pickle.
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::add",
                                  Pickle("((1,), {})"), 0)) == "1");
}

TEST_CASE("Many pipelined calls", "[worker][timing]") {
  auto worker = ReadyWorker();
  const std::string args = Pickle("((1, 2), {})");
  std::set<std::string> ids;
  std::string batch;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = absl::StrCat("p", i);
    ids.insert(id);
    Frame call;
    call.type = FrameType::kCall;
    call.call_id = id;
    call.callable = i % 2 ? "worker_fixture::async_add" : "worker_fixture::add";
    call.encoding = 1;
    call.data = args;
    call.total_size = args.size();
    REQUIRE_OK(ipc::AppendFrame(call, batch));
  }
  const absl::Time start = absl::Now();
  worker->SendRaw(batch);
  auto replies = worker->AwaitReplies(ids, absl::Seconds(30));
  WARN("1000 pipelined calls took " << absl::FormatDuration(absl::Now() - start));
  for (auto& [id, reply] : replies) {
    REQUIRE(reply.value == std::string("\x80\x05K\x03.", 5));
  }

  const absl::Time seq_start = absl::Now();
  for (int i = 0; i < 500; ++i) worker->CallOk("worker_fixture::async_add", args);
  WARN("sequential async round trip: "
       << absl::FormatDuration((absl::Now() - seq_start) / 500));
  const absl::Time sync_start = absl::Now();
  for (int i = 0; i < 500; ++i) worker->CallOk("worker_fixture::add", args);
  WARN("sequential sync round trip: "
       << absl::FormatDuration((absl::Now() - sync_start) / 500));
}

TEST_CASE("Shutdown cancels running calls and exits 0", "[worker]") {
  auto worker = ReadyWorker();
  worker->Call("stuck", "worker_fixture::sleep_sync", Pickle("((30,), {})"));
  worker->Call("waiting", "worker_fixture::sleep_async", Pickle("((30,), {})"));
  worker->ExpectSilence(absl::Milliseconds(100));
  const absl::Time start = absl::Now();
  worker->Shutdown();
  auto replies = worker->AwaitReplies({"stuck", "waiting"}, absl::Seconds(5));
  REQUIRE(replies["stuck"].error.type == "Cancelled");
  REQUIRE(replies["waiting"].error.type == "Cancelled");
  REQUIRE(worker->AwaitExit().returncode() == 0);
  REQUIRE(absl::Now() - start < absl::Seconds(5));
}

TEST_CASE("Shutdown of an idle worker exits 0 promptly", "[worker]") {
  auto worker = ReadyWorker();
  const absl::Time start = absl::Now();
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
  REQUIRE(absl::Now() - start < absl::Seconds(2));
}

TEST_CASE("End of stream exits 0", "[worker]") {
  auto worker = ReadyWorker();
  worker->Call("stuck", "worker_fixture::sleep_sync", Pickle("((30,), {})"));
  worker->CloseChannel();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

TEST_CASE("A garbage frame desynchronises: the worker exits non-zero",
          "[worker]") {
  auto worker = ReadyWorker();
  worker->SendRaw(std::string("\x04\x00\x00\x00\xc1\xc1\xc1\xc1", 8));
  const base::ExitStatus exit = worker->AwaitExit();
  REQUIRE(exit.returncode() == 4);
}

TEST_CASE("An oversized frame length desynchronises", "[worker]") {
  auto worker = ReadyWorker();
  worker->SendRaw(std::string("\xff\xff\xff\xff", 4));
  REQUIRE(worker->AwaitExit().returncode() == 4);
}

TEST_CASE("Boot failures send boot_error and exit 3", "[worker]") {
  WorkerArgs options;
  std::string expect;
  SECTION("bad --python-home") {
    options.args = {"--python-home", "/nonexistent/home"};
    expect = "/nonexistent/home";
  }
  SECTION("bad --venv") {
    options.args = {"--venv=/nonexistent/venv"};
    expect = "/nonexistent/venv";
  }
  SECTION("a home whose stdlib is broken") {
    // os.py is there, so the path check passes; CPython itself then fails
    // (no encodings package) and must not take the process down uncleanly.
    const std::string home = absl::StrCat(TempRoot(), "/broken_home");
    fs::create_directories(home + "/lib/python3.11");
    WriteFile(home + "/lib/python3.11/os.py", "");
    options.args = {"--python-home=" + home};
    expect = "Python initialisation failed";
  }
  Worker worker(options);
  REQUIRE_OK_AND_ASSIGN(Frame frame, worker.Next(absl::Seconds(20)));
  REQUIRE(frame.type == FrameType::kBootError);
  REQUIRE(frame.error.type == "WorkerBootError");
  INFO(frame.error.message);
  REQUIRE(frame.error.message.find(expect) != std::string::npos);
  REQUIRE(worker.AwaitExit().returncode() == 3);
}

TEST_CASE("--python-home: a relocated stdlib is used from its new place",
          "[worker]") {
  // A bundle-style tree: <home>/lib/python3.11 is Debian's stdlib, moved.
  // Like the bundler, it leaves out dist-packages (there once Debian's
  // python3-numpy or the like is installed), which site.py would add.
  const std::string home = absl::StrCat(TempRoot(), "/relocated/python");
  if (!fs::exists(home)) {
    const std::string stdlib = home + "/lib/python3.11";
    fs::create_directories(stdlib);
    for (const auto& entry : fs::directory_iterator("/usr/lib/python3.11")) {
      const std::string name = entry.path().filename().string();
      if (name == "dist-packages" || name == "site-packages") continue;
      fs::create_symlink(entry.path(), stdlib + "/" + name);
    }
  }
  WorkerArgs options;
  options.args = {"--python-home", home};
  auto worker = ReadyWorker(options);
  const std::string info =
      worker->CallOk("worker_fixture::interpreter_info", Pickle("((), {})"));
  REQUIRE(Unpickle(info, "v['prefix']") == home);
  REQUIRE(Unpickle(info, "v['os_file']") == home + "/lib/python3.11/os.py");
  const std::string path =
      worker->CallOk("worker_fixture::sys_path", Pickle("((), {})"));
  REQUIRE(Unpickle(path) ==
          absl::StrCat("['", FixtureDir(), "', '", home, "/lib/python3.11', '",
                       home, "/lib/python3.11/lib-dynload']"));
  // C extensions load from the relocated lib-dynload.
  REQUIRE(Unpickle(worker->CallOk("math::factorial", Pickle("((5,), {})"))) ==
          "120");
}

TEST_CASE("A missing channel fd exits 3 without hanging", "[worker]") {
  base::SpawnOptions spawn;
  spawn.path = WorkerBinary();
  spawn.argv = {spawn.path, "--channel-fd=1000"};
  spawn.env = {"PATH=/usr/bin:/bin"};
  REQUIRE_OK_AND_ASSIGN(base::ChildProcess child,
                        base::ChildProcess::Spawn(spawn));
  REQUIRE_OK_AND_ASSIGN(base::ExitStatus exit, child.AwaitExit(absl::Seconds(10)));
  REQUIRE(exit.returncode() == 3);
}

TEST_CASE("The worker boots and serves under a low open-file limit",
          "[worker]") {
  // The channel's fd number must be valid under `ulimit -n 64`; the limit is
  // inherited by the worker and restored here once it is spawned.
  struct rlimit saved {};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
  struct rlimit low = saved;
  low.rlim_cur = 64;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  auto worker = std::make_unique<Worker>();
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &saved) == 0);
  worker->AwaitReady();
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::add",
                                  Pickle("((1, 2), {})"))) == "3");
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

TEST_CASE("The worker and its children hold no fd of the spawner's",
          "[worker]") {
  // A stray fd of the test (as a daemon's socket it forgot to mark CLOEXEC).
  const std::string secret = absl::StrCat(TempRoot(), "/secret-", getpid());
  WriteFile(secret, "s3cret");
  base::UniqueFd stray(::open(secret.c_str(), O_RDONLY));
  REQUIRE(stray.valid());
  auto worker = ReadyWorker();
  const std::string fds =
      worker->CallOk("worker_fixture::open_fds", Pickle("((), {})"));
  INFO(Unpickle(fds));
  CHECK(Unpickle(fds, absl::StrCat("'", secret, "' not in str(v['worker'])")) ==
        "True");
  // A process the user code starts without close_fds gets stdio only: the
  // channel is close-on-exec.
  CHECK(Unpickle(fds, "v['child']") == "[0, 1, 2]");
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

// A venv made by Debian's python3 at test time, with a module and a .pth.
std::string MakeVenv(const std::string& name, bool system_site) {
  const std::string dir = absl::StrCat(TempRoot(), "/", name);
  if (!fs::exists(dir + "/pyvenv.cfg")) {
    std::vector<std::string> args = {"-m", "venv", "--without-pip"};
    if (system_site) args.push_back("--system-site-packages");
    args.push_back(dir);
    RunPython(args);
    const std::string site = dir + "/lib/python3.11/site-packages";
    WriteFile(site + "/venv_marker.py", "def where():\n    return __file__\n");
    fs::create_directories(dir + "/pth_target");
    WriteFile(site + "/agentix_test.pth", dir + "/pth_target\n");
  }
  return dir;
}

void CheckVenvWorker(const std::string& venv) {
  WorkerArgs options;
  options.args = {"--venv", venv};
  auto worker = ReadyWorker(options);
  REQUIRE(Unpickle(worker->CallOk("venv_marker::where", Pickle("((), {})"))) ==
          absl::StrCat("'", venv, "/lib/python3.11/site-packages/venv_marker.py'"));
  const std::string info =
      worker->CallOk("worker_fixture::interpreter_info", Pickle("((), {})"));
  REQUIRE(Unpickle(info, "v['executable']") == venv + "/bin/python3");
  REQUIRE(Unpickle(info, "v['prefix']") == venv);
  REQUIRE(Unpickle(info, "v['base_prefix']") == "/usr");
  // sys.path is exactly what the venv's own python has (minus the missing
  // python311.zip), with the import roots in front.
  const std::string path =
      worker->CallOk("worker_fixture::sys_path", Pickle("((), {})"));
  REQUIRE(Unpickle(path) ==
          RunPython({"-c",
                     "import sys\n"
                     "print(repr([sys.argv[1]] + [p for p in sys.path "
                     "if not p.endswith('.zip')]), end='')",
                     FixtureDir()},
                    venv + "/bin/python3"));
}

TEST_CASE("A venv's site-packages and .pth files are used", "[worker][venv]") {
  const std::string venv = MakeVenv("venv_plain", /*system_site=*/false);
  CheckVenvWorker(venv);
  WorkerArgs options;
  options.args = {"--venv", venv};
  auto worker = ReadyWorker(options);
  const std::string path =
      worker->CallOk("worker_fixture::sys_path", Pickle("((), {})"));
  REQUIRE(Unpickle(path, "'/usr/lib/python3/dist-packages' in v") == "False");
  REQUIRE(Unpickle(path, "v[-1].endswith('/pth_target')") == "True");
}

TEST_CASE("A --system-site-packages venv also sees Debian's dist-packages",
          "[worker][venv]") {
  const std::string venv = MakeVenv("venv_system", /*system_site=*/true);
  CheckVenvWorker(venv);
  WorkerArgs options;
  options.args = {"--venv", venv};
  auto worker = ReadyWorker(options);
  const std::string path =
      worker->CallOk("worker_fixture::sys_path", Pickle("((), {})"));
  REQUIRE(Unpickle(path, "'/usr/lib/python3/dist-packages' in v") == "True");
}

// ---- streaming calls --------------------------------------------------------

// pickle.dumps(i, protocol=5) for 0 <= i < 256, and of None / True.
std::string PickledSmallInt(int i) {
  return absl::StrCat("\x80\x05K", std::string(1, static_cast<char>(i)), ".");
}
const std::string kPickledNone("\x80\x05N.", 4);
const std::string kPickledTrue("\x80\x05\x88.", 4);

// Whether generator `tag` of worker_fixture ran its `finally`, polled
// (bounded) because a pool thread closes it after Cancelled is sent.
bool GeneratorClosed(Worker& worker, const std::string& tag) {
  const std::string args = Pickle(absl::StrCat("(('", tag, "',), {})"));
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (worker.CallOk("worker_fixture::closed", args) != kPickledTrue) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

TEST_CASE("Streaming calls send every item, then the return value",
          "[worker][stream]") {
  auto worker = ReadyWorker();
  std::string callable;
  std::string result = kPickledNone;
  SECTION("async generator") { callable = "worker_fixture::agen_count"; }
  SECTION("sync generator") {
    callable = "worker_fixture::gen_count";
    result = Pickle("'done'");
  }
  SECTION("a function returning an iterable") {
    callable = "worker_fixture::list_of";
  }
  SECTION("a coroutine returning an async iterator") {
    callable = "worker_fixture::returns_agen";
  }
  SECTION("a coroutine returning an iterable") {
    callable = "worker_fixture::returns_list";
  }
  SECTION("a function returning an async iterator") {
    callable = "worker_fixture::agen_from_sync";
  }
  CAPTURE(callable);
  worker->Call("st", callable, Pickle("((20,), {})"), 1, /*stream_window=*/4);
  StreamReply stream = worker->AwaitStream("st");
  INFO(stream.end.error.type << ": " << stream.end.error.message << "\n"
                             << stream.end.error.traceback);
  REQUIRE(stream.end.ok);
  REQUIRE(stream.end.value == result);
  REQUIRE(stream.end.total_size == result.size());
  REQUIRE(stream.items.size() == 20);
  for (int i = 0; i < 20; ++i) REQUIRE(stream.items[i] == PickledSmallInt(i));
  // An ack for an unknown or finished call is ignored.
  worker->Ack("st", 30);
  worker->Ack("never-started", 1);
  worker->ExpectSilence(absl::Milliseconds(100));
}

TEST_CASE("Stream items use the call's encoding (msgpack)",
          "[worker][stream]") {
  auto worker = ReadyWorker();
  worker->Call("mp", "worker_fixture::gen_count", Msgpack([](auto& p) {
                 p.pack_array(2);
                 p.pack_array(1);
                 p.pack(3);
                 p.pack_map(0);
               }),
               2, /*stream_window=*/8);
  StreamReply stream = worker->AwaitStream("mp");
  REQUIRE(stream.end.ok);
  REQUIRE(stream.end.value == absl::StrCat("\xa4", "done"));  // fixstr
  REQUIRE(stream.items ==
          std::vector<std::string>{std::string(1, '\0'), "\x01", "\x02"});
}

TEST_CASE("The window bounds the items sent ahead of the acks",
          "[worker][stream]") {
  auto worker = ReadyWorker();
  std::string callable =
      GENERATE("worker_fixture::agen_count", "worker_fixture::gen_count");
  CAPTURE(callable);
  worker->Call("w", callable, Pickle("((5,), {})"), 1, /*stream_window=*/2);
  REQUIRE(worker->NextItem("w", 0) == PickledSmallInt(0));
  REQUIRE(worker->NextItem("w", 1) == PickledSmallInt(1));
  // Without an ack nothing more comes, and the call does not finish.
  worker->ExpectSilence(absl::Milliseconds(300));
  worker->Ack("w", 1);
  REQUIRE(worker->NextItem("w", 2) == PickledSmallInt(2));
  worker->ExpectSilence(absl::Milliseconds(100));
  // Acks that go backwards change nothing.
  worker->Ack("w", 0);
  worker->ExpectSilence(absl::Milliseconds(100));
  worker->Ack("w", 3);
  REQUIRE(worker->NextItem("w", 3) == PickledSmallInt(3));
  REQUIRE(worker->NextItem("w", 4) == PickledSmallInt(4));
  // Exhaustion is found only by asking for item 5, which needs credit too.
  worker->ExpectSilence(absl::Milliseconds(100));
  worker->Ack("w", 5);
  Reply end = worker->AwaitReply("w", absl::Seconds(5));
  REQUIRE(end.ok);
}

TEST_CASE("An exception ends a stream with an error after its items",
          "[worker][stream]") {
  auto worker = ReadyWorker();
  std::string callable = GENERATE("worker_fixture::gen_then_fail",
                                  "worker_fixture::agen_then_fail");
  CAPTURE(callable);
  worker->Call("f", callable, Pickle("((3,), {})"), 1, /*stream_window=*/8);
  StreamReply stream = worker->AwaitStream("f");
  REQUIRE(stream.items.size() == 3);
  REQUIRE_FALSE(stream.end.ok);
  REQUIRE(stream.end.error.type == "ValueError");
  REQUIRE(stream.end.error.message == "failed after 3");
  REQUIRE(stream.end.error.code == 2);
  REQUIRE_FALSE(stream.end.error.cancelled);
  REQUIRE(stream.end.error.traceback.find("worker_fixture.py") !=
          std::string::npos);
  REQUIRE(stream.end.error.traceback.find("driver.py") == std::string::npos);
}

TEST_CASE("Cancelling a stream answers Cancelled and closes the generator",
          "[worker][stream]") {
  auto worker = ReadyWorker();
  std::string callable;
  std::string tag;
  std::string args;
  SECTION("async generator waiting for credit") {
    callable = "worker_fixture::agen_forever";
    tag = "cancel-async";
    args = Pickle("(('cancel-async',), {})");
  }
  SECTION("sync generator waiting for credit") {
    callable = "worker_fixture::gen_forever";
    tag = "cancel-sync";
    args = Pickle("(('cancel-sync',), {})");
  }
  SECTION("sync generator blocked in next()") {
    callable = "worker_fixture::gen_forever";
    tag = "cancel-blocked";
    args = Pickle("(('cancel-blocked', 0.3), {})");
  }
  CAPTURE(callable, tag);
  worker->Call("c", callable, args, 1, /*stream_window=*/2);
  worker->NextItem("c", 0);
  if (tag != "cancel-blocked") worker->NextItem("c", 1);
  worker->Cancel("c");
  Reply reply = worker->AwaitReply("c", absl::Seconds(5));
  REQUIRE(reply.error.type == "Cancelled");
  REQUIRE(reply.error.code == 1);
  REQUIRE(reply.error.cancelled);
  // Acks after the cancel wake nothing: no more frames for the call.
  worker->Ack("c", 10);
  worker->ExpectSilence(absl::Milliseconds(500));
  REQUIRE(GeneratorClosed(*worker, tag));
  worker->ExpectSilence(absl::Milliseconds(100));
}

TEST_CASE("An unencodable item fails the stream and closes the generator",
          "[worker][stream]") {
  auto worker = ReadyWorker();
  worker->Call("u", "worker_fixture::gen_unpicklable",
               Pickle("(('unpicklable',), {})"), 1, /*stream_window=*/8);
  StreamReply stream = worker->AwaitStream("u");
  REQUIRE(stream.items == std::vector<std::string>{PickledSmallInt(1)});
  REQUIRE(stream.end.error.type == "ResultEncodeError");
  REQUIRE(stream.end.error.code == 3);
  REQUIRE(stream.end.error.message.rfind("failed to pickle stream item 1: ",
                                         0) == 0);
  REQUIRE(GeneratorClosed(*worker, "unpicklable"));
}

TEST_CASE("A generator from an ordinary call is ResultEncodeError",
          "[worker][stream]") {
  auto worker = ReadyWorker();
  std::string callable =
      GENERATE("worker_fixture::gen_count", "worker_fixture::agen_count",
               "worker_fixture::returns_agen");
  CAPTURE(callable);
  ipc::ErrorInfo e = worker->CallError(callable, Pickle("((3,), {})"));
  REQUIRE(e.type == "ResultEncodeError");
  REQUIRE(e.code == 3);
  INFO(e.message);
  REQUIRE(e.message.find("remote_stream()") != std::string::npos);
  REQUIRE(e.message.find(callable) != std::string::npos);
}

TEST_CASE("A streaming call of a non-iterator is TypeError",
          "[worker][stream]") {
  auto worker = ReadyWorker();
  std::string callable;
  std::string args = Pickle("((1, 2), {})");
  std::string type = "int";
  SECTION("sync function") { callable = "worker_fixture::add"; }
  SECTION("coroutine function") { callable = "worker_fixture::async_add"; }
  SECTION("a str is not streamed") {
    callable = "worker_fixture::echo";
    args = Pickle("(('text',), {})");
    type = "str";
  }
  worker->Call("t", callable, args, 1, /*stream_window=*/4);
  Reply reply = worker->AwaitReply("t");
  REQUIRE(reply.error.type == "TypeError");
  REQUIRE(reply.error.code == 3);
  REQUIRE(reply.error.message ==
          absl::StrCat("remote_stream target '", callable, "' returned ", type,
                       ", not an iterator; use remote()"));
  // A bad argument binding is the user's TypeError, as for ordinary calls.
  worker->Call("b", "worker_fixture::gen_count", Pickle("((), {})"), 1, 4);
  reply = worker->AwaitReply("b");
  REQUIRE(reply.error.type == "TypeError");
  REQUIRE(reply.error.code == 2);
}

TEST_CASE("Shutdown cancels streams and exits 0 promptly", "[worker][stream]") {
  auto worker = ReadyWorker();
  worker->Call("sa", "worker_fixture::agen_forever", Pickle("(('sa',), {})"), 1,
               /*stream_window=*/1);
  worker->Call("ss", "worker_fixture::gen_forever", Pickle("(('ss',), {})"), 1,
               /*stream_window=*/1);
  std::set<std::string> first;
  for (int i = 0; i < 2; ++i) {
    REQUIRE_OK_AND_ASSIGN(Frame item, worker->Next(absl::Seconds(10)));
    REQUIRE(item.type == FrameType::kStreamItem);
    first.insert(item.call_id);
  }
  REQUIRE(first == std::set<std::string>{"sa", "ss"});
  const absl::Time start = absl::Now();
  worker->Shutdown();
  auto replies = worker->AwaitReplies({"sa", "ss"}, absl::Seconds(5));
  REQUIRE(replies["sa"].error.type == "Cancelled");
  REQUIRE(replies["ss"].error.type == "Cancelled");
  REQUIRE(worker->AwaitExit().returncode() == 0);
  REQUIRE(absl::Now() - start < absl::Seconds(3));
}

// ---- logs -------------------------------------------------------------------

// The records of `logger` among `logs`.
std::vector<ipc::LogEntry> LogsOf(const std::vector<ipc::LogEntry>& logs,
                                  const std::string& logger) {
  std::vector<ipc::LogEntry> out;
  for (const ipc::LogEntry& log : logs) {
    if (log.logger == logger) out.push_back(log);
  }
  return out;
}

// Waits until `logger` has a record with `message`; returns it.
ipc::LogEntry AwaitLog(Worker& worker, const std::string& logger,
                       const std::string& message) {
  ipc::LogEntry found;
  const bool ok = worker.AwaitLogs([&](const std::vector<ipc::LogEntry>& logs) {
    for (const ipc::LogEntry& log : logs) {
      if (log.logger == logger && log.message == message) {
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

const std::string kStdout = "agentix.sandbox.stdout";
const std::string kStderr = "agentix.sandbox.stderr";

// The msgpack map `extras` as key -> the value's msgpack text form.
std::map<std::string, std::string> Extras(const std::string& extras) {
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

TEST_CASE("logging records become log frames with the call's id",
          "[worker][logs]") {
  auto worker = ReadyWorker();
  const int64_t before = absl::ToUnixNanos(absl::Now());
  worker->Call("lw", "worker_fixture::log_warning", Pickle("((), {})"));
  REQUIRE(worker->AwaitReply("lw").ok);
  ipc::LogEntry log = AwaitLog(*worker, "app", "x 1");
  CHECK(log.level == 30);
  CHECK(log.level_name == "WARNING");
  CHECK(log.call_id == "lw");
  CHECK(log.origin == 1);
  CHECK(log.module == "worker_fixture");
  CHECK(log.function == "log_warning");
  CHECK(absl::EndsWith(log.file, "worker_fixture.py"));
  CHECK(log.line > 0);
  CHECK(log.exception_text.empty());
  CHECK(log.time_unix_nanos >= before - 1000000000);
  CHECK(log.time_unix_nanos <= absl::ToUnixNanos(absl::Now()));
  CHECK(absl::StartsWith(log.context, "sandbox-"));
  CHECK(absl::EndsWith(log.context, "-worker-test-worker"));
  CHECK(Extras(log.extras) == std::map<std::string, std::string>{{"k", "1"}});

  worker->Call("le", "worker_fixture::log_exception", Pickle("((), {})"));
  REQUIRE(worker->AwaitReply("le").ok);
  log = AwaitLog(*worker, "app", "failed");
  CHECK(log.level_name == "ERROR");
  CHECK(log.call_id == "le");
  CHECK(absl::StrContains(log.exception_text, "Traceback"));
  CHECK(absl::StrContains(log.exception_text, "ValueError: boom"));

  // A coroutine's records and prints carry its id too.
  worker->Call("la", "worker_fixture::log_async", Pickle("(('t',), {})"));
  REQUIRE(worker->AwaitReply("la").ok);
  CHECK(AwaitLog(*worker, "app.async", "async t").call_id == "la");
  CHECK(AwaitLog(*worker, kStdout, "async print t").call_id == "la");
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

TEST_CASE("Extras are coerced; agentix.sio is forwarded, agentix.utils.log stays",
          "[worker][logs]") {
  auto worker = ReadyWorker();
  worker->Call("x", "worker_fixture::log_extras", Pickle("((), {})"));
  REQUIRE(worker->AwaitReply("x").ok);
  ipc::LogEntry log = AwaitLog(*worker, "app", "extras");
  std::map<std::string, std::string> extras = Extras(log.extras);
  CHECK(extras["num"] == "2");
  CHECK(extras["text"] == "\"t\"");
  CHECK(extras["seq"] == "[1,[2,\"BIN(size:1)\"]]");
  CHECK(extras["mapping"] == "{\"3\":null}");
  CHECK(extras["obj"] == "\"<class 'object'>\"");
  CHECK(extras.count("_hidden") == 0);
  CHECK(extras.size() == 5);
  AwaitLog(*worker, "agentix.other", "forwarded");
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
  CHECK(LogsOf(worker->logs(), "agentix.sio.ns").size() == 1);
  CHECK(LogsOf(worker->logs(), "agentix.utils.log").empty());
}

TEST_CASE("print, fd writes and child processes become stdout/stderr logs",
          "[worker][logs]") {
  auto worker = ReadyWorker();
  worker->Call("pr", "worker_fixture::print_lines", Pickle("((), {})"));
  REQUIRE(worker->AwaitReply("pr").ok);
  ipc::LogEntry log = AwaitLog(*worker, kStdout, "hi");
  // Python-level writes are attributed to the call.
  CHECK(log.call_id == "pr");
  CHECK(log.origin == 2);
  CHECK(log.level == 20);
  CHECK(log.level_name == "INFO");
  CHECK(log.module == "stdio");
  CHECK(Extras(log.extras) ==
        std::map<std::string, std::string>{
            {"agentix_stream", "\"stdout\""},
            {"worker_id", "\"test-worker\""}});
  log = AwaitLog(*worker, kStderr, "to stderr");
  CHECK(log.call_id == "pr");
  CHECK(log.origin == 3);
  CHECK(AwaitLog(*worker, kStdout, "partial").call_id == "pr");

  worker->Call("fd", "worker_fixture::write_fds", Pickle("((), {})"));
  REQUIRE(worker->AwaitReply("fd").ok);
  log = AwaitLog(*worker, kStdout, "raw");
  // fd-level output cannot be attributed.
  CHECK(log.call_id.empty());
  CHECK(log.origin == 2);
  CHECK(absl::StartsWith(log.context, "sandbox-"));
  CHECK(AwaitLog(*worker, kStderr, "raw err").origin == 3);
  AwaitLog(*worker, kStdout, "bad \xEF\xBF\xBD utf8");

  worker->Call("ch", "worker_fixture::run_child", Pickle("((), {})"));
  Reply reply = worker->AwaitReply("ch");
  INFO(reply.error.message << reply.error.traceback);
  REQUIRE(reply.ok);
  AwaitLog(*worker, kStdout, "hi");
  CHECK(AwaitLog(*worker, kStderr, "err").call_id.empty());
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

TEST_CASE("A line over 64 KiB is cut; the rest comes at the end",
          "[worker][logs]") {
  auto worker = ReadyWorker();
  worker->Call("ll", "worker_fixture::long_line",
               Pickle("((70 * 1024,), {})"));
  REQUIRE(worker->AwaitReply("ll").ok);
  AwaitLog(*worker, kStdout, std::string(65536, 'y'));
  // The remainder (no newline) is flushed when the worker shuts down.
  worker->Shutdown();
  AwaitLog(*worker, kStdout, std::string(70 * 1024 - 65536, 'y'));
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

TEST_CASE("A burst of output does not block the call", "[worker][logs]") {
  auto worker = ReadyWorker();
  const absl::Time start = absl::Now();
  worker->Call("b", "worker_fixture::burst", Pickle("((100000,), {})"));
  Reply reply = worker->AwaitReply("b", absl::Seconds(30));
  INFO(reply.error.message << reply.error.traceback);
  REQUIRE(reply.ok);
  WARN("burst of 3 x 100000 bytes took "
       << absl::FormatDuration(absl::Now() - start));
  auto count = [](const std::vector<ipc::LogEntry>& logs, char c) {
    size_t n = 0;
    for (const ipc::LogEntry& log : logs) {
      if (log.logger == kStdout && !log.message.empty() &&
          log.message[0] == c) {
        n += log.message.size();
      }
    }
    return n;
  };
  REQUIRE(worker->AwaitLogs([&](const std::vector<ipc::LogEntry>& logs) {
    return count(logs, 'b') == 99000 && count(logs, 'f') == 99000 &&
           count(logs, 'c') == 100000;
  }));
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

TEST_CASE("Records keep their order per producer", "[worker][logs]") {
  auto worker = ReadyWorker();
  constexpr int kCount = 300;
  worker->Call("o", "worker_fixture::ordered",
               Pickle(absl::StrCat("((", kCount, ",), {})")));
  REQUIRE(worker->AwaitReply("o").ok);
  REQUIRE(worker->AwaitLogs([&](const std::vector<ipc::LogEntry>& logs) {
    return LogsOf(logs, "app.order").size() == kCount &&
           LogsOf(logs, kStdout).size() == 2 * kCount;
  }));
  std::vector<ipc::LogEntry> records = LogsOf(worker->logs(), "app.order");
  std::vector<std::string> prints, fds;
  for (const ipc::LogEntry& log : LogsOf(worker->logs(), kStdout)) {
    (absl::StartsWith(log.message, "print") ? prints : fds)
        .push_back(log.message);
  }
  REQUIRE(prints.size() == kCount);
  REQUIRE(fds.size() == kCount);
  for (int i = 0; i < kCount; ++i) {
    CHECK(records[i].message == absl::StrCat("seq ", i));
    CHECK(records[i].call_id == "o");
    CHECK(prints[i] == absl::StrCat("print ", i));
    CHECK(fds[i] == absl::StrCat("fd ", i));
  }
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

TEST_CASE("The durable log file gets records and captured output",
          "[worker][logs]") {
  const std::string dir = absl::StrCat(TempRoot(), "/durable-", getpid());
  fs::remove_all(dir);
  WorkerArgs args;
  args.env.push_back("AGENTIX_LOG_DIR=" + dir + "/nested");
  auto worker = ReadyWorker(args);
  worker->Call("p", "worker_fixture::print_lines", Pickle("((), {})"));
  REQUIRE(worker->AwaitReply("p").ok);
  worker->Call("f", "worker_fixture::write_fds", Pickle("((), {})"));
  REQUIRE(worker->AwaitReply("f").ok);
  worker->Call("l", "worker_fixture::log_warning", Pickle("((), {})"));
  REQUIRE(worker->AwaitReply("l").ok);
  worker->Call("r", "worker_fixture::log_raw_record", Pickle("((), {})"));
  REQUIRE(worker->AwaitReply("r").ok);
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
  const std::string text = ReadFile(dir + "/nested/sandbox-test-worker.log");
  // A record made without the worker's record factory gets the context.
  CHECK(absl::StrContains(text, "-worker-test-worker] [app.raw] raw record\n"));
  INFO(text);
  CHECK(absl::StrContains(text, "[agentix.sandbox.stdout] hi\n"));
  CHECK(absl::StrContains(text, "[agentix.sandbox.stderr] to stderr\n"));
  CHECK(absl::StrContains(text, "[agentix.sandbox.stdout] raw\n"));
  CHECK(absl::StrContains(text, "[agentix.sandbox.stderr] raw err\n"));
  CHECK(absl::StrContains(text, "-worker-test-worker] [app] x 1\n"));
  fs::remove_all(dir);
}

TEST_CASE("The durable log rotates by bytes, keeping whole lines",
          "[worker][logs]") {
  const std::string dir = absl::StrCat(TempRoot(), "/rotate-", getpid());
  fs::remove_all(dir);
  WorkerArgs args;
  args.env.push_back("AGENTIX_LOG_DIR=" + dir);
  auto worker = ReadyWorker(args);
  constexpr int kRecords = 300;
  constexpr int kMaxBytes = 8192;
  worker->Call("r", "worker_fixture::durable_rotation",
               Pickle(absl::StrCat("((", kRecords, ", ", kMaxBytes, "), {})")));
  REQUIRE(worker->AwaitReply("r").ok);
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
  const std::string path = dir + "/sandbox-test-worker.log";
  const std::string backup = ReadFile(path + ".1");
  const std::string current = ReadFile(path);
  // Each file stays under the limit in bytes (the records hold two-byte
  // characters), and together they end with the last records, in order.
  CHECK(backup.size() < kMaxBytes);
  CHECK(current.size() < kMaxBytes);
  const std::regex line(
      R"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \[[^\]]*-worker-test-worker\] )"
      R"(\[app\.rotate\] rotate (\d{4}) (\xC3\xA9){40})");
  int expected = -1;
  for (const std::string* text : {&backup, &current}) {
    std::istringstream lines(*text);
    std::string one;
    while (std::getline(lines, one)) {
      std::smatch match;
      if (!std::regex_match(one, match, line)) continue;  // earlier records
      const int index = std::stoi(match[1]);
      if (expected >= 0) CHECK(index == expected);
      expected = index + 1;
    }
    CHECK(text->back() == '\n');
  }
  CHECK(expected == kRecords);
  fs::remove_all(dir);
}

TEST_CASE("AGENTIX_LOG_DIR=\"\" disables the durable log", "[worker][logs]") {
  const std::string id = absl::StrCat("nolog-", getpid());
  WorkerArgs args;
  args.args.push_back("--worker-id=" + id);
  args.env.push_back("AGENTIX_LOG_DIR=");
  auto worker = ReadyWorker(args);
  worker->Call("p", "worker_fixture::print_lines", Pickle("((), {})"));
  REQUIRE(worker->AwaitReply("p").ok);
  AwaitLog(*worker, kStdout, "hi");
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
  // Empty is not unset: the default directory is not used either.
  CHECK_FALSE(fs::exists("/tmp/agentix/sandbox-" + id + ".log"));
  CHECK_FALSE(fs::exists("sandbox-" + id + ".log"));
  // No record says the file was detached: it was never wanted.
  for (const ipc::LogEntry& log : worker->logs()) {
    CHECK_FALSE(absl::StrContains(log.message, "durable sandbox log"));
  }
}

TEST_CASE("An unusable log dir detaches the durable log with one record",
          "[worker][logs]") {
  const std::string file = absl::StrCat(TempRoot(), "/not-a-dir-", getpid());
  WriteFile(file, "x");
  WorkerArgs args;
  args.env.push_back("AGENTIX_LOG_DIR=" + file);
  auto worker = ReadyWorker(args);
  REQUIRE(worker->AwaitLogs([](const std::vector<ipc::LogEntry>& logs) {
    for (const ipc::LogEntry& l : logs) {
      if (l.logger == kStderr &&
          absl::StartsWith(l.message, "agentix: durable sandbox log detached")) {
        return true;
      }
    }
    return false;
  }));
  // Calls work as usual.
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::add",
                                  Pickle("((1, 2), {})"))) == "3");
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
  fs::remove(file);
}

// Mode bits of `path` (lstat).
mode_t ModeOf(const std::string& path) {
  struct stat st {};
  REQUIRE(::lstat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

// Starts a worker with AGENTIX_LOG_DIR=`dir`, waits for the one record that
// says the durable log was refused, and checks that calls still work.
void ExpectLogRefused(const std::string& dir, const std::string& reason) {
  WorkerArgs args;
  args.env.push_back("AGENTIX_LOG_DIR=" + dir);
  auto worker = ReadyWorker(args);
  std::string said;
  REQUIRE(worker->AwaitLogs([&](const std::vector<ipc::LogEntry>& logs) {
    for (const ipc::LogEntry& l : logs) {
      if (l.logger == kStderr &&
          absl::StartsWith(l.message,
                           "agentix: durable sandbox log detached: refusing")) {
        said = l.message;
        return true;
      }
    }
    return false;
  }));
  INFO(said);
  CHECK(absl::StrContains(said, reason));
  CHECK(absl::StrContains(said, "AGENTIX_LOG_DIR"));
  worker->Call("p", "worker_fixture::print_lines", Pickle("((), {})"));
  REQUIRE(worker->AwaitReply("p").ok);
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::add",
                                  Pickle("((1, 2), {})"))) == "3");
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

TEST_CASE("A fresh durable log dir is 0700 and the log file 0600",
          "[worker][logs]") {
  const std::string dir = absl::StrCat(TempRoot(), "/private-", getpid());
  fs::remove_all(dir);
  const mode_t old_umask = ::umask(0);  // the modes must not rely on a umask
  WorkerArgs args;
  args.env.push_back("AGENTIX_LOG_DIR=" + dir);
  auto worker = ReadyWorker(args);
  ::umask(old_umask);
  worker->Call("p", "worker_fixture::print_lines", Pickle("((), {})"));
  REQUIRE(worker->AwaitReply("p").ok);
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
  CHECK(ModeOf(dir) == 0700);
  CHECK(ModeOf(dir + "/sandbox-test-worker.log") == 0600);
  fs::remove_all(dir);
}

TEST_CASE("A durable log dir others can write to is refused",
          "[worker][logs]") {
  const std::string dir = absl::StrCat(TempRoot(), "/open-", getpid());
  fs::remove_all(dir);
  fs::create_directory(dir);
  REQUIRE(::chmod(dir.c_str(), 01777) == 0);  // like /tmp
  ExpectLogRefused(dir, "is writable by group or others (mode 1777)");
  CHECK_FALSE(fs::exists(dir + "/sandbox-test-worker.log"));
  fs::remove_all(dir);
}

TEST_CASE("A durable log dir owned by another uid is refused",
          "[worker][logs]") {
  const std::string dir = absl::StrCat(TempRoot(), "/theirs-", getpid());
  fs::remove_all(dir);
  fs::create_directory(dir);
  // Pre-created by someone else (the test runs as root, which can chown).
  REQUIRE(::chown(dir.c_str(), 65534, 65534) == 0);
  REQUIRE(::chmod(dir.c_str(), 0700) == 0);
  ExpectLogRefused(dir, "is owned by uid 65534");
  CHECK_FALSE(fs::exists(dir + "/sandbox-test-worker.log"));
  fs::remove_all(dir);
}

TEST_CASE("A symlink as the durable log dir is refused", "[worker][logs]") {
  const std::string target = absl::StrCat(TempRoot(), "/target-", getpid());
  const std::string link = absl::StrCat(TempRoot(), "/link-", getpid());
  fs::remove_all(target);
  fs::remove(link);
  fs::create_directory(target);
  REQUIRE(::chmod(target.c_str(), 0700) == 0);
  fs::create_directory_symlink(target, link);
  ExpectLogRefused(link, "is a symlink");
  CHECK(fs::is_empty(target));
  fs::remove(link);
  fs::remove_all(target);
}

TEST_CASE("A planted log file (symlink, hard link, another uid's) is refused",
          "[worker][logs]") {
  const std::string dir = absl::StrCat(TempRoot(), "/planted-", getpid());
  const std::string log = dir + "/sandbox-test-worker.log";
  const std::string victim = dir + "/victim";
  fs::remove_all(dir);
  fs::create_directory(dir);
  REQUIRE(::chmod(dir.c_str(), 0700) == 0);
  WriteFile(victim, "");
  SECTION("symlink") {
    fs::create_symlink(victim, log);
    ExpectLogRefused(dir, "is a symlink");
  }
  SECTION("hard link") {
    fs::create_hard_link(victim, log);
    ExpectLogRefused(dir, "has 2 hard links");
  }
  SECTION("another uid's file") {
    WriteFile(log, "");
    REQUIRE(::chown(log.c_str(), 65534, 65534) == 0);
    ExpectLogRefused(dir, "is owned by uid 65534");
    CHECK(ReadFile(log).empty());
  }
  CHECK(ReadFile(victim).empty());
  fs::remove_all(dir);
}

TEST_CASE("A forked child's output is captured; its records are dropped",
          "[worker][logs]") {
  auto worker = ReadyWorker();
  worker->Call("fk", "worker_fixture::fork_child", Pickle("((), {})"));
  REQUIRE(worker->AwaitReply("fk").ok);
  CHECK(AwaitLog(*worker, kStdout, "printed in a forked child").call_id.empty());
  CHECK(AwaitLog(*worker, "app", "parent after fork").call_id == "fk");
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
  CHECK(LogsOf(worker->logs(), "app.child").empty());
}

// ---- traces -----------------------------------------------------------------

// A worker that can import agentix: the fixtures plus the built wheel (a zip
// on sys.path), whose agentix.utils.trace is what sandbox code uses.
std::unique_ptr<Worker> TracingWorker() {
  std::string wheel;
  for (const auto& entry : fs::directory_iterator(Runfile("host/python"))) {
    if (entry.path().extension() == ".whl") wheel = entry.path().string();
  }
  REQUIRE_FALSE(wheel.empty());
  WorkerArgs options;
  options.python_path = false;
  options.args = {absl::StrCat("--python-path=", FixtureDir(), ":", wheel)};
  return ReadyWorker(options);
}

msgpack::object_handle Unpack(const std::string& bytes) {
  REQUIRE_FALSE(bytes.empty());
  return msgpack::unpack(bytes.data(), bytes.size());
}

const ipc::TraceEntry* FindSpan(const std::vector<ipc::TraceEntry>& traces,
                                int kind, const std::string& name) {
  for (const ipc::TraceEntry& t : traces) {
    if (t.kind == kind && t.name == name) return &t;
  }
  return nullptr;
}

TEST_CASE("agentix.trace traces and spans become trace frames in order",
          "[worker][trace]") {
  auto worker = TracingWorker();
  CHECK(Unpickle(worker->CallOk("worker_fixture::trace_processors",
                                Pickle("((), {})"))) ==
        "['_TraceForwarder']");
  const int64_t before = absl::ToUnixNanos(absl::Now());
  worker->Call("tr", "worker_fixture::traced", Pickle("((), {})"));
  Reply reply = worker->AwaitReply("tr");
  INFO(reply.error.message << reply.error.traceback);
  REQUIRE(reply.ok);
  const int64_t after = absl::ToUnixNanos(absl::Now());
  const std::string trace_id = Unpickle(reply.value, "v[0]");
  const std::string outer_id = Unpickle(reply.value, "v[1]");
  const std::string inner_id = Unpickle(reply.value, "v[2]");
  REQUIRE(worker->AwaitTraces(6));
  const std::vector<ipc::TraceEntry>& t = worker->traces();
  REQUIRE(t.size() == 6);
  const std::vector<std::pair<int, std::string>> want = {
      {1, "t"}, {3, "outer"}, {3, "inner"}, {4, "inner"}, {4, "outer"},
      {2, ""}};
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("event " << i);
    CHECK(t[i].kind == want[i].first);
    CHECK(t[i].name == want[i].second);
    CHECK(t[i].trace_id == trace_id);
    CHECK(t[i].call_id == "tr");
  }
  // trace start: metadata as attributes, started_at in ns.
  CHECK(t[0].span_id.empty());
  CHECK(Extras(t[0].attributes) == std::map<std::string, std::string>{{"k", "1"}});
  CHECK(t[0].start_time_unix_nanos >= before - 1000000);
  CHECK(t[0].start_time_unix_nanos <= after);
  CHECK(t[0].end_time_unix_nanos == 0);
  // span starts: ids and the parent link.
  CHECK(t[1].span_id == outer_id);
  CHECK(t[1].parent_id.empty());
  CHECK(Extras(t[1].attributes) == std::map<std::string, std::string>{{"a", "1"}});
  CHECK(t[1].start_time_unix_nanos >= t[0].start_time_unix_nanos);
  CHECK(t[2].span_id == inner_id);
  CHECK(t[2].parent_id == outer_id);
  CHECK(t[2].attributes.empty());
  // inner end: ok status with its description, one event.
  CHECK(t[3].span_id == inner_id);
  CHECK(t[3].parent_id == outer_id);
  CHECK(t[3].status == 1);
  CHECK(t[3].status_description == "fine");
  CHECK(t[3].error_message.empty());
  CHECK(t[3].start_time_unix_nanos == t[2].start_time_unix_nanos);
  CHECK(t[3].end_time_unix_nanos >= t[3].start_time_unix_nanos);
  {
    msgpack::object_handle events = Unpack(t[3].events);
    const msgpack::object& list = events.get();
    REQUIRE(list.type == msgpack::type::ARRAY);
    REQUIRE(list.via.array.size == 1);
    const msgpack::object& event = list.via.array.ptr[0];
    REQUIRE(event.type == msgpack::type::ARRAY);
    REQUIRE(event.via.array.size == 3);
    CHECK(event.via.array.ptr[0].as<std::string>() == "ev");
    const int64_t when = event.via.array.ptr[1].as<int64_t>();
    CHECK(when >= t[3].start_time_unix_nanos);
    CHECK(when <= t[3].end_time_unix_nanos);
    const auto attrs =
        event.via.array.ptr[2].as<std::map<std::string, int64_t>>();
    CHECK(attrs == std::map<std::string, int64_t>{{"x", 2}});
  }
  // outer end: set_error makes the status error, with message and data.
  CHECK(t[4].span_id == outer_id);
  CHECK(t[4].status == 2);
  CHECK(t[4].status_description == "bad");
  CHECK(t[4].error_message == "bad");
  CHECK(Extras(t[4].error_data) == std::map<std::string, std::string>{{"code", "7"}});
  CHECK(Extras(t[4].attributes) == std::map<std::string, std::string>{{"a", "1"}});
  CHECK(t[4].events.empty());
  // trace end.
  CHECK(t[5].end_time_unix_nanos >= t[4].end_time_unix_nanos);
  CHECK(t[5].end_time_unix_nanos <= after + 1000000);
  CHECK(t[5].start_time_unix_nanos == 0);
  // With a processor registered, agentix.trace does not warn.
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
  CHECK(LogsOf(worker->logs(), "agentix.trace").empty());
}

TEST_CASE("Span attributes are coerced to scalars; others arrive as repr",
          "[worker][trace]") {
  auto worker = TracingWorker();
  const std::string span_id = Unpickle(
      worker->CallOk("worker_fixture::traced_odd_attributes",
                     Pickle("((), {})")),
      "v");
  REQUIRE(worker->AwaitTraces(2));
  const ipc::TraceEntry& end = worker->traces()[1];
  CHECK(end.kind == 4);
  CHECK(end.span_id == span_id);
  CHECK(end.trace_id == "trace_unbound");
  msgpack::object_handle handle = Unpack(end.attributes);
  const msgpack::object& map = handle.get();
  REQUIRE(map.type == msgpack::type::MAP);
  std::map<std::string, msgpack::object> attrs;
  for (uint32_t i = 0; i < map.via.map.size; ++i) {
    attrs[map.via.map.ptr[i].key.as<std::string>()] = map.via.map.ptr[i].val;
  }
  CHECK(attrs.size() == 6);  // `none` is left out
  CHECK(attrs.count("none") == 0);
  REQUIRE(attrs.count("obj") == 1);
  CHECK(attrs["obj"].type == msgpack::type::STR);
  CHECK(attrs["obj"].as<std::string>() == "<opaque>");
  CHECK(attrs["big"].type == msgpack::type::STR);
  CHECK(attrs["big"].as<std::string>() == "1180591620717411303424");
  CHECK(attrs["s"].as<std::string>() == "x");
  CHECK(attrs["f"].as<double>() == 1.5);
  CHECK(attrs["b"].type == msgpack::type::BOOLEAN);
  CHECK(attrs["b"].as<bool>());
  CHECK(attrs["raw"].type == msgpack::type::BIN);
  CHECK(attrs["raw"].as<std::string>() == std::string("\x00\xff", 2));
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

TEST_CASE("Span stamps become Unix nanoseconds, across seconds",
          "[worker][trace]") {
  auto worker = TracingWorker();
  worker->CallOk("worker_fixture::traced_stamps", Pickle("((), {})"));
  REQUIRE(worker->AwaitTraces(4));
  const auto& t = worker->traces();
  constexpr int64_t k20240102T030405 = 1704164645;  // Unix seconds
  constexpr int64_t kNs = 1000000000;
  CHECK(t[0].start_time_unix_nanos == k20240102T030405 * kNs + 123456000);
  CHECK(t[0].end_time_unix_nanos == k20240102T030405 * kNs + 999999000);
  CHECK(t[1].start_time_unix_nanos == k20240102T030405 * kNs + 1000);
  CHECK(t[1].end_time_unix_nanos == (k20240102T030405 + 1) * kNs);
  // Not agentix's own format: parsed by datetime.
  CHECK(t[2].start_time_unix_nanos == (k20240102T030405 + 1) * kNs + 500000000);
  CHECK(t[2].end_time_unix_nanos == 946684799 * kNs + 2000);
  CHECK(t[3].start_time_unix_nanos == k20240102T030405 * kNs + 7000);
  CHECK(t[3].end_time_unix_nanos == 0);  // unreadable
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

TEST_CASE("Spans from pool threads and tasks carry their call's id",
          "[worker][trace]") {
  auto worker = TracingWorker();
  worker->Call("ps", "worker_fixture::traced_sync", Pickle("(('sync',), {})"));
  worker->Call("pa", "worker_fixture::traced_async",
               Pickle("(('async',), {})"));
  auto replies = worker->AwaitReplies({"ps", "pa"}, absl::Seconds(20));
  REQUIRE(replies["ps"].ok);
  REQUIRE(replies["pa"].ok);
  REQUIRE(worker->AwaitTraces(6));
  const auto& t = worker->traces();
  for (int kind : {3, 4}) {
    const ipc::TraceEntry* sync = FindSpan(t, kind, "sync");
    const ipc::TraceEntry* async = FindSpan(t, kind, "async");
    const ipc::TraceEntry* child = FindSpan(t, kind, "async-child");
    REQUIRE(sync != nullptr);
    REQUIRE(async != nullptr);
    REQUIRE(child != nullptr);
    CHECK(sync->call_id == "ps");
    CHECK(async->call_id == "pa");
    CHECK(child->call_id == "pa");
    CHECK(child->parent_id == async->span_id);
  }
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

TEST_CASE("Without agentix, tracing code fails alone and nothing is sent",
          "[worker][trace]") {
  auto worker = ReadyWorker();
  ipc::ErrorInfo error =
      worker->CallError("worker_fixture::traced", Pickle("((), {})"));
  CHECK(error.type == "ModuleNotFoundError");
  CHECK(Unpickle(worker->CallOk("worker_fixture::add", Pickle("((1, 2), {})"))) ==
        "3");
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
  CHECK(worker->traces().empty());
}

}  // namespace
}  // namespace agentix::worker
