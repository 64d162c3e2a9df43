// Direct calls, stage 3's daemon side (docs/DIRECT-CALLS.md): the frame wire
// hands an eligible Calls connection to the worker (testing/fake_worker with
// FAKE_WORKER_DIRECT=1 serves it itself: its answers say "direct <pid>"),
// keeps it counted until the worker reports it closed, and relays every
// connection the rules refuse (the fake's relayed fake::echo answers the
// arguments).
#include <dirent.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "sandbox/calls_cpu.h"
#include "sandbox/connection_guard.h"
#include "sandbox/direct_connections.h"
#include "sandbox/direct_orphan_timer.h"
#include "sandbox/fake_worker_calls.h"
#include "sandbox/frame_wire_server.h"
#include "wire/frame_codec.h"
#include "worker/ipc/payload_area.h"

namespace agentix::sandbox {
namespace {

using runtime::v1::CallsRequest;
using runtime::v1::CallsResponse;

constexpr char kToken[] = "direct-test-token";

struct WireFrame {
  FrameKind kind;
  std::string payload;
};

// A frame-wire host: blocking I/O, a deadline on every read.
class Host {
 public:
  explicit Host(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, path.c_str());
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  }
  ~Host() { ::close(fd_); }

  // HELLO (and, pipelined in the same write, `then`'s frames): with the
  // direct key when `direct`, and the ring's memfd when `ring`.
  void Hello(bool direct, const std::string& client_id,
             const std::string& then = "", const ipc::PayloadArea* ring = nullptr) {
    FrameMetadata metadata;
    metadata.emplace_back("authorization", absl::StrCat("Bearer ", kToken));
    if (!client_id.empty()) metadata.emplace_back("agentix-client-id", client_id);
    if (direct) metadata.emplace_back(kFrameDirectKey, "1");
    if (ring != nullptr) metadata.emplace_back(kFramePayloadRingKey, "1");
    metadata.insert(metadata.end(), extra.begin(), extra.end());
    const std::string bytes =
        EncodeFrame(FrameKind::kHello, EncodeHello(metadata)) + then;
    iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    if (ring != nullptr) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      const int fd = ring->fd();
      std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    REQUIRE(::sendmsg(fd_, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size()));
  }
  void Send(const std::string& bytes) {
    REQUIRE(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(bytes.size()));
  }
  // The next frame; nullopt on EOF.
  std::optional<WireFrame> Read(absl::Duration timeout = absl::Seconds(20)) {
    std::string header;
    if (!ReadExactly(kFrameHeaderBytes, header, timeout)) return std::nullopt;
    const auto* h = reinterpret_cast<const unsigned char*>(header.data());
    const size_t length = size_t{h[0]} | size_t{h[1]} << 8 |
                          size_t{h[2]} << 16 | size_t{h[3]} << 24;
    WireFrame frame{static_cast<FrameKind>(h[4]), ""};
    REQUIRE(ReadExactly(length, frame.payload, timeout));
    return frame;
  }
  // The value of the next CallResult (skipping the ring's acceptance).
  std::string NextResult() { return NextEvent().second; }
  // The next event as {call id, its result's value or "error <type>"}; a
  // response of several events is taken one event at a time.
  std::pair<std::string, std::string> NextEvent() {
    while (events_.empty()) {
      std::optional<WireFrame> frame = Read();
      REQUIRE(frame.has_value());
      if (frame->kind == FrameKind::kRingMessage) continue;
      INFO("frame kind " << static_cast<int>(frame->kind) << ": "
                         << frame->payload);
      REQUIRE(frame->kind == FrameKind::kMessage);
      CallsResponse response;
      REQUIRE(response.ParseFromString(frame->payload));
      REQUIRE(response.events_size() >= 1);
      for (const auto& event : response.events()) {
        if (event.has_error()) {
          events_.emplace_back(event.error().call_id(),
                               "error " + event.error().error().type());
          last_error_ = event.error().error();
        } else {
          REQUIRE(event.has_result());
          events_.emplace_back(event.result().call_id(), event.result().value());
        }
      }
    }
    std::pair<std::string, std::string> next = events_.front();
    events_.erase(events_.begin());
    return next;
  }
  // The last CallError NextEvent returned.
  const runtime::v1::RemoteError& last_error() const { return last_error_; }
  // The STATUS frame's code, which must be followed by EOF.
  absl::StatusCode ReadStatus() {
    std::optional<WireFrame> frame = Read();
    REQUIRE(frame.has_value());
    REQUIRE(frame->kind == FrameKind::kStatus);
    auto status = DecodeStatus(frame->payload);
    REQUIRE(status.ok());
    REQUIRE(!Read().has_value());
    return static_cast<absl::StatusCode>(status->code);
  }
  // The next CallsResponse (skipping the ring's acceptance; calls-CPU
  // answers are counted in `cpu_answers`).
  CallsResponse NextResponse() {
    for (;;) {
      std::optional<WireFrame> frame = Read();
      REQUIRE(frame.has_value());
      if (frame->kind == FrameKind::kRingMessage) continue;
      if (frame->kind == FrameKind::kHello) {
        auto answer = DecodeHello(frame->payload);
        REQUIRE(answer.ok());
        const std::string* value = FindMetadata(*answer, kFrameCallsCpuKey);
        REQUIRE(value != nullptr);
        cpu_answers.push_back(*value);
        continue;
      }
      REQUIRE(frame->kind == FrameKind::kMessage);
      CallsResponse response;
      REQUIRE(response.ParseFromString(frame->payload));
      return response;
    }
  }
  int fd() const { return fd_; }
  FrameMetadata extra;  // more HELLO keys
  std::vector<std::string> cpu_answers;

 private:
  bool ReadExactly(size_t n, std::string& out, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    out.resize(n);
    size_t got = 0;
    while (got < n) {
      pollfd p{fd_, POLLIN, 0};
      const int left = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
      REQUIRE(left > 0);
      if (::poll(&p, 1, left) <= 0) continue;
      const ssize_t r = ::recv(fd_, out.data() + got, n - got, 0);
      if (r == 0) return false;
      REQUIRE(r > 0);
      got += static_cast<size_t>(r);
    }
    return true;
  }
  int fd_ = -1;
  std::vector<std::pair<std::string, std::string>> events_;
  runtime::v1::RemoteError last_error_;
};

std::string Start(const std::string& id, const std::string& callable,
                  const std::string& args) {
  CallsRequest request;
  AddStart(request, id, callable, args);
  return EncodeFrame(FrameKind::kMessage, request.SerializeAsString());
}

std::string HalfClose() { return EncodeFrame(FrameKind::kHalfClose, ""); }

std::string Ack(const std::string& id) {
  CallsRequest request;
  request.add_events()->mutable_ack()->set_call_id(id);
  return EncodeFrame(FrameKind::kMessage, request.SerializeAsString());
}

std::string Resume(const std::vector<std::string>& ids) {
  CallsRequest request;
  auto* resume = request.add_events()->mutable_resume();
  for (const std::string& id : ids) resume->add_call_ids(id);
  return EncodeFrame(FrameKind::kMessage, request.SerializeAsString());
}

bool Eventually(const std::function<bool()>& done,
                absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return done();
}

size_t OpenFdsOf(int64_t pid) {
  size_t count = 0;
  DIR* dir = ::opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  REQUIRE(dir != nullptr);
  while (readdir(dir) != nullptr) ++count;
  ::closedir(dir);
  return count;
}

struct Setup {
  bool flag = true;             // --direct_calls
  bool capable = true;          // the fake advertises `direct`
  size_t max_live = 256;
  size_t max_concurrent_calls = 0;
  size_t payload_ring_bytes = ipc::kDefaultRingBytes;
  bool ledger = true;  // the payload area holds a ledger (with the flag)
  std::vector<std::string> env;
  absl::Duration collapse_timeout = absl::Seconds(5);
  // The orphan timer's timeout (none when zero).
  absl::Duration orphan_after = absl::ZeroDuration();
  std::shared_ptr<CallsCpu> calls_cpu;  // the frame wire's (--calls_cpu)
};

// A Logs stream of one client (or of none: "").
class LogStream : public LogSubscriber {
 public:
  explicit LogStream(std::string client) : client_(std::move(client)) {}
  const std::string& client_id() const override { return client_; }
  bool Deliver(std::vector<LogRecordPtr> records) override {
    absl::MutexLock lock(&mu_);
    for (auto& r : records) got_.push_back(FullOf(*r));
    return true;
  }
  std::vector<runtime::v1::LogRecord> got() {
    absl::MutexLock lock(&mu_);
    return got_;
  }

 private:
  const std::string client_;
  absl::Mutex mu_;
  std::vector<runtime::v1::LogRecord> got_ ABSL_GUARDED_BY(mu_);
};

struct Harness {
  explicit Harness(Setup setup = Setup()) {
    char dir_template[] = "/tmp/agx-direct-XXXXXX";
    REQUIRE(::mkdtemp(dir_template) != nullptr);
    dir = dir_template;
    direct = std::make_shared<DirectConnections>(setup.max_live, &activity);
    SessionOptions session = FakeWorkerOptions(setup.env);
    if (setup.capable) session.worker.env.push_back("FAKE_WORKER_DIRECT=1");
    session.worker.payload_ring_bytes = setup.payload_ring_bytes;
    session.max_concurrent_calls = setup.max_concurrent_calls;
    session.worker.ready_timeout = absl::Seconds(2);
    session.direct_collapse_timeout = setup.collapse_timeout;
    if (setup.flag) session.worker.direct_listener = direct;
    if (setup.flag && setup.ledger) {
      session.worker.ledger_call_slots =
          LedgerCallSlots(session.max_retained_results);
    }
    manager = std::make_unique<SessionManager>(std::move(session));
    if (setup.orphan_after > absl::ZeroDuration()) {
      orphans = std::make_unique<DirectOrphanTimer>(
          *direct, setup.orphan_after, [this](const std::string& client) {
            manager->AskCollapse(client,
                                 [&] { return !direct->HasLive(client); });
          });
    }
    FrameWireOptions wire;
    wire.path = dir + "/d.sock.calls";
    wire.gate = TokenGate::Fixed(kToken);
    wire.activity = &activity;
    if (setup.flag) wire.direct = direct;
    wire.calls_cpu = setup.calls_cpu;
    path = wire.path;
    server = std::make_unique<FrameWireServer>(manager.get(), wire);
    REQUIRE(server->Start().ok());
  }
  ~Harness() {
    orphans.reset();
    server->Stop();
    manager.reset();
    ::rmdir(dir.c_str());
  }
  // Whether `result` came from the worker's own process (served directly).
  bool IsDirect(const std::string& result) {
    return result == absl::StrCat("direct ", manager->Info().worker_pid);
  }
  std::string dir;
  std::string path;
  StreamActivity activity;
  std::shared_ptr<DirectConnections> direct;
  std::unique_ptr<SessionManager> manager;
  std::unique_ptr<FrameWireServer> server;
  std::unique_ptr<DirectOrphanTimer> orphans;
};

TEST_CASE("A connection asking for direct calls is served by the worker; "
          "HALF_CLOSE ends it and its count", "[direct]") {
  Harness h;
  // No worker yet: the hand-over starts one and waits for its `ready`.
  Host host(h.path);
  // Pipelined with HELLO: these bytes reach the worker as `pre`.
  host.Hello(true, "client-a", Start("c1", "fake::echo", "x"));
  REQUIRE(h.IsDirect(host.NextResult()));
  host.Send(Start("c2", "fake::echo", "y"));
  CHECK(h.IsDirect(host.NextResult()));
  CHECK(h.direct->live() == 1);
  // No daemon thread holds it (the worker may answer before that thread
  // has closed its descriptors and ended).
  CHECK(Eventually([&] { return h.server->connections() == 0; }));
  CHECK(h.activity.open() == 1);        // but it is an open stream
  host.Send(HalfClose());
  CHECK(host.ReadStatus() == absl::StatusCode::kOk);
  REQUIRE(Eventually([&] { return h.direct->live() == 0; }));
  CHECK(h.activity.open() == 0);
  CHECK(h.direct->unknown_closes() == 0);
}

TEST_CASE("Connections the rules refuse are relayed", "[direct]") {
  Setup setup;
  bool key = true;
  SECTION("--direct_calls off") { setup.flag = false; }
  SECTION("no agentix-direct key") { key = false; }
  SECTION("a worker without the capability") { setup.capable = false; }
  SECTION("--max_concurrent_calls set") { setup.max_concurrent_calls = 4; }
  SECTION("no payload area") { setup.payload_ring_bytes = 0; }
  SECTION("a payload area without a ledger") { setup.ledger = false; }
  SECTION("a worker that never becomes ready (its boot error is relayed)") {
    setup.env.push_back("FAKE_WORKER_BOOT=hang");
  }
  Harness h(setup);
  Host host(h.path);
  host.Hello(key, "client-a", Start("c1", "fake::echo", "relayed"));
  const std::string result = host.NextResult();
  if (absl::StrContains(setup.env.empty() ? "" : setup.env[0], "hang")) {
    CHECK(result == "error WorkerBootError");
  } else {
    CHECK(result == "relayed");
  }
  CHECK(h.direct->live() == 0);
  host.Send(HalfClose());
  CHECK(host.ReadStatus() == absl::StatusCode::kOk);
}

TEST_CASE("A client whose calls the daemon holds stays relayed; others go "
          "direct", "[direct]") {
  Harness h;
  Host relayed(h.path);
  relayed.Hello(false, "client-a", Start("held", "fake::hang", ""));
  REQUIRE(Eventually([&] { return h.manager->Info().calls_in_flight == 1; }));
  Host same_client(h.path);
  same_client.Hello(true, "client-a", Start("c1", "fake::echo", "relayed"));
  CHECK(same_client.NextResult() == "relayed");
  Host other_client(h.path);
  other_client.Hello(true, "client-b", Start("c2", "fake::echo", "x"));
  CHECK(h.IsDirect(other_client.NextResult()));
  CHECK(h.direct->live() == 1);
}

TEST_CASE("Hand-overs beyond the cap are relayed until one closes", "[direct]") {
  Setup setup;
  setup.max_live = 1;
  Harness h(setup);
  Host first(h.path);
  first.Hello(true, "a", Start("c1", "fake::echo", "x"));
  REQUIRE(h.IsDirect(first.NextResult()));
  Host second(h.path);
  second.Hello(true, "b", Start("c2", "fake::echo", "relayed"));
  CHECK(second.NextResult() == "relayed");
  first.Send(HalfClose());
  CHECK(first.ReadStatus() == absl::StatusCode::kOk);
  REQUIRE(Eventually([&] { return h.direct->live() == 0; }));
  Host third(h.path);
  third.Hello(true, "c", Start("c3", "fake::echo", "x"));
  CHECK(h.IsDirect(third.NextResult()));
}

TEST_CASE("The worker holds the socket and the ring memfd until it reports "
          "direct_closed", "[direct]") {
  Harness h;
  REQUIRE(h.manager->StartWorker().ok());
  REQUIRE(Eventually([&] { return !h.manager->Info().worker_booting; }));
  const int64_t pid = h.manager->Info().worker_pid;
  const size_t before = OpenFdsOf(pid);
  auto ring = ipc::PayloadArea::Create(1u << 20, /*sealed=*/true);
  REQUIRE(ring.ok());
  Host host(h.path);
  host.Hello(true, "client-a", Start("c1", "fake::echo", "x"), ring->get());
  (*ring)->CloseFd();
  CHECK(h.IsDirect(host.NextResult()));
  CHECK(OpenFdsOf(pid) == before + 2);  // the socket and the ring's memfd
  host.Send(HalfClose());
  CHECK(host.ReadStatus() == absl::StatusCode::kOk);
  REQUIRE(Eventually([&] { return h.direct->live() == 0; }));
  CHECK(OpenFdsOf(pid) == before);
}

TEST_CASE("A worker that dies leaves its direct hosts an EOF and drops their "
          "counts", "[direct]") {
  Harness h;
  Host host(h.path);
  host.Hello(true, "client-a", Start("c1", "fake::echo", "x"));
  REQUIRE(h.IsDirect(host.NextResult()));
  Host other(h.path);
  other.Hello(true, "client-b", Start("c2", "fake::echo", "x"));
  REQUIRE(h.IsDirect(other.NextResult()));
  REQUIRE(h.direct->live() == 2);
  host.Send(Start("c3", "fake::kill", ""));
  CHECK(!host.Read().has_value());   // EOF, no STATUS: the host reconnects
  CHECK(!other.Read().has_value());
  REQUIRE(Eventually([&] { return h.direct->live() == 0; }));
  // A hand-over whose daemon thread commits after the worker's death drops
  // its stream count then (DirectConnections::Commit).
  CHECK(Eventually([&] { return h.activity.open() == 0; }));
}

TEST_CASE("A worker's death: its direct calls come back from the ledger as "
          "WorkerDied, finished ids refused, re-sent starts not run again",
          "[direct][ledger]") {
  Harness h;
  Host host(h.path);
  host.Hello(true, "client-a", Start("acked", "fake::echo", "x"));
  REQUIRE(h.IsDirect(host.NextResult()));
  const int64_t first_pid = h.manager->Info().worker_pid;
  host.Send(Ack("acked") + Start("retained", "fake::echo", "y") +
            Start("running", "fake::hang", "") +
            Start("garbage", "fake::ledger_garbage", ""));
  CHECK(host.NextEvent() == std::pair<std::string, std::string>(
                                "retained", absl::StrCat("direct ", first_pid)));
  CHECK(host.NextEvent().first == "garbage");
  // Another client with nothing open when the worker dies.
  Host other(h.path);
  other.Hello(true, "client-b", Start("b1", "fake::echo", "x"));
  REQUIRE(h.IsDirect(other.NextResult()));
  other.Send(Ack("b1") + HalfClose());
  CHECK(other.ReadStatus() == absl::StatusCode::kOk);
  host.Send(Start("killer", "fake::kill", ""));
  CHECK(!host.Read().has_value());  // EOF without STATUS: the host reconnects
  REQUIRE(Eventually([&] { return h.manager->Info().worker_pid != first_pid; }));

  // client-a's calls are the daemon's now: its reconnection is relayed
  // (eligibility 4) although it asks for direct calls.
  Host again(h.path);
  again.Hello(true, "client-a",
              Resume({"running", "retained", "garbage", "killer"}) +
                  Start("running", "fake::echo", "run again?") +
                  Start("acked", "fake::echo", "run again?") +
                  Start("ghost", "fake::echo", "ghost ran") +
                  Start("fresh", "fake::echo", "relayed"));
  std::map<std::string, std::string> seen;
  for (int i = 0; i < 7; ++i) {
    auto [id, value] = again.NextEvent();
    INFO(id << ": " << value);
    CHECK(seen.emplace(id, value).second);  // each id answered once
    if (value == "error WorkerDied") {
      CHECK(again.last_error().returncode() == -9);
      CHECK(absl::StrContains(again.last_error().message(), "killed by signal 9"));
    }
  }
  CHECK(seen["running"] == "error WorkerDied");  // re-sent start ignored
  CHECK(seen["retained"] == "error WorkerDied");
  CHECK(seen["garbage"] == "error WorkerDied");
  CHECK(seen["killer"] == "error WorkerDied");
  CHECK(seen["acked"] == "error ResultUnavailable");
  // The garbage slot (a client slot never assigned) was skipped: the id is
  // unknown, so its start runs.
  CHECK(seen["ghost"] == "ghost ran");
  CHECK(h.direct->live() == 0);
  // client-b held nothing: it goes direct to the fresh worker.
  Host b_again(h.path);
  b_again.Hello(true, "client-b", Start("b2", "fake::echo", "x"));
  CHECK(h.IsDirect(b_again.NextResult()));
  CHECK(h.manager->Info().worker_pid != first_pid);

  // Once client-a's calls are acked, its next connection goes direct again.
  again.Send(Ack("running") + Ack("retained") + Ack("garbage") + Ack("killer") +
             Ack("ghost") + Ack("fresh"));
  int probes = 0;
  REQUIRE(Eventually([&] {
    const std::string id = absl::StrCat("probe", ++probes);
    Host probe(h.path);
    probe.Hello(true, "client-a", Start(id, "fake::echo", "relayed"));
    const std::string result = probe.NextResult();
    probe.Send(Ack(id));
    return h.IsDirect(result);
  }));
}

TEST_CASE("Shutdown: the worker ends its direct connections with STATUS 14; "
          "Stop does not wait for them", "[direct]") {
  Harness h;
  Host host(h.path);
  host.Hello(true, "client-a", Start("c1", "fake::echo", "x"));
  REQUIRE(h.IsDirect(host.NextResult()));
  h.manager->Shutdown(absl::Seconds(3));
  CHECK(host.ReadStatus() == absl::StatusCode::kUnavailable);
  const absl::Time before = absl::Now();
  h.server->Stop();
  CHECK(absl::Now() - before < absl::Seconds(2));
  REQUIRE(Eventually([&] { return h.direct->live() == 0; }));
}

TEST_CASE("Handed-over connections count against --max-connections until the "
          "worker closes them", "[direct][guard]") {
  const ConnectionGuardStats at_start = GetConnectionGuardStats();
  ConnectionLimits limits;
  limits.max_connections = at_start.open + 1;
  REQUIRE(StartConnectionGuard(limits).ok());
  {
    Harness h;
    Host host(h.path);
    host.Hello(true, "client-a", Start("c1", "fake::echo", "x"));
    REQUIRE(h.IsDirect(host.NextResult()));
    // The worker may answer before the daemon's thread has counted the
    // hand-over (ReleaseHandedOver runs after the frame is queued).
    REQUIRE(Eventually([] { return GetConnectionGuardStats().handed_over == 1; }));
    CHECK(GetConnectionGuardStats().open == at_start.open + 1);
    // At the cap: the guard closes the next connection at accept.
    Host refused(h.path);
    CHECK(!refused.Read(absl::Seconds(5)).has_value());
    host.Send(HalfClose());
    CHECK(host.ReadStatus() == absl::StatusCode::kOk);
    REQUIRE(Eventually([&] { return GetConnectionGuardStats().handed_over == 0; }));
    CHECK(GetConnectionGuardStats().open == at_start.open);
    Host served(h.path);
    served.Hello(true, "client-b", Start("c2", "fake::echo", "x"));
    CHECK(h.IsDirect(served.NextResult()));
    served.Send(HalfClose());
    CHECK(served.ReadStatus() == absl::StatusCode::kOk);
    REQUIRE(Eventually([&] { return GetConnectionGuardStats().handed_over == 0; }));
  }
  limits.max_connections = 1024;  // the later cases' default
  REQUIRE(StartConnectionGuard(limits).ok());
}

// Stage 4b: the collapse (docs/DIRECT-CALLS.md). The fake worker's direct
// session retains its results until acked and runs fake::sleep.
TEST_CASE("A relayed connection of a direct client takes its session back: "
          "retained results replayed, a running call's result delivered "
          "relayed, finished ids refused, known ids ignored",
          "[direct][collapse]") {
  Harness h;
  Host direct(h.path);
  direct.Hello(true, "client-a", Start("acked", "fake::echo", "x"));
  REQUIRE(h.IsDirect(direct.NextResult()));
  direct.Send(Start("kept", "fake::echo", "x"));
  const std::string kept = direct.NextResult();
  REQUIRE(h.IsDirect(kept));
  // In one message, in order: the ack, then a call that runs 700 ms.
  CallsRequest both;
  both.add_events()->mutable_ack()->set_call_id("acked");
  AddStart(both, "running", "fake::sleep", "700");
  direct.Send(EncodeFrame(FrameKind::kMessage, both.SerializeAsString()));
  // (The fake publishes no running count: a moment for it to read them;
  // it reads its direct sockets before its link in each turn anyway.)
  absl::SleepFor(absl::Milliseconds(100));
  CHECK(h.manager->HoldsDirectSession("client-a"));

  Host relayed(h.path);
  relayed.Hello(false, "client-a", Resume({"kept", "running"}));
  // The direct connection ends as after any cut: the host reconnects.
  CHECK(direct.ReadStatus() == absl::StatusCode::kUnavailable);
  CHECK(relayed.NextResult() == kept);         // replayed by the daemon
  CHECK(relayed.NextResult() == "done");       // the worker's later output
  CHECK(!h.manager->HoldsDirectSession("client-a"));
  relayed.Send(Start("acked", "fake::echo", "again"));
  CHECK(relayed.NextResult() == "error ResultUnavailable");
  // A known id is ignored: the next answer is the next call's.
  relayed.Send(Start("kept", "fake::echo", "again") +
               Start("new", "fake::echo", "relayed"));
  CHECK(relayed.NextResult() == "relayed");
  REQUIRE(Eventually([&] { return h.direct->live() == 0; }));
  relayed.Send(HalfClose());
  CHECK(relayed.ReadStatus() == absl::StatusCode::kOk);
}

TEST_CASE("A client's new direct connection joins its held session; without "
          "a session a relayed connection waits for nothing",
          "[direct][collapse]") {
  Harness h;
  Host first(h.path);
  first.Hello(true, "client-a", Start("c1", "fake::echo", "x"));
  REQUIRE(h.IsDirect(first.NextResult()));
  Host second(h.path);
  second.Hello(true, "client-a", Start("c2", "fake::echo", "x"));
  CHECK(h.IsDirect(second.NextResult()));
  CHECK(h.manager->HoldsDirectSession("client-a"));
  const absl::Time before = absl::Now();
  Host other(h.path);
  other.Hello(false, "client-b", Start("c3", "fake::echo", "relayed"));
  CHECK(other.NextResult() == "relayed");
  CHECK(absl::Now() - before < absl::Seconds(2));
  CHECK(h.manager->HoldsDirectSession("client-a"));
}

TEST_CASE("A worker that does not answer the collapse: the relayed "
          "connection ends with UNAVAILABLE; no hand-over meanwhile",
          "[direct][collapse]") {
  Setup setup;
  setup.env.push_back("FAKE_WORKER_COLLAPSE=ignore");
  setup.collapse_timeout = absl::Milliseconds(300);
  Harness h(setup);
  Host direct(h.path);
  direct.Hello(true, "client-a", Start("c1", "fake::echo", "x"));
  REQUIRE(h.IsDirect(direct.NextResult()));
  Host relayed(h.path);
  relayed.Hello(false, "client-a", Start("c2", "fake::echo", "relayed"));
  CHECK(relayed.ReadStatus() == absl::StatusCode::kUnavailable);
  // The collapse stays asked: the client's next connections are relayed
  // and wait for it too.
  Host again(h.path);
  again.Hello(true, "client-a", Start("c3", "fake::echo", "relayed"));
  CHECK(again.ReadStatus() == absl::StatusCode::kUnavailable);
  CHECK(h.manager->HoldsDirectSession("client-a"));
  CHECK(h.direct->live() == 1);
}

TEST_CASE("A worker that dies while a collapse waits: the connection is "
          "served relayed by the next worker", "[direct][collapse]") {
  Setup setup;
  setup.env.push_back("FAKE_WORKER_COLLAPSE=ignore");
  Harness h(setup);
  Host direct(h.path);
  direct.Hello(true, "client-a", Start("c1", "fake::echo", "x"));
  REQUIRE(h.IsDirect(direct.NextResult()));
  const int64_t pid = h.manager->Info().worker_pid;
  Host relayed(h.path);
  relayed.Hello(false, "client-a", Start("c2", "fake::echo", "relayed"));
  absl::SleepFor(absl::Milliseconds(200));  // the collapse is waiting
  REQUIRE(::kill(static_cast<pid_t>(pid), SIGKILL) == 0);
  CHECK(relayed.NextResult() == "relayed");
  CHECK(!h.manager->HoldsDirectSession("client-a"));
}

TEST_CASE("An orphaned session is collapsed after the timeout; one with a "
          "live connection is not", "[direct][collapse]") {
  Setup setup;
  setup.orphan_after = absl::Milliseconds(200);
  Harness h(setup);
  Host stays(h.path);
  stays.Hello(true, "client-b", Start("b1", "fake::echo", "x"));
  REQUIRE(h.IsDirect(stays.NextResult()));
  Host leaves(h.path);
  leaves.Hello(true, "client-a", Start("a1", "fake::sleep", "300"));
  REQUIRE(Eventually([&] { return h.direct->live() == 2; }));
  ::shutdown(leaves.fd(), SHUT_RDWR);  // a cut: the call runs on
  REQUIRE(Eventually([&] { return h.direct->live() == 1; }));
  REQUIRE(Eventually([&] { return !h.manager->HoldsDirectSession("client-a"); },
                     absl::Seconds(5)));
  // The daemon holds it now: its result arrives there, and the client's
  // reconnect (direct asked, not eligible: the daemon holds its calls) is
  // relayed and resumes it.
  Host back(h.path);
  back.Hello(true, "client-a", Resume({"a1"}));
  CHECK(back.NextResult() == "done");
  CHECK(h.manager->HoldsDirectSession("client-b"));
  CHECK(h.direct->live() == 1);
}

}  // namespace
}  // namespace agentix::sandbox

namespace agentix::sandbox {
namespace {

// Stage 5: the fake worker tags a direct fake::log call's record with its
// connection, asks for the barrier and stamps the result with the answer.
TEST_CASE("A direct call's log record reaches its client's Logs streams "
          "before its result, whose barrier names it", "[direct]") {
  Harness h;
  auto mine = std::make_shared<LogStream>("client-a");
  auto other = std::make_shared<LogStream>("client-b");
  REQUIRE(h.manager->logs().Subscribe(mine, 0).ok());
  REQUIRE(h.manager->logs().Subscribe(other, 0).ok());
  Host host(h.path);
  host.Hello(true, "client-a", Start("c1", "fake::log", "direct hello"));
  const CallsResponse response = host.NextResponse();
  REQUIRE(response.events_size() == 1);
  REQUIRE(response.events(0).has_result());
  const runtime::v1::CallResult& result = response.events(0).result();
  CHECK(result.value() == "logged");
  REQUIRE(h.direct->live() == 1);  // served by the worker, not relayed
  // Read at once: the record was delivered before the barrier was answered.
  const std::vector<runtime::v1::LogRecord> got = mine->got();
  REQUIRE(got.size() == 1);
  CHECK(got[0].message() == "direct hello");
  CHECK(got[0].call_id() == "c1");
  CHECK(result.log_seq() == got[0].seq());
  CHECK(result.log_seq() > 0);
  CHECK(result.trace_seq() == 0);
  CHECK(other->got().empty());  // another client's stream never sees it
  CHECK(h.manager->direct_side_channels().calls_waiting() == 0);
  CHECK(h.manager->direct_side_channels().unknown_tags() == 0);

  // An untagged record while the call ran goes to every stream, as a
  // relayed call's does, and the barrier covers it.
  host.Send(Start("c2", "fake::log_untagged", "untagged"));
  const CallsResponse second = host.NextResponse();
  REQUIRE(second.events(0).has_result());
  const std::vector<runtime::v1::LogRecord> both = mine->got();
  REQUIRE(both.size() == 2);
  CHECK(both[1].message() == "untagged");
  CHECK(both[1].call_id().empty());
  CHECK(second.events(0).result().log_seq() == both[1].seq());
  REQUIRE(other->got().size() == 1);
  CHECK(other->got()[0].seq() == both[1].seq());

  // A call that logged nothing asks nothing: no barrier on its result.
  host.Send(Start("c3", "fake::echo", "quiet"));
  const CallsResponse quiet = host.NextResponse();
  REQUIRE(quiet.events(0).has_result());
  CHECK(quiet.events(0).result().log_seq() == 0);
  CHECK(h.manager->direct_side_channels().calls_waiting() == 0);
}

TEST_CASE("Two clients' direct calls: each client's streams get only its own "
          "records", "[direct]") {
  Harness h;
  auto a_stream = std::make_shared<LogStream>("client-a");
  auto b_stream = std::make_shared<LogStream>("client-b");
  REQUIRE(h.manager->logs().Subscribe(a_stream, 0).ok());
  REQUIRE(h.manager->logs().Subscribe(b_stream, 0).ok());
  Host a(h.path);
  a.Hello(true, "client-a", Start("a1", "fake::log", "from a"));
  Host b(h.path);
  b.Hello(true, "client-b", Start("b1", "fake::log", "from b"));
  const uint64_t a_seq = a.NextResponse().events(0).result().log_seq();
  const uint64_t b_seq = b.NextResponse().events(0).result().log_seq();
  CHECK(h.direct->live() == 2);
  REQUIRE(a_stream->got().size() == 1);
  REQUIRE(b_stream->got().size() == 1);
  CHECK(a_stream->got()[0].message() == "from a");
  CHECK(a_stream->got()[0].seq() == a_seq);
  CHECK(b_stream->got()[0].message() == "from b");
  CHECK(b_stream->got()[0].seq() == b_seq);
}

TEST_CASE("A changed calls-CPU answer reaches the direct hosts that follow "
          "changes, through the worker", "[direct]") {
  Setup setup;
  setup.calls_cpu = std::make_shared<CallsCpu>(CallsCpu::kRunningCpu);
  setup.calls_cpu->SetActive(false);  // (this test's threads stay put)
  setup.calls_cpu->SetHostWaits(CallsCpu::HostWaits::kPin);
  Harness h(setup);
  Host follows(h.path);
  follows.extra = {{kFrameCallsCpuFollowKey, kFrameCallsCpuFollowChanges}};
  follows.Hello(true, "client-a", Start("c1", "fake::echo", "x"));
  REQUIRE(h.IsDirect(follows.NextResponse().events(0).result().value()));
  Host first_only(h.path);
  first_only.extra = {{kFrameCallsCpuFollowKey, "1"}};
  first_only.Hello(true, "client-b", Start("c2", "fake::echo", "x"));
  REQUIRE(h.IsDirect(first_only.NextResponse().events(0).result().value()));
  CHECK(h.direct->live() == 2);
  // The daemon answered HELLO itself, before the hand-over.
  CHECK(follows.cpu_answers == std::vector<std::string>{"wait"});
  CHECK(first_only.cpu_answers == std::vector<std::string>{"wait"});

  h.manager->TellDirectCallsCpu("off");
  std::optional<WireFrame> told = follows.Read();
  REQUIRE(told.has_value());
  REQUIRE(told->kind == FrameKind::kHello);
  auto answer = DecodeHello(told->payload);
  REQUIRE(answer.ok());
  REQUIRE(FindMetadata(*answer, kFrameCallsCpuKey) != nullptr);
  CHECK(*FindMetadata(*answer, kFrameCallsCpuKey) == "off");
  // The worker wrote its answers to every connection at once: one for the
  // host that was told its first answer would be ahead of this result.
  first_only.Send(Start("c4", "fake::echo", "x"));
  CHECK(h.IsDirect(first_only.NextResponse().events(0).result().value()));
  CHECK(first_only.cpu_answers == std::vector<std::string>{"wait"});
}

}  // namespace
}  // namespace agentix::sandbox
