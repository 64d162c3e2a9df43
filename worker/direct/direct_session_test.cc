// DirectSession against the shared owner scenarios (calls/owner_scenarios.h,
// also run for SessionManager), with testing/fake_worker as the driver: a
// real child process speaking the worker protocol on a socketpair, fed the
// session's call / arg_chunk / cancel / stream_ack records and answering
// with the result frames the session turns into CallsResponse events.
#include "worker/direct/direct_session.h"

#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <deque>
#include <iterator>
#include <map>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "calls/owner_scenarios.h"
#include "worker/ipc/io.h"
#include "worker/ipc/ledger.h"
#include "worker/ipc/payload_area.h"
#include "worker/ipc/session_state.h"

extern char** environ;

namespace agentix::worker {
namespace {

using calls::testing::EventLog;
using runtime::v1::CallsRequest;
using runtime::v1::SandboxEvent;
using sandbox::SandboxEventPtr;

class LogConn final : public DirectResponseSink {
 public:
  explicit LogConn(std::shared_ptr<EventLog> log) : log_(std::move(log)) {}
  void Send(absl::Span<SandboxEventPtr> events) override {
    log_->Add(std::vector<SandboxEventPtr>(
        std::make_move_iterator(events.begin()),
        std::make_move_iterator(events.end())));
  }

 private:
  const std::shared_ptr<EventLog> log_;
};

// testing/fake_worker on a socketpair (its channel fd), as the driver of a
// session: frames queued by Send are written by a writer thread (Send runs
// under the session's lock and must not block), frames read by a reader
// thread go to the session.
class FakeWorkerDriver final : public DriverSink {
 public:
  FakeWorkerDriver() {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    fd_ = fds[0];
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], ipc::kWorkerChannelFd);
    char path[] = "testing/fake_worker";
    char* argv[] = {path, nullptr};
    REQUIRE(::posix_spawn(&pid_, path, &actions, nullptr, argv, environ) == 0);
    posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
  }
  ~FakeWorkerDriver() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (writer_.joinable()) writer_.join();
    ::shutdown(fd_, SHUT_RDWR);
    if (reader_.joinable()) reader_.join();
    ::close(fd_);
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }

  // Starts the threads once the session exists.
  void Serve(DirectSession& session) {
    writer_ = std::thread([this] { WriteLoop(); });
    reader_ = std::thread([this, &session] { ReadLoop(session); });
  }

  void Send(absl::Span<ipc::Frame> frames) override {
    absl::MutexLock lock(&mu_);
    for (const ipc::Frame& frame : frames) {
      REQUIRE(frame.type != ipc::FrameType::kShutdown);
      CHECK(ipc::AppendFrame(frame, pending_).ok());
    }
  }

  // Worker frames the session refused (not a call's output).
  int refused() const { return refused_.load(); }

 private:
  void WriteLoop() {
    while (true) {
      std::string bytes;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || !pending_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (pending_.empty()) return;  // stopping
        bytes.swap(pending_);
      }
      if (!ipc::WriteAll(fd_, bytes).ok()) return;
    }
  }

  void ReadLoop(DirectSession& session) {
    ipc::FrameReader reader;
    while (true) {
      auto n = ipc::ReadInto(fd_, reader);
      if (!n.ok() || *n == 0) return;
      std::vector<ipc::Frame> frames;
      while (true) {
        auto next = reader.Next();
        if (!next.ok() || !next->has_value()) break;
        if ((*next)->type == ipc::FrameType::kReady) continue;
        frames.push_back(std::move(**next));
      }
      if (!session.HandleDriverFrames(frames).ok()) ++refused_;
    }
  }

  int fd_ = -1;
  pid_t pid_ = 0;
  absl::Mutex mu_;
  std::string pending_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int> refused_{0};
  std::thread writer_;
  std::thread reader_;
};

class SessionOwner final : public calls::testing::OwnerUnderTest {
 public:
  explicit SessionOwner(const calls::CallTableLimits& limits)
      : session_("scenario-client", Limits(limits), driver_) {
    driver_.Serve(session_);
    // The upload watchdog the worker's intake will run (stage 3).
    watchdog_ = std::thread([this] {
      while (!stop_.load()) {
        session_.ExpireUploads(absl::Now());
        absl::SleepFor(absl::Milliseconds(20));
      }
    });
  }
  ~SessionOwner() override {
    stop_ = true;
    watchdog_.join();
    CHECK(driver_.refused() == 0);
  }

  std::shared_ptr<EventLog> Connect() override {
    auto log = std::make_shared<EventLog>();
    conns_[log.get()] = std::make_shared<LogConn>(log);
    return log;
  }
  void Send(const std::shared_ptr<EventLog>& conn,
            const CallsRequest& request) override {
    session_.HandleRequest(conns_.at(conn.get()), request);
  }
  void Close(const std::shared_ptr<EventLog>& conn) override {
    session_.Detach(conns_.at(conn.get()).get());
  }

 private:
  static DirectLimits Limits(const calls::CallTableLimits& table) {
    DirectLimits limits;
    limits.max_retained_results = table.max_retained_results;
    limits.max_retained_bytes = table.max_retained_bytes;
    limits.max_payload_bytes = table.max_payload_bytes;
    limits.upload_idle_timeout = table.upload_idle_timeout;
    limits.max_stream_window = table.max_stream_window;
    return limits;
  }

  // Declared first: destroyed last, after the session it feeds stops
  // being used (its threads join in its destructor).
  FakeWorkerDriver driver_;
  DirectSession session_;
  std::map<const EventLog*, std::shared_ptr<LogConn>> conns_;
  std::atomic<bool> stop_{false};
  std::thread watchdog_;
};

TEST_CASE("DirectSession keeps every Calls guarantee (the owner scenarios)",
          "[direct][calls]") {
  calls::testing::RunOwnerScenarios([](const calls::CallTableLimits& limits) {
    return std::make_unique<SessionOwner>(limits);
  });
}

// A driver that records what the session asks of it, for the records'
// exact content (what the daemon writes on the link for a relayed call).
class RecordingDriver final : public DriverSink {
 public:
  void Send(absl::Span<ipc::Frame> frames) override {
    for (auto& f : frames) frames_.push_back(std::move(f));
  }
  std::vector<ipc::Frame> frames_;
};

class RecordingConn final : public DirectResponseSink {
 public:
  void Send(absl::Span<SandboxEventPtr> events) override {
    for (auto& e : events) events_.push_back(std::move(e));
  }
  std::vector<SandboxEventPtr> events_;
};

CallsRequest StartRequest(const std::string& id, std::string args,
                          uint64_t total, uint32_t window) {
  CallsRequest r;
  auto* s = r.add_events()->mutable_start();
  s->set_call_id(id);
  s->set_callable("mod:fn");
  s->set_arguments(std::move(args));
  s->set_arguments_size(total);
  s->set_stream_window(window);
  s->set_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
  return r;
}

TEST_CASE("DirectSession hands the driver the records the daemon sends",
          "[direct]") {
  RecordingDriver driver;
  DirectLimits limits;
  limits.max_stream_window = 8;
  DirectSession session("c", limits, driver);
  auto conn = std::make_shared<RecordingConn>();
  const std::string args(ipc::kChunkBytes + 10, '\x80');
  session.HandleRequest(conn, StartRequest("s", args, 0, 1000));
  REQUIRE(conn->events_.empty());
  REQUIRE(driver.frames_.size() == 2);
  const ipc::Frame& call = driver.frames_[0];
  REQUIRE(call.type == ipc::FrameType::kCall);
  REQUIRE(call.call_id == "s");
  REQUIRE(call.callable == "mod:fn");
  REQUIRE(call.encoding == runtime::v1::ENCODING_PICKLE);  // unspecified
  REQUIRE(call.total_size == args.size());
  REQUIRE(call.stream_window == 8);  // clamped
  REQUIRE(!call.context.empty());    // the traceparent
  REQUIRE(call.data.size() == ipc::kChunkBytes);
  REQUIRE(driver.frames_[1].type == ipc::FrameType::kArgChunk);
  REQUIRE(driver.frames_[1].data.size() == 10);
  REQUIRE(session.running() == 1);
  REQUIRE(session.Runs("s"));

  CallsRequest ack;
  ack.add_events()->mutable_stream_ack()->set_call_id("s");
  ack.mutable_events(0)->mutable_stream_ack()->set_next_index(3);
  session.HandleRequest(conn, ack);
  REQUIRE(driver.frames_.back().type == ipc::FrameType::kStreamAck);
  REQUIRE(driver.frames_.back().index == 3);

  // A value over one chunk arrives as leading ResultChunks, then the rest.
  std::vector<ipc::Frame> out(1);
  out[0].type = ipc::FrameType::kResult;
  out[0].call_id = "s";
  out[0].encoding = runtime::v1::ENCODING_PICKLE;
  out[0].data.assign(2 * ipc::kChunkBytes + 5, 'r');
  out[0].total_size = out[0].data.size();
  REQUIRE(session.HandleDriverFrames(out).ok());
  REQUIRE(conn->events_.size() == 3);
  REQUIRE(conn->events_[0]->has_result_chunk());
  REQUIRE(conn->events_[2]->result().value().size() == 5);
  REQUIRE(conn->events_[2]->result().value_size() == 2 * ipc::kChunkBytes + 5);
  REQUIRE(session.running() == 0);
  REQUIRE(!session.HasOpenCalls(conn.get()));

  // A late frame of the closed call is dropped; a frame that is no call's
  // output is refused, by name.
  std::vector<ipc::Frame> late(2);
  late[0].type = ipc::FrameType::kResult;
  late[0].call_id = "s";
  late[1].type = ipc::FrameType::kReady;
  absl::Status refused = session.HandleDriverFrames(late);
  REQUIRE(refused.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(refused.message().find("ready") != std::string::npos);
  REQUIRE(conn->events_.size() == 3);

  // The acknowledged call is finished: a re-sent start is refused.
  CallsRequest done;
  done.add_events()->mutable_ack()->set_call_id("s");
  session.HandleRequest(conn, done);
  const size_t frames_before = driver.frames_.size();
  session.HandleRequest(conn, StartRequest("s", "\x80", 0, 0));
  REQUIRE(conn->events_.back()->error().error().type() == "ResultUnavailable");
  REQUIRE(driver.frames_.size() == frames_before);
}

TEST_CASE("DirectSession takes argument bytes left out of the message",
          "[direct]") {
  // frame_splice hands the bytes of StartCall.arguments and
  // ArgumentChunk.data as views beside the parsed message.
  RecordingDriver driver;
  DirectSession session("c", DirectLimits{}, driver);
  auto conn = std::make_shared<RecordingConn>();
  CallsRequest request = StartRequest("b", "", 6, 0);
  auto* chunk = request.add_events()->mutable_argument_chunk();
  chunk->set_call_id("b");
  const std::string start_bytes = "\x80" "ab";
  const std::string chunk_bytes = "cde";
  const std::vector<std::optional<std::string_view>> bulk = {
      std::string_view(start_bytes), std::string_view(chunk_bytes)};
  session.HandleRequest(conn, request, bulk);
  REQUIRE(conn->events_.empty());
  REQUIRE(driver.frames_.size() == 2);
  REQUIRE(driver.frames_[0].data == start_bytes);
  REQUIRE(driver.frames_[0].total_size == 6);
  REQUIRE(driver.frames_[1].type == ipc::FrameType::kArgChunk);
  REQUIRE(driver.frames_[1].data == chunk_bytes);
}

TEST_CASE("DirectSession cancels in the driver what it ends itself",
          "[direct]") {
  RecordingDriver driver;
  DirectLimits limits;
  limits.upload_idle_timeout = absl::Seconds(1);
  DirectSession session("c", limits, driver);
  auto conn = std::make_shared<RecordingConn>();
  session.HandleRequest(conn, StartRequest("u", "\x80", 100, 0));
  REQUIRE(session.ExpireUploads(absl::Now()));  // still within its time
  REQUIRE(conn->events_.empty());
  REQUIRE(!session.ExpireUploads(absl::Now() + absl::Seconds(2)));
  REQUIRE(conn->events_.back()->error().error().type() == "UploadTimeout");
  REQUIRE(driver.frames_.back().type == ipc::FrameType::kCancel);
  REQUIRE(driver.frames_.back().call_id == "u");

  session.HandleRequest(conn, StartRequest("h", "\x80", 0, 0));
  CallsRequest cancel;
  cancel.add_events()->mutable_cancel()->set_call_id("h");
  session.HandleRequest(conn, cancel);
  REQUIRE(conn->events_.back()->error().error().type() == "Cancelled");
  REQUIRE(driver.frames_.back().type == ipc::FrameType::kCancel);
  REQUIRE(driver.frames_.back().call_id == "h");
  REQUIRE(session.running() == 0);
}

// A payload area and a ledger as the daemon makes them for a worker.
struct Records {
  std::unique_ptr<ipc::PayloadArea> daemon;
  std::unique_ptr<ipc::PayloadArea> worker;
  ipc::LedgerClients clients;
  std::unique_ptr<ipc::LedgerWriter> ledger;
  static constexpr uint32_t kCalls = 16, kFinished = 16;

  Records() {
    auto created = ipc::PayloadArea::Create(
        4096, false, ipc::LedgerBytes(kCalls, kFinished));
    REQUIRE(created.ok());
    daemon = std::move(*created);
    REQUIRE(ipc::FormatLedger(daemon->Ledger(), kCalls, kFinished).ok());
    auto mapped = ipc::PayloadArea::Map(daemon->fd());
    REQUIRE(mapped.ok());
    worker = std::move(*mapped);
    auto opened = ipc::LedgerWriter::Open(worker->Ledger());
    REQUIRE(opened.ok());
    ledger = std::move(*opened);
  }
  DirectRecords For(std::string_view client) {
    return {worker.get(), ledger.get(), *clients.SlotOf(client)};
  }
  ipc::LedgerContents Read() {
    auto read = ipc::ReadLedger(daemon->Ledger(), kCalls, kFinished, clients);
    REQUIRE(read.ok());
    return *std::move(read);
  }
};

std::vector<ipc::Frame> ResultFrame(const std::string& id, std::string value) {
  std::vector<ipc::Frame> out(1);
  out[0].type = ipc::FrameType::kResult;
  out[0].call_id = id;
  out[0].encoding = runtime::v1::ENCODING_PICKLE;
  out[0].total_size = value.size();
  out[0].data = std::move(value);
  return out;
}

TEST_CASE("DirectSession's reused buffers carry nothing from one request or "
          "reply to the next; HandleCallOutput takes only a running call's",
          "[direct]") {
  RecordingDriver driver;
  DirectSession session("c", DirectLimits{}, driver);
  auto a = std::make_shared<RecordingConn>();
  auto b = std::make_shared<RecordingConn>();

  // Two empty ids around a good start: two BadRequests, in order, and one
  // call record.
  CallsRequest mixed = StartRequest("", "\x80", 0, 0);
  *mixed.add_events() = StartRequest("x", "\x80", 0, 0).events(0);
  *mixed.add_events() = StartRequest("", "\x80", 0, 0).events(0);
  session.HandleRequest(a, mixed);
  REQUIRE(a->events_.size() == 2);
  REQUIRE(a->events_[0]->error().error().type() == "BadRequest");
  REQUIRE(a->events_[1]->error().error().type() == "BadRequest");
  REQUIRE(driver.frames_.size() == 1);
  REQUIRE(driver.frames_[0].call_id == "x");

  // The next request, on another connection: only its own record.
  session.HandleRequest(b, StartRequest("y", "\x80", 0, 0));
  REQUIRE(driver.frames_.size() == 2);
  REQUIRE(driver.frames_[1].call_id == "y");
  REQUIRE(b->events_.empty());
  REQUIRE(a->events_.size() == 2);

  // Not a call of this session: nothing done.
  std::vector<ipc::Frame> other = ResultFrame("z", "v");
  REQUIRE(!session.HandleCallOutput(other));
  REQUIRE(a->events_.size() == 2);
  REQUIRE(b->events_.empty());

  // Each reply reaches its own call's connection, once.
  std::vector<ipc::Frame> to_y = ResultFrame("y", "vy");
  REQUIRE(session.HandleCallOutput(to_y));
  REQUIRE(b->events_.size() == 1);
  REQUIRE(b->events_[0]->result().value() == "vy");
  std::vector<ipc::Frame> to_x = ResultFrame("x", "vx");
  REQUIRE(session.HandleCallOutput(to_x));
  REQUIRE(a->events_.size() == 3);
  REQUIRE(a->events_[2]->result().value() == "vx");
  REQUIRE(b->events_.size() == 1);

  // A call that ended takes nothing more (late output after a cancel).
  std::vector<ipc::Frame> late = ResultFrame("x", "again");
  REQUIRE(!session.HandleCallOutput(late));
  REQUIRE(a->events_.size() == 3);
  REQUIRE(session.running() == 0);
  REQUIRE(driver.frames_.size() == 2);
}

TEST_CASE("DirectSession writes the ledger and the payload header's counters",
          "[direct]") {
  Records records;
  RecordingDriver driver;
  DirectSession session("alice", DirectLimits{}, driver, records.For("alice"));
  auto conn = std::make_shared<RecordingConn>();
  session.HandleRequest(conn, StartRequest("a", "\x80", 0, 0));
  session.HandleRequest(conn, StartRequest("b", "\x80", 0, 0));
  CHECK(records.daemon->DirectRunning() == 2);
  CHECK(records.daemon->DirectLastEndNs() == 0);
  ipc::LedgerContents read = records.Read();
  REQUIRE(read.calls.size() == 2);
  CHECK(read.calls[0].running);
  CHECK(read.calls[0].client == "alice");

  auto out = ResultFrame("a", "r");
  REQUIRE(session.HandleDriverFrames(out).ok());
  CHECK(records.daemon->DirectRunning() == 1);
  CHECK(records.daemon->DirectLastEndNs() > 0);
  read = records.Read();
  REQUIRE(read.calls.size() == 2);
  for (const auto& call : read.calls) CHECK(call.running == (call.id == "b"));

  CallsRequest ack;
  ack.add_events()->mutable_ack()->set_call_id("a");
  session.HandleRequest(conn, ack);
  read = records.Read();
  REQUIRE(read.calls.size() == 1);
  CHECK(read.calls[0].id == "b");
  REQUIRE(read.finished.size() == 1);
  CHECK(read.finished[0].id == "a");
  CHECK(read.finished[0].client == "alice");
}

TEST_CASE("DirectSession's evictions move ledger slots to the finished ring",
          "[direct]") {
  Records records;
  RecordingDriver driver;
  DirectLimits limits;
  limits.max_retained_results = 1;
  DirectSession session("", limits, driver, records.For(""));
  auto conn = std::make_shared<RecordingConn>();
  for (const std::string id : {"x", "y", "z"}) {
    session.HandleRequest(conn, StartRequest(id, "\x80", 0, 0));
    auto out = ResultFrame(id, "r");
    REQUIRE(session.HandleDriverFrames(out).ok());
  }
  const ipc::LedgerContents read = records.Read();
  REQUIRE(read.calls.size() == 1);  // the newest, retained
  CHECK(read.calls[0].id == "z");
  CHECK_FALSE(read.calls[0].running);
  REQUIRE(read.finished.size() == 2);
  CHECK(read.finished[0].id == "x");
  CHECK(read.finished[1].id == "y");
}

TEST_CASE("DirectSession::Collapse ends a call still uploading, typed, and "
          "cancels it in the driver", "[direct]") {
  RecordingDriver driver;
  DirectSession session("carol", DirectLimits{}, driver);
  auto conn = std::make_shared<RecordingConn>();
  session.HandleRequest(conn, StartRequest("up", "\x80", 100, 0));
  std::vector<ipc::Frame> frames = session.Collapse();
  ipc::SessionState state;
  for (const ipc::Frame& frame : frames) {
    REQUIRE(ipc::DecodeSessionStatePiece(frame.record, state).ok());
  }
  REQUIRE(state.calls.size() == 1);
  CHECK_FALSE(state.calls[0].running);
  REQUIRE(state.calls[0].delivered.size() == 1);
  runtime::v1::SandboxEvent event;
  REQUIRE(event.ParseFromString(state.calls[0].delivered[0]));
  CHECK(event.error().error().type() == "Unavailable");
  REQUIRE(driver.frames_.back().type == ipc::FrameType::kCancel);
  CHECK(driver.frames_.back().call_id == "up");
}

TEST_CASE("DirectSession::Collapse hands its calls and finished ids over",
          "[direct]") {
  Records records;
  RecordingDriver driver;
  DirectSession session("bob", DirectLimits{}, driver, records.For("bob"));
  auto conn = std::make_shared<RecordingConn>();
  session.HandleRequest(conn, StartRequest("run", "\x80", 0, 0));
  session.HandleRequest(conn, StartRequest("done", "\x80", 0, 0));
  session.HandleRequest(conn, StartRequest("acked", "\x80", 0, 0));
  for (const std::string id : {"done", "acked"}) {
    auto out = ResultFrame(id, "v-" + id);
    REQUIRE(session.HandleDriverFrames(out).ok());
  }
  CallsRequest ack;
  ack.add_events()->mutable_ack()->set_call_id("acked");
  session.HandleRequest(conn, ack);
  CHECK(session.Owns("run"));
  CHECK_FALSE(session.Owns("done"));  // terminal: no driver output to route

  std::vector<ipc::Frame> frames = session.Collapse();
  REQUIRE(!frames.empty());
  ipc::SessionState state;
  for (size_t i = 0; i < frames.size(); ++i) {
    REQUIRE(frames[i].type == ipc::FrameType::kSessionState);
    CHECK(frames[i].direct_conn.client == "bob");
    CHECK(frames[i].last == (i + 1 == frames.size()));
    REQUIRE(ipc::DecodeSessionStatePiece(frames[i].record, state).ok());
  }
  REQUIRE(state.calls.size() == 2);
  for (const ipc::CollapsedCall& call : state.calls) {
    if (call.id == "run") {
      CHECK(call.running);
      CHECK(call.delivered.empty());
    } else {
      REQUIRE(call.id == "done");
      CHECK_FALSE(call.running);
      REQUIRE(call.delivered.size() == 1);
      runtime::v1::SandboxEvent event;
      REQUIRE(event.ParseFromString(call.delivered[0]));
      CHECK(event.result().call_id() == "done");
    }
  }
  CHECK(state.finished == std::vector<std::string>{"acked"});

  // Afterwards: nothing owned, nothing running, the ledger's live slots
  // freed (the daemon holds those ids now), the driver's late output for
  // the collapsed call not this session's.
  CHECK_FALSE(session.Owns("run"));
  CHECK(session.running() == 0);
  CHECK(records.daemon->DirectRunning() == 0);
  const ipc::LedgerContents read = records.Read();
  CHECK(read.calls.empty());
  CHECK(read.finished.size() == 1);
  const size_t events_before = conn->events_.size();
  auto late = ResultFrame("run", "late");
  REQUIRE(session.HandleDriverFrames(late).ok());
  CHECK(conn->events_.size() == events_before);
}

TEST_CASE("DirectSession gives a result's chunk buffers back once the host "
          "acked it, and the next result reuses them",
          "[direct]") {
  RecordingDriver driver;
  std::shared_ptr<ChunkBuffers> buffers = ChunkBuffers::Create(4);
  DirectSession session("c", DirectLimits(), driver, {}, buffers);
  auto conn = std::make_shared<RecordingConn>();
  // A result as the channel cuts a direct one (result_sender.cc): whole
  // chunks in buffers taken from `buffers`, then the rest.
  auto result = [&](const std::string& id) {
    std::vector<ipc::Frame> frames(3);
    for (int i = 0; i < 2; ++i) {
      frames[i].type = ipc::FrameType::kResultChunk;
      frames[i].call_id = id;
      frames[i].data = buffers->Take(ipc::kChunkBytes);
      frames[i].data.assign(ipc::kChunkBytes, static_cast<char>('a' + i));
    }
    frames[2] = ResultFrame(id, "tail")[0];
    frames[2].total_size = 2 * ipc::kChunkBytes + 4;
    REQUIRE(session.HandleDriverFrames(frames).ok());
  };
  auto ack = [&](const std::string& id) {
    CallsRequest request;
    request.add_events()->mutable_ack()->set_call_id(id);
    session.HandleRequest(conn, request);
  };

  session.HandleRequest(conn, StartRequest("r1", "\x80", 0, 0));
  result("r1");
  REQUIRE(conn->events_.size() == 3);
  CHECK(conn->events_[0]->result_chunk().call_id() == "r1");
  CHECK(conn->events_[0]->result_chunk().data() ==
        std::string(ipc::kChunkBytes, 'a'));
  CHECK(conn->events_[1]->result_chunk().data() ==
        std::string(ipc::kChunkBytes, 'b'));
  CHECK(conn->events_[2]->result().value() == "tail");
  CHECK(conn->events_[2]->result().value_size() == 2 * ipc::kChunkBytes + 4);
  const char* const first = conn->events_[0]->result_chunk().data().data();
  conn->events_.clear();  // written
  CHECK(buffers->kept() == 0);  // retained for a resume until acked
  CHECK(buffers->fresh() == 2);

  ack("r1");
  CHECK(buffers->kept() == 2);

  session.HandleRequest(conn, StartRequest("r2", "\x80", 0, 0));
  result("r2");
  CHECK(buffers->fresh() == 2);
  CHECK(buffers->reused() == 2);
  bool same_memory = false;
  for (const SandboxEventPtr& e : conn->events_) {
    same_memory |= e->has_result_chunk() && e->result_chunk().data().data() == first;
  }
  CHECK(same_memory);
}

TEST_CASE("DirectSession copies a large argument into recycled chunk "
          "buffers, and the next call's argument reuses them",
          "[direct]") {
  RecordingDriver driver;
  std::shared_ptr<ChunkBuffers> buffers = ChunkBuffers::Create(8);
  DirectSession session("c", DirectLimits(), driver, {}, buffers);
  auto conn = std::make_shared<RecordingConn>();
  // What the intake does once a frame's piece is in the call's bytes.
  auto consume = [&] {
    std::vector<const char*> memory;
    for (ipc::Frame& f : driver.frames_) {
      memory.push_back(f.data.data());
      buffers->Give(std::move(f.data));
    }
    driver.frames_.clear();
    return memory;
  };

  const std::string args = "\x80" + std::string(3 * ipc::kChunkBytes - 1, 'a');
  session.HandleRequest(conn, StartRequest("a1", args, 0, 0));
  REQUIRE(driver.frames_.size() == 3);
  std::string received;
  for (const ipc::Frame& f : driver.frames_) received += f.data;
  CHECK(received == args);
  CHECK(buffers->fresh() == 3);
  std::vector<const char*> first = consume();
  CHECK(buffers->kept() == 3);

  // Uploaded in a start and a chunk: the same buffers again.
  CallsRequest upload = StartRequest("a2", args.substr(0, 10), args.size(), 0);
  auto* chunk = upload.add_events()->mutable_argument_chunk();
  chunk->set_call_id("a2");
  chunk->set_data(args.substr(10));
  session.HandleRequest(conn, upload);
  REQUIRE(conn->events_.empty());
  received.clear();
  for (const ipc::Frame& f : driver.frames_) received += f.data;
  CHECK(received == args);
  CHECK(buffers->fresh() == 3);
  CHECK(buffers->reused() == 3);
  std::vector<const char*> second = consume();
  std::sort(first.begin(), first.end());
  std::vector<const char*> large(second.begin() + 1, second.end());
  std::sort(large.begin(), large.end());
  // The 10-byte first piece is a plain string; the chunk's three pieces
  // (1 MiB, 1 MiB, 1 MiB - 10) are the first call's buffers.
  CHECK(large == first);

  // A small argument takes none.
  session.HandleRequest(conn, StartRequest("a3", "\x80", 0, 0));
  CHECK(buffers->fresh() == 3);
  CHECK(buffers->reused() == 3);
}

// A driver whose arguments have a home of their own (the worker's intake:
// LandDirectArgument): it takes every piece of a chunked call.
class LandingDriver final : public DriverSink {
 public:
  void Send(absl::Span<ipc::Frame> frames) override {
    for (auto& f : frames) frames_.push_back(std::move(f));
  }
  bool Land(ipc::Frame& frame, std::string_view bytes) override {
    landed_ += bytes;
    frame.landed = bytes.size();
    return true;
  }
  std::vector<ipc::Frame> frames_;
  std::string landed_;
};

TEST_CASE("DirectSession lands a chunked argument's pieces where the driver "
          "keeps them, with no copy of its own",
          "[direct]") {
  LandingDriver driver;
  std::shared_ptr<ChunkBuffers> buffers = ChunkBuffers::Create(8);
  DirectSession session("c", DirectLimits(), driver, {}, buffers);
  auto conn = std::make_shared<RecordingConn>();
  const std::string args = "\x80" + std::string(3 * ipc::kChunkBytes, 'a');
  CallsRequest upload = StartRequest("l1", args.substr(0, 10), args.size(), 0);
  auto* chunk = upload.add_events()->mutable_argument_chunk();
  chunk->set_call_id("l1");
  chunk->set_data(args.substr(10));
  session.HandleRequest(conn, upload);
  REQUIRE(conn->events_.empty());
  CHECK(driver.landed_ == args);
  // The call frame (10 bytes) and the chunk's pieces, in order, each
  // saying how much of the argument it stands for and carrying none.
  REQUIRE(driver.frames_.size() == 4);
  CHECK(driver.frames_[0].type == ipc::FrameType::kCall);
  CHECK(driver.frames_[0].total_size == args.size());
  uint64_t landed = 0;
  for (const ipc::Frame& f : driver.frames_) {
    CHECK(f.data.empty());
    CHECK(f.landed != 0);
    landed += f.landed;
  }
  CHECK(landed == args.size());
  CHECK(buffers->fresh() == 0);
  CHECK(buffers->reused() == 0);
}

}  // namespace
}  // namespace agentix::worker
