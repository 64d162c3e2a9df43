// The C++ client's frame-wire transport against a daemon end scripted on
// the other side of a socketpair (frames encoded and parsed with
// wire/frame_codec, the daemon's codec).
#include "agentix/frame_transport.h"

#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>
#include <thread>

#include "absl/time/clock.h"
#include "wire/frame_codec.h"
#include "testing/status_matchers.h"

namespace agentix::client_internal {
namespace {

namespace pb = ::agentix::runtime::v1;
using sandbox::FrameKind;

// The daemon's end: reads whole frames, writes raw bytes.
class Peer {
 public:
  explicit Peer(int fd) : fd_(fd) {}
  ~Peer() { ::close(fd_); }

  struct Frame {
    FrameKind kind;
    std::string payload;
  };
  // The next frame; REQUIREs that one arrives whole.
  Frame Next() {
    for (;;) {
      absl::StatusOr<sandbox::FrameView> frame = sandbox::ParseFrame(buffer_);
      REQUIRE_OK(frame.status());
      if (frame->frame_bytes > 0) {
        Frame out{frame->kind, std::string(frame->payload)};
        buffer_.erase(0, frame->frame_bytes);
        return out;
      }
      char chunk[4096];
      const ssize_t n = ::read(fd_, chunk, sizeof(chunk));
      REQUIRE(n > 0);
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }
  void Send(const std::string& bytes) {
    REQUIRE(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(bytes.size()));
  }
  void Close() { ::shutdown(fd_, SHUT_RDWR); }

 private:
  const int fd_;
  std::string buffer_;
};

struct Pair {
  std::unique_ptr<CallsTransport> transport;
  std::unique_ptr<Peer> peer;
};

Pair Open(const StreamMetadata& metadata = {{"agentix-client-id", "c1"}},
          absl::Duration spin = absl::ZeroDuration()) {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  Pair pair;
  pair.peer = std::make_unique<Peer>(fds[1]);
  pair.transport = NewFrameTransport(fds[0], metadata, spin);
  return pair;
}

std::string Message(const pb::CallsResponse& response) {
  return sandbox::EncodeFrame(FrameKind::kMessage, response.SerializeAsString());
}

pb::CallsResponse ResultFor(const std::string& id, const std::string& value) {
  pb::CallsResponse response;
  pb::CallResult* result = response.add_events()->mutable_result();
  result->set_call_id(id);
  result->set_value(value);
  return response;
}

TEST_CASE("A daemon's HELLO answer reaches the callback that asked; unasked, it ends the stream") {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  Peer peer(fds[1]);
  std::vector<std::string> told;
  std::unique_ptr<CallsTransport> transport =
      NewFrameTransport(fds[0], {{"agentix-calls-cpu-follow", "2"}}, absl::ZeroDuration(),
                        [&](absl::string_view value) { told.emplace_back(value); });
  REQUIRE(peer.Next().kind == FrameKind::kHello);
  peer.Send(sandbox::EncodeFrame(FrameKind::kHello,
                                 sandbox::EncodeHello({{"agentix-calls-cpu", "off"}})) +
            Message(ResultFor("call-1", "a")));
  pb::CallsResponse response;
  REQUIRE(transport->Read(&response));  // the answer is not a message: the next one is
  CHECK(response.events(0).result().call_id() == "call-1");
  CHECK(told == std::vector<std::string>{"off"});
  // A daemon that probes again says so whenever its answer changes.
  peer.Send(sandbox::EncodeFrame(FrameKind::kHello,
                                 sandbox::EncodeHello({{"agentix-calls-cpu", "wait"}})) +
            Message(ResultFor("call-2", "b")) +
            sandbox::EncodeFrame(FrameKind::kHello,
                                 sandbox::EncodeHello({{"agentix-calls-cpu", "off"}})) +
            Message(ResultFor("call-3", "c")));
  REQUIRE(transport->Read(&response));
  CHECK(response.events(0).result().call_id() == "call-2");
  CHECK(told == std::vector<std::string>{"off", "wait"});
  REQUIRE(transport->Read(&response));
  CHECK(response.events(0).result().call_id() == "call-3");
  CHECK(told == std::vector<std::string>{"off", "wait", "off"});

  Pair unasked = Open();
  unasked.peer->Next();
  unasked.peer->Send(sandbox::EncodeFrame(FrameKind::kHello,
                                          sandbox::EncodeHello({{"agentix-calls-cpu", "off"}})));
  CHECK_FALSE(unasked.transport->Read(&response));
  CHECK(unasked.transport->Finish().code() == absl::StatusCode::kInternal);
}

TEST_CASE("HELLO carries the metadata first; requests and responses are MESSAGE frames") {
  Pair pair = Open({{"authorization", "Bearer tok"}, {"agentix-client-id", "client-7"}});
  Peer::Frame hello = pair.peer->Next();
  REQUIRE(hello.kind == FrameKind::kHello);
  absl::StatusOr<sandbox::FrameMetadata> metadata = sandbox::DecodeHello(hello.payload);
  REQUIRE_OK(metadata.status());
  CHECK(*metadata == sandbox::FrameMetadata{{"authorization", "Bearer tok"},
                                            {"agentix-client-id", "client-7"}});

  pb::CallsRequest request;
  pb::StartCall* start = request.add_events()->mutable_start();
  start->set_call_id("call-1");
  start->set_callable("m::f");
  REQUIRE(pair.transport->Write(request));
  Peer::Frame message = pair.peer->Next();
  REQUIRE(message.kind == FrameKind::kMessage);
  CHECK(message.payload == request.SerializeAsString());

  // Two responses in one send, then a STATUS: each read apart.
  pair.peer->Send(Message(ResultFor("call-1", "a")) + Message(ResultFor("call-2", "bb")));
  pb::CallsResponse response;
  REQUIRE(pair.transport->Read(&response));
  CHECK(response.events(0).result().call_id() == "call-1");
  REQUIRE(pair.transport->Read(&response));
  CHECK(response.events(0).result().value() == "bb");
  pair.peer->Send(sandbox::EncodeFrame(
      FrameKind::kStatus, sandbox::EncodeStatus(absl::StatusCode::kUnauthenticated, "bad token")));
  CHECK_FALSE(pair.transport->Read(&response));
  const absl::Status status = pair.transport->Finish();
  CHECK(status.code() == absl::StatusCode::kUnauthenticated);
  CHECK(status.message() == "bad token");
}

TEST_CASE("WritesDone sends an empty HALF_CLOSE; STATUS OK ends the stream cleanly") {
  Pair pair = Open();
  REQUIRE(pair.peer->Next().kind == FrameKind::kHello);
  REQUIRE(pair.transport->WritesDone());
  Peer::Frame half_close = pair.peer->Next();
  CHECK(half_close.kind == FrameKind::kHalfClose);
  CHECK(half_close.payload.empty());
  pair.peer->Send(sandbox::EncodeFrame(FrameKind::kStatus,
                                       sandbox::EncodeStatus(absl::StatusCode::kOk, "")));
  pb::CallsResponse response;
  CHECK_FALSE(pair.transport->Read(&response));
  CHECK(pair.transport->Finish().ok());
}

TEST_CASE("a large response arriving in small pieces is read whole") {
  Pair pair = Open();
  pb::CallsResponse big;
  pb::ResultChunk* chunk = big.add_events()->mutable_result_chunk();
  chunk->set_call_id("call-big");
  std::string data(3 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 13);
  chunk->set_data(data);
  const std::string bytes = Message(big) + Message(ResultFor("call-small", "x"));
  std::thread sender([&] {
    for (size_t offset = 0; offset < bytes.size(); offset += 7000) {
      pair.peer->Send(bytes.substr(offset, 7000));
    }
  });
  pb::CallsResponse response;
  REQUIRE(pair.transport->Read(&response));
  CHECK(response.events(0).result_chunk().data() == data);
  REQUIRE(pair.transport->Read(&response));
  CHECK(response.events(0).result().call_id() == "call-small");
  sender.join();
}

TEST_CASE("EOF without a STATUS is UNAVAILABLE: the client resumes") {
  Pair pair = Open();
  pair.peer->Send(Message(ResultFor("call-1", "a")));
  pair.peer->Close();
  pb::CallsResponse response;
  REQUIRE(pair.transport->Read(&response));
  CHECK_FALSE(pair.transport->Read(&response));
  CHECK(pair.transport->Finish().code() == absl::StatusCode::kUnavailable);
}

TEST_CASE("Cancel unblocks a blocked Read; the stream ends CANCELLED") {
  Pair pair = Open();
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(100));
    pair.transport->Cancel();
  });
  pb::CallsResponse response;
  const absl::Time started = absl::Now();
  CHECK_FALSE(pair.transport->Read(&response));
  CHECK(absl::Now() - started < absl::Seconds(5));
  canceller.join();
  CHECK(pair.transport->Finish().code() == absl::StatusCode::kCancelled);
  pb::CallsRequest request;
  request.add_events()->mutable_cancel()->set_call_id("x");
  CHECK_FALSE(pair.transport->Write(request));
}

TEST_CASE("a malformed frame from the daemon ends the stream INTERNAL, without buffering it") {
  SECTION("a length over the limit") {
    Pair pair = Open();
    char header[sandbox::kFrameHeaderBytes];
    sandbox::EncodeFrameHeader(FrameKind::kMessage, 0xfffffff0u, header);
    pair.peer->Send(std::string(header, sizeof(header)));
    pb::CallsResponse response;
    CHECK_FALSE(pair.transport->Read(&response));
    CHECK(pair.transport->Finish().code() == absl::StatusCode::kInternal);
  }
  SECTION("a kind only a host sends") {
    Pair pair = Open();
    pair.peer->Send(sandbox::EncodeFrame(FrameKind::kHello, ""));
    pb::CallsResponse response;
    CHECK_FALSE(pair.transport->Read(&response));
    CHECK(pair.transport->Finish().code() == absl::StatusCode::kInternal);
  }
  SECTION("a MESSAGE that is not a CallsResponse") {
    Pair pair = Open();
    pair.peer->Send(sandbox::EncodeFrame(FrameKind::kMessage, "\xff\xff\xff"));
    pb::CallsResponse response;
    CHECK_FALSE(pair.transport->Read(&response));
    CHECK(pair.transport->Finish().code() == absl::StatusCode::kInternal);
  }
}

TEST_CASE("CallsSocketPath: PATH.calls for unix targets only") {
  CHECK(CallsSocketPath("unix:///run/agentix.sock") == "/run/agentix.sock.calls");
  CHECK(CallsSocketPath("unix:/run/agentix.sock") == "/run/agentix.sock.calls");
  CHECK(CallsSocketPath("unix:rel.sock") == "rel.sock.calls");
  CHECK(CallsSocketPath("localhost:50051").empty());
  CHECK(CallsSocketPath("dns:///host:1").empty());
  CHECK(CallsSocketPath("unix:").empty());
}

TEST_CASE("ConnectFrameTransport: UNAVAILABLE when nothing listens, HELLO when something does") {
  char dir[] = "/tmp/agentix-frame-test-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/d.sock.calls";
  CHECK(ConnectFrameTransport(path, {}).status().code() == absl::StatusCode::kUnavailable);

  const int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::snprintf(address.sun_path, sizeof(address.sun_path), "%s", path.c_str());
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  REQUIRE(::listen(listener, 4) == 0);
  absl::StatusOr<std::unique_ptr<CallsTransport>> transport =
      ConnectFrameTransport(path, {{"agentix-client-id", "c9"}});
  REQUIRE_OK(transport.status());
  CHECK(std::string((*transport)->wire()) == "frames");
  Peer peer(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
  Peer::Frame hello = peer.Next();
  CHECK(hello.kind == FrameKind::kHello);
  CHECK(*sandbox::FindMetadata(*sandbox::DecodeHello(hello.payload), "agentix-client-id") == "c9");
  ::close(listener);
  ::unlink(path.c_str());
  ::rmdir(dir);
}

TEST_CASE("A spinning reader reads every message and stops spinning when "
          "results come slowly") {
  // A long window makes the adaptation measurable: without it every message
  // paced slower than the window costs a full window of CPU (30 x 25 ms
  // here); with it, about two windows in all.
  Pair pair = Open({}, absl::Milliseconds(25));
  REQUIRE(pair.peer->Next().kind == FrameKind::kHello);
  double paced_cpu_ms = 0;
  std::thread reader([&] {
    pb::CallsResponse response;
    for (int i = 0; i < 20; ++i) {
      REQUIRE(pair.transport->Read(&response));
      CHECK(response.events(0).result().call_id() == "fast");
    }
    rusage before{}, after{};
    ::getrusage(RUSAGE_THREAD, &before);
    for (int i = 0; i < 30; ++i) {
      REQUIRE(pair.transport->Read(&response));
      CHECK(response.events(0).result().call_id() == "slow");
    }
    ::getrusage(RUSAGE_THREAD, &after);
    auto ms = [](const rusage& u) {
      return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 +
             (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
    };
    paced_cpu_ms = ms(after) - ms(before);
  });
  for (int i = 0; i < 20; ++i) pair.peer->Send(Message(ResultFor("fast", "x")));
  for (int i = 0; i < 30; ++i) {
    absl::SleepFor(absl::Milliseconds(30));
    pair.peer->Send(Message(ResultFor("slow", "x")));
  }
  reader.join();
  INFO("reader CPU over the paced messages: " << paced_cpu_ms << " ms");
  CHECK(paced_cpu_ms < 250);
}

TEST_CASE("AGENTIX_CALLS_SPIN_US: microseconds, or a definite error") {
  ::unsetenv("AGENTIX_CALLS_SPIN_US");
  CHECK(*CallsSpinFromEnv() == absl::ZeroDuration());
  ::setenv("AGENTIX_CALLS_SPIN_US", "40", 1);
  CHECK(*CallsSpinFromEnv() == absl::Microseconds(40));
  for (const char* bad : {"-1", "fast", "2000000"}) {
    ::setenv("AGENTIX_CALLS_SPIN_US", bad, 1);
    absl::StatusOr<absl::Duration> spin = CallsSpinFromEnv();
    REQUIRE_FALSE(spin.ok());
    CHECK(spin.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(spin.status().message().find("AGENTIX_CALLS_SPIN_US") != absl::string_view::npos);
    // Connecting refuses it too, before touching the socket.
    CHECK(ConnectFrameTransport("/nonexistent/x.calls", {}).status().code() ==
          absl::StatusCode::kInvalidArgument);
  }
  ::unsetenv("AGENTIX_CALLS_SPIN_US");
}

}  // namespace
}  // namespace agentix::client_internal
