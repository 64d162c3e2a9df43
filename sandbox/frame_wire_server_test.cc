#include "sandbox/frame_wire_server.h"

#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "sandbox/connection_guard.h"
#include "sandbox/fake_worker_calls.h"
#include "wire/frame_codec.h"
#include "wire/wire_limits.h"
#include "worker/ipc/payload_area.h"

namespace agentix::sandbox {
namespace {

using runtime::v1::CallsRequest;
using runtime::v1::CallsResponse;

constexpr char kToken[] = "frame-wire-test-token";

std::string TempDir() {
  char dir[] = "/tmp/agx-fw-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  return dir;
}

struct Harness {
  explicit Harness(SessionOptions session = FakeWorkerSessionOptions(),
                   FrameWireOptions wire = FrameWireOptions())
      : dir(TempDir()), manager(std::move(session)) {
    wire.path = dir + "/d.sock.calls";
    if (!wire.gate) wire.gate = TokenGate::Fixed(kToken);
    path = wire.path;
    server = std::make_unique<FrameWireServer>(&manager, wire);
    REQUIRE(server->Start().ok());
  }
  ~Harness() {
    server->Stop();
    ::rmdir(dir.c_str());
  }
  std::string dir;
  std::string path;
  SessionManager manager;
  std::unique_ptr<FrameWireServer> server;
};

struct Frame {
  FrameKind kind;
  std::string payload;
};

// A frame-wire host written from the spec alone: blocking socket I/O with
// a deadline on every read.
class Client {
 public:
  explicit Client(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, path.c_str());
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) ==
            0);
  }
  ~Client() { ::close(fd_); }

  // Errors are left to the reads that follow: a daemon that refused the
  // stream may have closed it before a pipelined frame arrives.
  void SendRaw(const std::string& bytes) {
    size_t at = 0;
    while (at < bytes.size()) {
      const ssize_t n =
          ::send(fd_, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
      if (n <= 0) return;
      at += static_cast<size_t>(n);
    }
  }
  void Send(FrameKind kind, const std::string& payload) {
    SendRaw(EncodeFrame(kind, payload));
  }
  void Hello(const std::string& token = kToken,
             const std::string& client_id = "") {
    FrameMetadata metadata;
    if (!token.empty()) metadata.emplace_back("authorization", "Bearer " + token);
    if (!client_id.empty()) metadata.emplace_back("agentix-client-id", client_id);
    Send(FrameKind::kHello, EncodeHello(metadata));
  }
  void Request(const CallsRequest& request) {
    Send(FrameKind::kMessage, request.SerializeAsString());
  }
  void HalfClose() { Send(FrameKind::kHalfClose, ""); }

  // The next frame; nullopt on EOF. Fails the test after `timeout`.
  std::optional<Frame> Read(absl::Duration timeout = absl::Seconds(20)) {
    std::string header;
    if (!ReadExactly(kFrameHeaderBytes, header, timeout)) return std::nullopt;
    const auto* h = reinterpret_cast<const unsigned char*>(header.data());
    const size_t length = size_t{h[0]} | size_t{h[1]} << 8 |
                          size_t{h[2]} << 16 | size_t{h[3]} << 24;
    Frame frame{static_cast<FrameKind>(h[4]), ""};
    REQUIRE(ReadExactly(length, frame.payload, timeout));
    return frame;
  }

  // Reads to the STATUS frame (which must be followed by EOF); the
  // messages before it go to `messages`.
  FrameStatus ReadToStatus(std::vector<CallsResponse>* messages = nullptr,
                           absl::Duration timeout = absl::Seconds(20)) {
    for (;;) {
      std::optional<Frame> frame = Read(timeout);
      REQUIRE(frame.has_value());
      if (frame->kind == FrameKind::kStatus) {
        auto status = DecodeStatus(frame->payload);
        REQUIRE(status.ok());
        REQUIRE(!Read(timeout).has_value());  // closed after the STATUS
        return *status;
      }
      REQUIRE(frame->kind == FrameKind::kMessage);
      REQUIRE(frame->payload.size() <= kMaxBatchBytes);
      CallsResponse response;
      REQUIRE(response.ParseFromString(frame->payload));
      if (messages != nullptr) messages->push_back(std::move(response));
    }
  }

  // The next MESSAGE, parsed.
  CallsResponse ReadMessage() {
    std::optional<Frame> frame = Read();
    REQUIRE(frame.has_value());
    INFO(frame->payload);
    REQUIRE(frame->kind == FrameKind::kMessage);
    CallsResponse response;
    REQUIRE(response.ParseFromString(frame->payload));
    return response;
  }

  int fd() const { return fd_; }

 private:
  bool ReadExactly(size_t n, std::string& out,
                   absl::Duration timeout) {
    out.resize(n);
    size_t at = 0;
    const absl::Time deadline = absl::Now() + timeout;
    while (at < n) {
      pollfd p{fd_, POLLIN, 0};
      const int left = static_cast<int>(
          std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
      REQUIRE(::poll(&p, 1, left) == 1);  // no deadline overrun
      const ssize_t got = ::recv(fd_, out.data() + at, n - at, 0);
      if (got == 0 && at == 0) return false;
      REQUIRE(got > 0);
      at += static_cast<size_t>(got);
    }
    return true;
  }

  int fd_ = -1;
};

// call_id -> value (chunks joined) of every result in `messages`.
std::map<std::string, std::string> Results(
    const std::vector<CallsResponse>& messages) {
  std::map<std::string, std::string> pending, done;
  for (const auto& m : messages) {
    for (const auto& e : m.events()) {
      if (e.has_result_chunk()) {
        pending[e.result_chunk().call_id()] += e.result_chunk().data();
      } else if (e.has_result()) {
        done[e.result().call_id()] =
            pending[e.result().call_id()] + e.result().value();
      }
    }
  }
  return done;
}

// Echoes `text` as the last call of `c`'s open stream: half-closes it,
// reads to its STATUS (which must be OK) and returns the call's value.
std::string LastEcho(Client& c, const std::string& id, const std::string& text) {
  CallsRequest req;
  AddStart(req, id, "fake::echo", text);
  c.Request(req);
  c.HalfClose();
  std::vector<CallsResponse> messages;
  REQUIRE(c.ReadToStatus(&messages).code == 0);
  return Results(messages)[id];
}

// Echo one call over a fresh stream; returns its value.
std::string EchoOnce(const std::string& path, const std::string& id,
                     const std::string& text) {
  Client c(path);
  c.Hello();
  return LastEcho(c, id, text);
}

TEST_CASE("Calls run over the frame wire; HALF_CLOSE ends the stream with "
          "STATUS 0 after the last result",
          "[frame_wire]") {
  Harness h;
  struct stat st;
  REQUIRE(::stat(h.path.c_str(), &st) == 0);
  REQUIRE(S_ISSOCK(st.st_mode));
  REQUIRE((st.st_mode & 0777) == 0600);

  Client c(h.path);
  // Pipelined: HELLO, two calls and HALF_CLOSE without waiting.
  c.Hello();
  CallsRequest req;
  AddStart(req, "noop", "fake::echo", "");
  AddStart(req, "echo", "fake::echo", "hello frames");
  c.Request(req);
  CallsRequest slow;
  AddStart(slow, "slow", "fake::sleep", "300");
  c.Request(slow);
  c.HalfClose();
  std::vector<CallsResponse> messages;
  const FrameStatus status = c.ReadToStatus(&messages);
  REQUIRE(status.code == 0);
  auto results = Results(messages);
  REQUIRE(results.size() == 3);
  REQUIRE(results.count("noop") == 1);
  REQUIRE(results["echo"] == "hello frames");
  REQUIRE(results["slow"] == "done");  // STATUS waited for it
  REQUIRE(h.server->connections() <= 1);
}

TEST_CASE("A result over 4 MiB arrives as ResultChunks in frames within the "
          "gRPC message cap",
          "[frame_wire]") {
  Harness h;
  Client c(h.path);
  c.Hello();
  const size_t total = (9u << 20) + 12345;
  std::string big(total, '\0');
  for (size_t i = 0; i < total; ++i) big[i] = static_cast<char>('a' + i % 23);
  // Arguments over one MESSAGE's cap go as ArgumentChunks, as a host sends.
  CallsRequest start;
  auto* s = start.add_events()->mutable_start();
  s->set_call_id("big");
  s->set_callable("fake::echo");
  s->set_encoding(runtime::v1::ENCODING_PICKLE);
  s->set_arguments(big.substr(0, 1u << 20));
  s->set_arguments_size(total);
  c.Request(start);
  for (size_t at = 1u << 20; at < total; at += 1u << 20) {
    CallsRequest chunk;
    auto* a = chunk.add_events()->mutable_argument_chunk();
    a->set_call_id("big");
    a->set_data(big.substr(at, 1u << 20));
    c.Request(chunk);
  }
  c.HalfClose();
  std::vector<CallsResponse> messages;  // ReadToStatus checks each frame's cap
  REQUIRE(c.ReadToStatus(&messages).code == 0);
  size_t chunks = 0;
  for (const auto& m : messages) {
    for (const auto& e : m.events()) {
      chunks += e.has_result_chunk();
      if (e.has_error()) FAIL(e.error().DebugString());
    }
  }
  REQUIRE(chunks >= 1);  // the worker decides how many
  REQUIRE(messages.size() >= 3);  // more than one frame: the cap held
  const std::string got = Results(messages)["big"];
  REQUIRE(got.size() == big.size());
  REQUIRE((got == big));  // not printed: 9 MiB
}

TEST_CASE("Values around the splice threshold and the chunk size arrive "
          "byte-exact, several calls to a message",
          "[frame_wire]") {
  // Arguments of 64 KiB or more are read in place and results of that size
  // written from the retained events (frame_splice.h); both sides of each
  // boundary, and messages mixing spliced and small events.
  Harness h;
  Client c(h.path);
  c.Hello();
  const size_t sizes[] = {(64u << 10) - 1, 64u << 10,       (64u << 10) + 1,
                          (1u << 20) - 1,  1u << 20,        (1u << 20) + 1,
                          (2u << 20) + 3,  (3u << 20) + 17};
  std::map<std::string, std::string> sent;
  CallsRequest batch;
  size_t batched = 0;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    std::string value(sizes[i], '\0');
    for (size_t k = 0; k < value.size(); ++k) {
      value[k] = static_cast<char>((k * 131 + i * 7) % 251);
    }
    const std::string id = "v" + std::to_string(i);
    AddStart(batch, id, "fake::echo", value);
    AddStart(batch, id + "-small", "fake::echo", "s" + std::to_string(i));
    sent[id] = std::move(value);
    sent[id + "-small"] = "s" + std::to_string(i);
    batched += sizes[i];
    if (batched >= (2u << 20) || i + 1 == std::size(sizes)) {
      c.Request(batch);  // each MESSAGE stays within the 4 MiB + 64 KiB cap
      batch.Clear();
      batched = 0;
    }
  }
  c.HalfClose();
  std::vector<CallsResponse> messages;
  REQUIRE(c.ReadToStatus(&messages).code == 0);
  const std::map<std::string, std::string> got = Results(messages);
  REQUIRE(got.size() == sent.size());
  for (const auto& [id, value] : sent) {
    INFO(id);
    REQUIRE(got.at(id).size() == value.size());
    REQUIRE((got.at(id) == value));  // not printed: megabytes
  }
}

TEST_CASE("A wrong or missing token gets STATUS 16; good clients are served",
          "[frame_wire]") {
  Harness h;
  for (const std::string token : {"wrong", ""}) {
    Client bad(h.path);
    bad.Hello(token);
    CallsRequest req;
    AddStart(req, "never-" + token, "fake::echo", "x");
    bad.Request(req);  // pipelined behind the refused HELLO: never runs
    const FrameStatus status = bad.ReadToStatus();
    REQUIRE(status.code == 16);
    REQUIRE(!status.details.empty());
  }
  REQUIRE(EchoOnce(h.path, "good", "served") == "served");
  REQUIRE(h.manager.Info().calls_in_flight == 0);
}

TEST_CASE("An unarmed daemon answers FAILED_PRECONDITION as on gRPC",
          "[frame_wire]") {
  FrameWireOptions wire;
  wire.gate = TokenGate::Armable("admin-token-xyz");
  Harness h(FakeWorkerSessionOptions(), wire);
  Client c(h.path);
  c.Hello("admin-token-xyz");
  const FrameStatus status = c.ReadToStatus();
  REQUIRE(status.code == 9);
  REQUIRE(status.details == kNotActivatedMessage);
}

TEST_CASE("Malformed frames end that stream with STATUS 3; others are "
          "unaffected",
          "[frame_wire]") {
  Harness h;
  Client bystander(h.path);
  bystander.Hello();
  struct Case {
    const char* name;
    std::function<void(Client&)> send;
    const char* details;
  };
  char oversized[kFrameHeaderBytes];
  EncodeFrameHeader(FrameKind::kMessage, kMaxFrameMessageBytes + 1, oversized);
  const std::string oversized_header(oversized, sizeof(oversized));
  const std::vector<Case> cases = {
      {"unknown kind",
       [](Client& c) { c.Hello(); c.SendRaw(std::string("\0\0\0\0\x09", 5)); },
       "unknown frame kind 9"},
      {"oversized length",
       [&](Client& c) { c.Hello(); c.SendRaw(oversized_header); },
       "at most"},
      {"missing HELLO",
       [](Client& c) { c.Send(FrameKind::kMessage, ""); },
       "the first frame must be HELLO"},
      {"HELLO twice",
       [](Client& c) { c.Hello(); c.Hello(); },
       "a second HELLO"},
      {"bad HELLO payload",
       [](Client& c) { c.Send(FrameKind::kHello, "\x05"); },
       "HELLO"},
      {"STATUS from the host",
       [](Client& c) {
         c.Hello();
         c.Send(FrameKind::kStatus, EncodeStatus(absl::StatusCode::kOk, ""));
       },
       "may not send"},
      {"frame after HALF_CLOSE",
       [](Client& c) {
         c.Hello();
         CallsRequest req;  // an open call keeps the stream open
         AddStart(req, "open", "fake::sleep", "2000");
         c.Request(req);
         c.HalfClose();
         c.Send(FrameKind::kMessage, "");
       },
       "after HALF_CLOSE"},
  };
  for (const Case& test : cases) {
    INFO(test.name);
    Client c(h.path);
    test.send(c);
    const FrameStatus status = c.ReadToStatus();
    REQUIRE(status.code == 3);
    REQUIRE(absl::StrContains(status.details, test.details));
  }
  // The stream opened before them still runs calls.
  REQUIRE(LastEcho(bystander, "after", "still here") == "still here");
}

TEST_CASE("An unparseable MESSAGE gets BadRequest and the stream stays open",
          "[frame_wire]") {
  Harness h;
  Client c(h.path);
  c.Hello();
  c.Send(FrameKind::kMessage, "\x0a\x64zz");  // field 1 claims 100 bytes
  const CallsResponse response = c.ReadMessage();
  REQUIRE(response.events_size() == 1);
  const auto& error = response.events(0).error().error();
  REQUIRE(error.type() == "BadRequest");
  REQUIRE(error.code() == static_cast<int>(absl::StatusCode::kInvalidArgument));
  REQUIRE(LastEcho(c, "after", "served") == "served");
}

TEST_CASE("A silent client gets STATUS 4 after the HELLO timeout",
          "[frame_wire]") {
  FrameWireOptions wire;
  wire.hello_timeout = absl::Milliseconds(300);
  Harness h(FakeWorkerSessionOptions(), wire);
  Client silent(h.path);
  const absl::Time start = absl::Now();
  const FrameStatus status = silent.ReadToStatus(nullptr, absl::Seconds(5));
  REQUIRE(status.code == 4);
  REQUIRE(absl::Now() - start < absl::Seconds(3));
  // Half a HELLO is no better than none.
  Client partial(h.path);
  partial.SendRaw(EncodeFrame(FrameKind::kHello, EncodeHello({{"a", "b"}}))
                      .substr(0, 7));
  REQUIRE(partial.ReadToStatus(nullptr, absl::Seconds(5)).code == 4);
  for (int i = 0; i < 200 && h.server->connections() > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  REQUIRE(h.server->connections() == 0);
}

// Whether `done` holds for the connection guard's figures within 3 s.
template <typename Done>
bool GuardReaches(Done done) {
  for (int i = 0; i < 300; ++i) {
    if (done(GetConnectionGuardStats())) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return done(GetConnectionGuardStats());
}

TEST_CASE("The connection guard counts a frame-wire connection authenticated "
          "once its HELLO is accepted, and a silent one as timed out",
          "[frame_wire][connection_guard]") {
  // The daemon's guard (accept4, recvmsg and close interposed); its own
  // timeout is far off, so only the frame wire ends connections here.
  ConnectionLimits limits;
  limits.auth_timeout = absl::Minutes(1);
  REQUIRE(StartConnectionGuard(limits).ok());
  FrameWireOptions wire;
  wire.hello_timeout = absl::Milliseconds(300);
  Harness h(FakeWorkerSessionOptions(), wire);
  const ConnectionGuardStats before = GetConnectionGuardStats();

  Client good(h.path);
  REQUIRE(GuardReaches([&](const ConnectionGuardStats& s) {
    return s.open == before.open + 1 &&
           s.unauthenticated == before.unauthenticated + 1;
  }));
  good.Hello();
  REQUIRE(GuardReaches([&](const ConnectionGuardStats& s) {
    return s.unauthenticated == before.unauthenticated;
  }));
  CHECK(GetConnectionGuardStats().open == before.open + 1);

  // A refused token leaves it unauthenticated until it is closed.
  {
    Client bad(h.path);
    bad.Hello("wrong");
    REQUIRE(bad.ReadToStatus().code == 16);
  }
  // No HELLO: STATUS 4 from the frame wire, counted as the guard's own
  // timeout would count it (once).
  {
    Client silent(h.path);
    REQUIRE(silent.ReadToStatus(nullptr, absl::Seconds(5)).code == 4);
  }
  REQUIRE(GuardReaches([&](const ConnectionGuardStats& s) {
    return s.open == before.open + 1 &&
           s.unauthenticated == before.unauthenticated;
  }));
  const ConnectionGuardStats after = GetConnectionGuardStats();
  CHECK(after.timed_out == before.timed_out + 1);
  CHECK(after.refused == before.refused);

  // The authenticated stream still runs calls.
  REQUIRE(LastEcho(good, "still", "served") == "served");
}

TEST_CASE("Connections beyond the cap get STATUS 8; a freed slot serves again",
          "[frame_wire]") {
  FrameWireOptions wire;
  wire.max_connections = 2;
  Harness h(FakeWorkerSessionOptions(), wire);
  auto first = std::make_unique<Client>(h.path);
  auto second = std::make_unique<Client>(h.path);
  first->Hello();
  second->Hello();
  // Both are held by their threads before the third arrives.
  for (int i = 0; i < 200 && h.server->connections() < 2; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  Client third(h.path);
  const FrameStatus refused = third.ReadToStatus();
  REQUIRE(refused.code == 8);
  REQUIRE(absl::StrContains(refused.details, "too many frame-wire connections"));
  first.reset();  // EOF: the stream is lost, its slot freed
  for (int i = 0; i < 200 && h.server->connections() > 1; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  REQUIRE(EchoOnce(h.path, "again", "slot") == "slot");
}

TEST_CASE("A host that stops reading is ended with STATUS 8 within the "
          "stalled-host bound; its calls stay retained",
          "[frame_wire]") {
  SessionOptions session = FakeWorkerSessionOptions();
  session.max_retained_bytes = 2u << 20;
  session.stalled_host_timeout = absl::Milliseconds(500);
  FrameWireOptions wire;
  wire.finish_grace = absl::Seconds(10);
  Harness h(session, wire);
  Client c(h.path);
  int small = 1 << 12;  // a small receive buffer fills sooner
  ::setsockopt(c.fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  c.Hello();
  const std::string value(3u << 20, 'v');
  for (int i = 0; i < 4; ++i) {
    CallsRequest req;
    AddStart(req, "stall" + std::to_string(i), "fake::echo", value);
    c.Request(req);
  }
  // Not reading; the daemon must give up on this stream by itself.
  absl::SleepFor(absl::Seconds(3));
  std::vector<CallsResponse> messages;
  const FrameStatus status = c.ReadToStatus(&messages, absl::Seconds(20));
  REQUIRE(status.code == 8);
  REQUIRE(absl::StrContains(status.details, "did not read"));
  // The unwritten backlog is freed.
  REQUIRE(h.manager.unwritten_result_bytes()->load() == 0);
  // A new stream resumes a call the dead one did not get.
  Client again(h.path);
  again.Hello();
  CallsRequest resume;
  resume.add_events()->mutable_resume()->add_call_ids("stall3");
  again.Request(resume);
  again.HalfClose();
  std::vector<CallsResponse> resumed;
  REQUIRE(again.ReadToStatus(&resumed, absl::Seconds(20)).code == 0);
  REQUIRE(Results(resumed)["stall3"] == value);
}

TEST_CASE("Stop ends every stream with STATUS 14 and removes the socket file",
          "[frame_wire]") {
  Harness h;
  Client c(h.path);
  c.Hello();
  CallsRequest req;
  AddStart(req, "hang", "fake::hang", "");
  c.Request(req);
  for (int i = 0; i < 500 && h.manager.Info().calls_in_flight == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  h.server->Stop();
  const FrameStatus status = c.ReadToStatus();
  REQUIRE(status.code == 14);
  struct stat st;
  REQUIRE(::stat(h.path.c_str(), &st) != 0);
  REQUIRE(h.server->connections() == 0);
}

// This process's CPU time (all threads: the connection's among them).
absl::Duration ProcessCpu() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return absl::DurationFromTimeval(usage.ru_utime) +
         absl::DurationFromTimeval(usage.ru_stime);
}

TEST_CASE("A spinning connection thread serves calls and stops spinning on a "
          "paced stream",
          "[frame_wire]") {
  // A long window makes the adaptation measurable: without it every call of
  // a stream paced slower than the window costs a full window of CPU (30 x
  // 25 ms here); with it, about two windows in all.
  FrameWireOptions wire;
  wire.spin = absl::Milliseconds(25);
  Harness h(FakeWorkerSessionOptions(), wire);
  Client c(h.path);
  c.Hello();
  auto call = [&](const std::string& id) {
    CallsRequest req;
    AddStart(req, id, "fake::echo", id);
    c.Request(req);
    REQUIRE(Results({c.ReadMessage()})[id] == id);
  };
  for (int i = 0; i < 20; ++i) call(absl::StrCat("fast", i));  // back to back
  const absl::Duration before = ProcessCpu();
  for (int i = 0; i < 30; ++i) {  // paced: each wait is longer than 25 ms
    absl::SleepFor(absl::Milliseconds(30));
    call(absl::StrCat("slow", i));
  }
  const absl::Duration spent = ProcessCpu() - before;
  INFO("process CPU over the paced calls: " << absl::FormatDuration(spent));
  CHECK(spent < absl::Milliseconds(250));
  c.HalfClose();
  REQUIRE(c.ReadToStatus().code == 0);
}

// --- The Namespace stream on the frame wire (HELLO agentix-stream) ---

using runtime::v1::NamespaceRequest;
using runtime::v1::NamespaceResponse;

void HelloStream(Client& c, const std::string& stream,
                 const std::string& token = kToken) {
  FrameMetadata metadata;
  if (!token.empty()) metadata.emplace_back("authorization", "Bearer " + token);
  metadata.emplace_back(kFrameStreamKey, stream);
  c.Send(FrameKind::kHello, EncodeHello(metadata));
}

void Open(Client& c, const std::string& name) {
  NamespaceRequest open;
  open.mutable_open()->set_namespace_(name);
  c.Send(FrameKind::kMessage, open.SerializeAsString());
}

void SendEvent(Client& c, const std::string& event, const std::string& id,
               const std::string& data) {
  NamespaceRequest request;
  auto* e = request.mutable_event();
  e->set_event(event);
  e->set_request_id(id);
  e->set_data(data);
  c.Send(FrameKind::kMessage, request.SerializeAsString());
}

// Reads to the STATUS frame (then EOF); the NamespaceResponses before it go
// to `messages`.
FrameStatus NamespaceReadToStatus(Client& c,
                                  std::vector<NamespaceResponse>* messages) {
  for (;;) {
    std::optional<Frame> frame = c.Read();
    REQUIRE(frame.has_value());
    if (frame->kind == FrameKind::kStatus) {
      auto status = DecodeStatus(frame->payload);
      REQUIRE(status.ok());
      REQUIRE(!c.Read().has_value());
      return *status;
    }
    REQUIRE(frame->kind == FrameKind::kMessage);
    NamespaceResponse response;
    REQUIRE(response.ParseFromString(frame->payload));
    if (messages != nullptr) messages->push_back(std::move(response));
  }
}

NamespaceResponse ReadNamespaceMessage(Client& c) {
  std::optional<Frame> frame = c.Read();
  REQUIRE(frame.has_value());
  INFO(frame->payload);
  REQUIRE(frame->kind == FrameKind::kMessage);
  NamespaceResponse response;
  REQUIRE(response.ParseFromString(frame->payload));
  return response;
}

TEST_CASE("A Namespace stream runs over the frame wire: opened first, host "
          "events reach the worker, its events come back; HALF_CLOSE ends "
          "it with STATUS 0",
          "[frame_wire][namespace]") {
  Harness h;
  Client c(h.path);
  // Pipelined: HELLO, OpenNamespace and an event without waiting.
  HelloStream(c, "namespace");
  Open(c, "/plug");
  SendEvent(c, "ping", "r1", "payload-1");
  const NamespaceResponse opened = ReadNamespaceMessage(c);
  REQUIRE(opened.opened());
  REQUIRE(opened.events_size() == 0);
  REQUIRE(opened.namespace_() == "/plug");
  REQUIRE(opened.instance_id() == h.manager.logs().instance_id());
  REQUIRE(h.manager.namespaces().Subscribers("/plug") == 1);
  const NamespaceResponse reply = ReadNamespaceMessage(c);
  REQUIRE(!reply.opened());
  REQUIRE(reply.namespace_() == "/plug");
  REQUIRE(reply.events_size() == 1);
  REQUIRE(reply.events(0).event() == "ping:result");
  REQUIRE(reply.events(0).request_id() == "r1");
  REQUIRE(reply.events(0).data() == "payload-1");
  // Many events in order; the calls stream beside it is unaffected.
  for (int i = 0; i < 50; ++i) {
    SendEvent(c, "seq", std::to_string(i), "d" + std::to_string(i));
  }
  REQUIRE(EchoOnce(h.path, "beside", "calls too") == "calls too");
  int next = 0;
  while (next < 50) {
    const NamespaceResponse m = ReadNamespaceMessage(c);
    for (const auto& e : m.events()) {
      REQUIRE(e.event() == "seq:result");
      REQUIRE(e.request_id() == std::to_string(next++));
    }
  }
  // As on gRPC, a half-closed stream ends once what is queued is written.
  c.HalfClose();
  std::vector<NamespaceResponse> messages;
  REQUIRE(NamespaceReadToStatus(c, &messages).code == 0);
  REQUIRE(messages.empty());
  // The stream left the hub when it ended.
  for (int i = 0; i < 500 && h.manager.namespaces().OpenStreams() != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  REQUIRE(h.manager.namespaces().OpenStreams() == 0);
}

TEST_CASE("A HELLO naming an unknown stream gets STATUS 12; a namespace HELLO "
          "with a wrong token gets STATUS 16",
          "[frame_wire][namespace]") {
  Harness h;
  {
    Client c(h.path);
    HelloStream(c, "logs");
    Open(c, "/plug");  // pipelined behind the refused HELLO: ignored
    const FrameStatus status = NamespaceReadToStatus(c, nullptr);
    REQUIRE(status.code == 12);
    REQUIRE(absl::StrContains(status.details, "logs"));
    REQUIRE(absl::StrContains(status.details, "namespace"));
  }
  for (const std::string token : {"wrong", ""}) {
    Client c(h.path);
    HelloStream(c, "namespace", token);
    Open(c, "/plug");
    REQUIRE(NamespaceReadToStatus(c, nullptr).code == 16);
  }
  REQUIRE(h.manager.namespaces().OpenStreams() == 0);
  // An explicit "calls" is the Calls stream.
  Client calls(h.path);
  HelloStream(calls, "calls");
  CallsRequest req;
  AddStart(req, "explicit", "fake::echo", "yes");
  calls.Request(req);
  calls.HalfClose();
  std::vector<CallsResponse> messages;
  REQUIRE(calls.ReadToStatus(&messages).code == 0);
  REQUIRE(Results(messages)["explicit"] == "yes");
}

TEST_CASE("Namespace stream errors end it with gRPC's status codes",
          "[frame_wire][namespace]") {
  Harness h;
  struct Case {
    std::string name;
    std::function<void(Client&)> send;
    uint32_t code;
  };
  const std::vector<Case> cases = {
      {"reserved name", [](Client& c) { Open(c, "/rpc"); }, 3},
      {"no leading slash", [](Client& c) { Open(c, "plug"); }, 3},
      {"event before open",
       [](Client& c) { SendEvent(c, "ping", "r", "x"); }, 9},
      {"second open",
       [](Client& c) {
         Open(c, "/plug");
         Open(c, "/other");
       },
       9},
      {"reserved event",
       [](Client& c) {
         Open(c, "/plug");
         SendEvent(c, kHostConnectedEvent, "", "");
       },
       3},
      {"event name too long",
       [](Client& c) {
         Open(c, "/plug");
         SendEvent(c, std::string(kMaxEventNameBytes + 1, 'e'), "", "");
       },
       3},
      {"unparseable message",
       [](Client& c) { c.Send(FrameKind::kMessage, "\xff\xff\xff"); }, 3},
  };
  for (const auto& test : cases) {
    INFO(test.name);
    Client c(h.path);
    HelloStream(c, "namespace");
    test.send(c);
    const FrameStatus status = NamespaceReadToStatus(c, nullptr);
    REQUIRE(status.code == test.code);
    REQUIRE(!status.details.empty());
  }
  for (int i = 0; i < 500 && h.manager.namespaces().OpenStreams() != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  REQUIRE(h.manager.namespaces().OpenStreams() == 0);
}

TEST_CASE("A Namespace host that stops reading does not hold back call "
          "results; its events wait for it",
          "[frame_wire][namespace]") {
  SessionOptions session;
  session.worker.worker_path = "testing/fake_worker";
  session.max_retained_bytes = 1u << 20;  // results unwritten past this pause the worker
  Harness h(session);
  Client ns(h.path);
  HelloStream(ns, "namespace");
  Open(ns, "/flood");
  REQUIRE(ReadNamespaceMessage(ns).opened());
  // 4 MiB of echoes the host does not read: far more than the socket holds.
  const std::string data(64u << 10, 'f');
  for (int i = 0; i < 64; ++i) SendEvent(ns, "blob", std::to_string(i), data);
  absl::SleepFor(absl::Milliseconds(500));  // the echoes queue in the daemon
  REQUIRE(EchoOnce(h.path, "meanwhile", "served") == "served");
  int next = 0;
  while (next < 64) {
    const NamespaceResponse m = ReadNamespaceMessage(ns);
    for (const auto& e : m.events()) {
      REQUIRE(e.request_id() == std::to_string(next++));
      REQUIRE(e.data() == data);
    }
  }
}

TEST_CASE("Stop ends a Namespace stream with STATUS 14",
          "[frame_wire][namespace]") {
  Harness h;
  Client c(h.path);
  HelloStream(c, "namespace");
  Open(c, "/plug");
  REQUIRE(ReadNamespaceMessage(c).opened());
  h.server->Stop();
  REQUIRE(NamespaceReadToStatus(c, nullptr).code == 14);
  REQUIRE(h.manager.namespaces().OpenStreams() == 0);
}

// --- the payload ring (docs/FRAME-WIRE.md, "Payload ring") ----------------

// Sends HELLO (with the token) and `fds` beside it, as a ring-sharing
// host does; `ring_key`: whether HELLO asks for the payload ring.
void HelloWithFds(Client& c, const std::vector<int>& fds, bool ring_key) {
  FrameMetadata metadata;
  metadata.emplace_back("authorization", absl::StrCat("Bearer ", kToken));
  if (ring_key) metadata.emplace_back(kFramePayloadRingKey, "1");
  const std::string hello = EncodeFrame(FrameKind::kHello, EncodeHello(metadata));
  iovec iov{const_cast<char*>(hello.data()), hello.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))] = {};
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
  }
  REQUIRE(::sendmsg(c.fd(), &msg, MSG_NOSIGNAL) ==
          static_cast<ssize_t>(hello.size()));
}

// A host sharing a payload ring: its end of the area (it created it).
struct RingHost {
  explicit RingHost(const std::string& path, size_t ring_bytes = 4u << 20)
      : client(path) {
    auto made = ipc::PayloadArea::Create(ring_bytes, /*sealed=*/true);
    REQUIRE(made.ok());
    area = std::move(*made);
    HelloWithFds(client, {area->fd()}, true);
    area->CloseFd();
    // The daemon says it maps the ring: an empty RING_MESSAGE first.
    std::optional<Frame> accepted = client.Read();
    REQUIRE(accepted.has_value());
    REQUIRE(accepted->kind == FrameKind::kRingMessage);
    REQUIRE(accepted->payload == std::string("\0\0", 2));
  }

  // Sends `request` with each bulk field of 64 KiB or more in the ring
  // (inline when it does not fit).
  void Send(const CallsRequest& request) {
    const std::string message = request.SerializeAsString();
    std::vector<RingPieceRef> refs;
    std::string rest;
    size_t from = 0;
    for (const auto& event : request.events()) {
      const std::string& bulk = event.has_start() ? event.start().arguments()
                                                  : event.argument_chunk().data();
      if (bulk.size() < (64u << 10)) continue;
      std::optional<uint64_t> pos = area->Put(bulk);
      if (!pos) continue;
      const size_t found = message.find(bulk, from);
      REQUIRE(found != std::string::npos);
      rest += message.substr(from, found - from);
      refs.push_back({static_cast<uint32_t>(rest.size()), *pos, bulk.size()});
      from = found + bulk.size();
      ++pieces_sent;
    }
    rest += message.substr(from);
    client.Send(FrameKind::kRingMessage, EncodeRingHead(refs) + rest);
  }

  // Reads to STATUS, putting RING_MESSAGEs back together from the ring
  // (released after each unless `hold`); the messages go to `messages`.
  FrameStatus ReadToStatus(std::vector<CallsResponse>& messages,
                           bool hold = false) {
    for (;;) {
      std::optional<Frame> frame = client.Read();
      REQUIRE(frame.has_value());
      if (frame->kind == FrameKind::kStatus) {
        auto status = DecodeStatus(frame->payload);
        REQUIRE(status.ok());
        return *status;
      }
      std::string whole = frame->payload;
      if (frame->kind == FrameKind::kRingMessage) {
        auto ring = DecodeRingMessage(frame->payload, kMaxFrameMessageBytes);
        REQUIRE(ring.ok());
        whole.clear();
        size_t done = 0;
        for (const RingPieceRef& ref : ring->pieces) {
          whole += std::string(ring->bytes.substr(done, ref.at - done));
          done = ref.at;
          auto data = area->Get(ref.pos, ref.size);
          REQUIRE(data.ok());
          whole += std::string(*data);
          if (!hold) area->Release(ref.pos + ref.size);
          ++pieces_received;
        }
        whole += std::string(ring->bytes.substr(done));
      } else {
        REQUIRE(frame->kind == FrameKind::kMessage);
      }
      CallsResponse response;
      REQUIRE(response.ParseFromString(whole));
      messages.push_back(std::move(response));
    }
  }

  Client client;
  std::unique_ptr<ipc::PayloadArea> area;
  size_t pieces_sent = 0;
  size_t pieces_received = 0;
};

std::string Pattern(size_t n, int seed) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>((i * 131 + seed) % 251);
  return out;
}

// Sends an echo of `value` in 1 MiB pieces through `host`.
void SendEcho(RingHost& host, const std::string& id, const std::string& value) {
  CallsRequest start;
  auto* s = start.add_events()->mutable_start();
  s->set_call_id(id);
  s->set_callable("fake::echo");
  s->set_encoding(runtime::v1::ENCODING_PICKLE);
  s->set_arguments(value.substr(0, 1u << 20));
  s->set_arguments_size(value.size());
  host.Send(start);
  for (size_t at = 1u << 20; at < value.size(); at += 1u << 20) {
    CallsRequest chunk;
    auto* a = chunk.add_events()->mutable_argument_chunk();
    a->set_call_id(id);
    a->set_data(value.substr(at, 1u << 20));
    a->set_offset(at);
    host.Send(chunk);
  }
}

TEST_CASE("With a payload ring, large arguments and results cross as ring "
          "positions, byte-exact",
          "[frame_wire][ring]") {
  Harness h;
  RingHost host(h.path, 16u << 20);  // room for all of it
  const std::string big = Pattern((9u << 20) + 12345, 1);
  const std::string mid = Pattern(100u << 10, 2);
  SendEcho(host, "big", big);
  SendEcho(host, "mid", mid);
  CallsRequest small;
  AddStart(small, "small", "fake::echo", "tiny");
  host.Send(small);  // a RING_MESSAGE without pieces is a CallsRequest too
  host.client.HalfClose();
  std::vector<CallsResponse> messages;
  REQUIRE(host.ReadToStatus(messages).code == 0);
  auto results = Results(messages);
  REQUIRE(results.size() == 3);
  REQUIRE((results["big"] == big));  // not printed: megabytes
  REQUIRE((results["mid"] == mid));
  REQUIRE(results["small"] == "tiny");
  CHECK(host.pieces_sent == 10);  // nine of big (not its 12345-byte tail), mid
  CHECK(host.pieces_received >= 10);
  // A client without the ring on the same daemon is served as before.
  REQUIRE(EchoOnce(h.path, "plain", std::string(200u << 10, 'p')) ==
          std::string(200u << 10, 'p'));
}

TEST_CASE("A host that does not release its ring gets the rest inline",
          "[frame_wire][ring]") {
  Harness h;
  RingHost host(h.path, 2u << 20);
  const std::string big = Pattern(6u << 20, 3);
  SendEcho(host, "big", big);
  host.client.HalfClose();
  std::vector<CallsResponse> messages;
  REQUIRE(host.ReadToStatus(messages, /*hold=*/true).code == 0);
  REQUIRE((Results(messages)["big"] == big));
  // At most the 2 MiB ring's worth came through it; the rest inline.
  CHECK(host.pieces_received >= 1);
  CHECK(host.pieces_received <= 2);
}

TEST_CASE("Bad ring use ends that stream with STATUS 3 saying what; others "
          "are served",
          "[frame_wire][ring]") {
  Harness h;
  Client bystander(h.path);
  bystander.Hello();
  const std::string piece(100u << 10, 'x');
  auto chunk_with_ring = [&](RingHost& host, uint64_t pos, uint64_t size) {
    CallsRequest request;
    auto* a = request.add_events()->mutable_argument_chunk();
    a->set_call_id("c");
    a->set_data(piece);
    const std::string message = request.SerializeAsString();
    const size_t at = message.find(piece);
    host.client.Send(
        FrameKind::kRingMessage,
        EncodeRingHead({{static_cast<uint32_t>(at), pos, size}}) +
            message.substr(0, at) + message.substr(at + piece.size()));
  };
  struct Case {
    const char* name;
    std::function<FrameStatus(Harness&)> run;
    const char* details;
  };
  const std::vector<Case> cases = {
      {"RING_MESSAGE without a ring",
       [](Harness& h) {
         Client c(h.path);
         c.Hello();
         c.Send(FrameKind::kRingMessage, EncodeRingHead({}));
         return c.ReadToStatus();
       },
       "without a payload ring"},
      {"a piece outside the ring",
       [&](Harness& h) {
         RingHost host(h.path, 1u << 20);
         chunk_with_ring(host, (1u << 20) - 10, piece.size());
         std::vector<CallsResponse> ignored;
         return host.ReadToStatus(ignored);
       },
       "outside"},
      {"a piece released already",
       [&](Harness& h) {
         RingHost host(h.path, 1u << 20);
         REQUIRE(host.area->Put(piece).value() == 0);
         chunk_with_ring(host, 0, piece.size());
         chunk_with_ring(host, 0, piece.size());  // the same bytes again
         std::vector<CallsResponse> ignored;
         return host.ReadToStatus(ignored);
       },
       "already released"},
      {"a piece not at a bulk field",
       [&](Harness& h) {
         RingHost host(h.path, 1u << 20);
         chunk_with_ring(host, 0, piece.size() - 1);
         std::vector<CallsResponse> ignored;
         return host.ReadToStatus(ignored);
       },
       "ring piece"},
      {"a ring that is not sealed",
       [](Harness& h) {
         Client c(h.path);
         auto area = ipc::PayloadArea::Create(1u << 20);  // not sealed
         REQUIRE(area.ok());
         HelloWithFds(c, {(*area)->fd()}, true);
         return c.ReadToStatus();
       },
       "F_SEAL_SHRINK"},
      {"a memfd without the key",
       [](Harness& h) {
         Client c(h.path);
         auto area = ipc::PayloadArea::Create(1u << 20, true);
         REQUIRE(area.ok());
         HelloWithFds(c, {(*area)->fd()}, false);
         return c.ReadToStatus();
       },
       "file descriptors came with HELLO"},
      {"two memfds",
       [](Harness& h) {
         Client c(h.path);
         auto area = ipc::PayloadArea::Create(1u << 20, true);
         REQUIRE(area.ok());
         HelloWithFds(c, {(*area)->fd(), (*area)->fd()}, true);
         return c.ReadToStatus();
       },
       "file descriptors came with HELLO"},
  };
  for (const Case& test : cases) {
    INFO(test.name);
    const FrameStatus status = test.run(h);
    REQUIRE(status.code == 3);
    REQUIRE(absl::StrContains(status.details, test.details));
  }
  REQUIRE(LastEcho(bystander, "after", "still here") == "still here");
}

TEST_CASE("HELLO asking for the ring without a memfd (a relay that passes "
          "bytes only) gets no ring and is served as before",
          "[frame_wire][ring]") {
  Harness h;
  Client c(h.path);
  HelloWithFds(c, {}, true);
  // No "ring accepted" frame: the first frame is the call's result.
  const std::string value(200u << 10, 'r');
  REQUIRE(LastEcho(c, "relayed", value) == value);
}

// --calls_cpu=probe's answers: hosts that asked for changes hear each one,
// stop 31's hosts ("1") the first only, hosts that did not ask nothing.
TEST_CASE("A probing daemon tells each host what it asked for: every change, the first "
          "answer, or nothing",
          "[frame_wire]") {
  FrameWireOptions wire;
  wire.calls_cpu = std::make_shared<CallsCpu>(CallsCpu::kRunningCpu);
  wire.calls_cpu->SetActive(false);  // (this test's threads stay where they are)
  wire.calls_cpu->SetHostWaits(CallsCpu::HostWaits::kUnknown);
  Harness h(FakeWorkerSessionOptions(), wire);
  auto hello = [&](Client& c, const char* follow) {
    FrameMetadata metadata{{"authorization", absl::StrCat("Bearer ", kToken)}};
    if (follow != nullptr) metadata.emplace_back(kFrameCallsCpuFollowKey, follow);
    c.Send(FrameKind::kHello, EncodeHello(metadata));
  };
  // One call's frames: its result's, and the HELLO answers before it is in.
  auto call = [](Client& c, const std::string& id) {
    CallsRequest req;
    AddStart(req, id, "fake::echo", id);
    c.Request(req);
    std::vector<std::string> told;
    for (;;) {
      std::optional<Frame> frame = c.Read();
      REQUIRE(frame.has_value());
      if (frame->kind == FrameKind::kHello) {
        absl::StatusOr<FrameMetadata> answer = DecodeHello(frame->payload);
        REQUIRE(answer.ok());
        REQUIRE(answer->size() == 1);
        CHECK((*answer)[0].first == kFrameCallsCpuKey);
        told.push_back((*answer)[0].second);
        continue;
      }
      REQUIRE(frame->kind == FrameKind::kMessage);
      CallsResponse response;
      REQUIRE(response.ParseFromString(frame->payload));
      if (Results({response}).count(id) != 0) return told;
    }
  };
  Client changes(h.path), first(h.path), silent(h.path);
  hello(changes, kFrameCallsCpuFollowChanges);
  hello(first, "1");
  hello(silent, nullptr);
  // Before the probe has chosen nothing is told; then each asker at its next frame.
  CHECK(call(changes, "c1").empty());
  CHECK(call(first, "f1").empty());
  wire.calls_cpu->SetHostWaits(CallsCpu::HostWaits::kOff);
  std::vector<std::string> told_changes = call(changes, "c2");
  std::vector<std::string> told_first = call(first, "f2");
  // (the answer may come behind the result, written by another thread: the
  // next call's frames carry it then)
  if (told_changes.empty()) told_changes = call(changes, "c2b");
  if (told_first.empty()) told_first = call(first, "f2b");
  CHECK(told_changes == std::vector<std::string>{"off"});
  CHECK(told_first == std::vector<std::string>{"off"});
  // A re-probe changes the answer: only the host that asked for changes hears it.
  wire.calls_cpu->SetHostWaits(CallsCpu::HostWaits::kPin);
  told_changes = call(changes, "c3");
  if (told_changes.empty()) told_changes = call(changes, "c3b");
  CHECK(told_changes == std::vector<std::string>{"wait"});
  // The others, while the answer differs from what they were told: only
  // MESSAGE frames to the end (ReadToStatus requires it).
  for (Client* c : {&first, &silent}) {
    for (int i = 0; i < 2; ++i) {
      CallsRequest req;
      AddStart(req, absl::StrCat(c == &first ? "first-" : "silent-", i), "fake::echo", "x");
      c->Request(req);
    }
    c->HalfClose();
    std::vector<CallsResponse> messages;
    CHECK(c->ReadToStatus(&messages).code == 0);
    CHECK(Results(messages).size() == 2);
  }
  wire.calls_cpu->SetHostWaits(CallsCpu::HostWaits::kOff);
  told_changes = call(changes, "c4");
  if (told_changes.empty()) told_changes = call(changes, "c4b");
  CHECK(told_changes == std::vector<std::string>{"off"});
}

}  // namespace
}  // namespace agentix::sandbox
