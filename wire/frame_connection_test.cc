#include "wire/frame_connection.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <atomic>
#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "wire/frame_codec.h"
#include "wire/frame_splice.h"
#include "wire/splice_test_util.h"
#include "wire/wire_limits.h"
#include "worker/ipc/payload_area.h"

namespace agentix::sandbox {
namespace {

using runtime::v1::CallsRequest;
using runtime::v1::CallsResponse;
using runtime::v1::HostEvent;
using runtime::v1::SandboxEvent;

class Recorder : public FrameConnectionConsumer {
 public:
  void OnRequest(SplicedRequest& request) override {
    for (const auto& bulk : request.bulk) bulk_views += bulk.has_value();
    requests.push_back(Rebuilt(request));
    if (on_request) on_request(requests.back());
  }
  void OnHalfClose() override {
    ++half_closes;
    if (on_half_close) on_half_close();
  }
  void OnEnd(absl::Status why) override {
    CHECK(!end.has_value());  // once
    end = std::move(why);
  }

  void OnMessage(absl::string_view payload) override {
    messages.emplace_back(payload);
  }

  std::vector<CallsRequest> requests;
  std::vector<std::string> messages;  // raw_messages only
  size_t bulk_views = 0;
  int half_closes = 0;
  std::optional<absl::Status> end;
  std::function<void(const CallsRequest&)> on_request;
  std::function<void()> on_half_close;
};

struct Sockets {
  Sockets() {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    host = fds[0];
    served = fds[1];
  }
  ~Sockets() {
    if (host >= 0) ::close(host);
  }
  void SmallBuffers() {
    const int size = 16 << 10;
    ::setsockopt(host, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
    ::setsockopt(served, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
  }
  int host = -1;
  int served = -1;  // handed to the connection, which closes it
};

std::unique_ptr<FrameConnection> Serve(int fd, Recorder& recorder,
                                       std::string pre = "",
                                       int ring_fd = -1,
                                       FrameConnectionOptions options = {}) {
  auto connection = FrameConnection::Create(fd, std::move(pre), ring_fd,
                                            &recorder, std::move(options));
  REQUIRE(connection.ok());
  (*connection)->Start();
  return std::move(*connection);
}

// The owner's poll loop, until `done` holds or the connection ends (true
// when `done` holds), for at most `limit`.
bool Pump(FrameConnection& connection, const std::function<bool()>& done,
          absl::Duration limit = absl::Seconds(20)) {
  const absl::Time give_up = absl::Now() + limit;
  while (!done()) {
    if (connection.Done() || absl::Now() >= give_up) return done();
    pollfd p{connection.fd(), connection.PollEvents(), 0};
    const absl::Time deadline = std::min(connection.NextDeadline(),
                                         absl::Now() + absl::Milliseconds(20));
    const int ms = static_cast<int>(std::max<int64_t>(
        0, absl::ToInt64Milliseconds(deadline - absl::Now())));
    const int ready = ::poll(&p, 1, ms);
    if (ready > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
      connection.ReadReady();
    }
    if (ready > 0 && (p.revents & POLLOUT)) connection.WriteReady();
    if (absl::Now() >= connection.NextDeadline()) connection.OnDeadline();
  }
  return true;
}

void WriteAll(int fd, absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    REQUIRE(n > 0);
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

// Everything the host reads until EOF (blocking).
std::string ReadToEof(int fd) {
  std::string out;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) return out;
    out.append(buffer, static_cast<size_t>(n));
  }
}

// What is there now (non-blocking).
std::string ReadAvailable(int fd) {
  std::string out;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n <= 0) return out;
    out.append(buffer, static_cast<size_t>(n));
  }
}

struct HostFrame {
  FrameKind kind;
  std::string payload;  // a RING_MESSAGE's put back together as a MESSAGE's
};

// Parses what the connection wrote, taking ring pieces out of `ring` (the
// host's side of the area) and releasing them, as the host does.
std::vector<HostFrame> ParseFrames(absl::string_view bytes,
                                   ipc::PayloadArea* ring = nullptr) {
  std::vector<HostFrame> out;
  while (!bytes.empty()) {
    absl::StatusOr<FrameView> frame = ParseFrame(bytes);
    REQUIRE(frame.ok());
    REQUIRE(frame->frame_bytes > 0);  // whole frames only
    if (frame->kind == FrameKind::kRingMessage) {
      REQUIRE(ring != nullptr);
      auto message = DecodeRingMessage(frame->payload, kMaxFrameMessageBytes);
      REQUIRE(message.ok());
      std::string whole;
      size_t done = 0;
      uint64_t end = 0;
      for (const RingPieceRef& ref : message->pieces) {
        whole += std::string(message->bytes.substr(done, ref.at - done));
        done = ref.at;
        auto data = ring->Get(ref.pos, ref.size);
        REQUIRE(data.ok());
        whole += std::string(*data);
        end = ref.pos + ref.size;
      }
      whole += std::string(message->bytes.substr(done));
      if (end != 0) ring->Release(end);
      out.push_back({FrameKind::kRingMessage, std::move(whole)});
    } else {
      out.push_back({frame->kind, std::string(frame->payload)});
    }
    bytes.remove_prefix(frame->frame_bytes);
  }
  return out;
}

std::vector<SandboxEvent> EventsOf(const std::vector<HostFrame>& frames) {
  std::vector<SandboxEvent> out;
  for (const HostFrame& frame : frames) {
    if (frame.kind != FrameKind::kMessage &&
        frame.kind != FrameKind::kRingMessage) {
      continue;
    }
    CallsResponse response;
    REQUIRE(response.ParseFromString(frame.payload));
    REQUIRE(response.ByteSizeLong() <= kMaxBatchBytes);
    for (const auto& event : response.events()) out.push_back(event);
  }
  return out;
}

FrameStatus LastStatus(const std::vector<HostFrame>& frames) {
  REQUIRE(!frames.empty());
  REQUIRE(frames.back().kind == FrameKind::kStatus);
  auto status = DecodeStatus(frames.back().payload);
  REQUIRE(status.ok());
  return *status;
}

std::string Message(const CallsRequest& request) {
  return EncodeFrame(FrameKind::kMessage, request.SerializeAsString());
}

CallsRequest Start(const std::string& id, std::string arguments = "x",
                   uint64_t arguments_size = 0) {
  CallsRequest request;
  auto* start = request.add_events()->mutable_start();
  start->set_call_id(id);
  start->set_callable("mod::fn");
  start->set_arguments(std::move(arguments));
  if (arguments_size != 0) start->set_arguments_size(arguments_size);
  return request;
}

CallsRequest Chunk(const std::string& id, std::string data, uint64_t offset) {
  CallsRequest request;
  auto* chunk = request.add_events()->mutable_argument_chunk();
  chunk->set_call_id(id);
  chunk->set_data(std::move(data));
  chunk->set_offset(offset);
  return request;
}

SandboxEventPtr Result(const std::string& id, std::string value) {
  auto event = std::make_shared<SandboxEvent>();
  event->mutable_result()->set_call_id(id);
  event->mutable_result()->set_value(std::move(value));
  return event;
}

SandboxEventPtr ResultChunk(const std::string& id, std::string data) {
  auto event = std::make_shared<SandboxEvent>();
  event->mutable_result_chunk()->set_call_id(id);
  event->mutable_result_chunk()->set_data(std::move(data));
  return event;
}

// A RING_MESSAGE standing for `request`, each of whose events is one
// argument chunk or start whose bulk field is put into the host's ring.
std::string RingFrame(const CallsRequest& request, ipc::PayloadArea& ring) {
  const std::string message = request.SerializeAsString();
  std::vector<RingPieceRef> pieces;
  std::string bytes;
  size_t from = 0;
  for (const HostEvent& event : request.events()) {
    const std::string& bulk = event.has_start() ? event.start().arguments()
                                                : event.argument_chunk().data();
    const size_t found = message.find(bulk, from);
    REQUIRE(found != std::string::npos);
    bytes += message.substr(from, found - from);
    std::optional<uint64_t> pos = ring.Put(bulk);
    REQUIRE(pos.has_value());
    pieces.push_back({static_cast<uint32_t>(bytes.size()), *pos, bulk.size()});
    from = found + bulk.size();
  }
  bytes += message.substr(from);
  return EncodeFrame(FrameKind::kRingMessage, EncodeRingHead(pieces) + bytes);
}

TEST_CASE("requests are handed over whole: in one read, split across reads, "
          "and after the bytes read past HELLO") {
  Recorder recorder;
  Sockets sockets;
  const std::string first = Message(Start("c1"));
  const std::string second = Message(Start("c2"));

  SECTION("two requests in one read") {
    auto connection = Serve(sockets.served, recorder);
    WriteAll(sockets.host, first + second);
    REQUIRE(Pump(*connection, [&] { return recorder.requests.size() == 2; }));
    CHECK(recorder.requests[0].events(0).start().call_id() == "c1");
    CHECK(recorder.requests[1].events(0).start().call_id() == "c2");
  }
  SECTION("one request a byte at a time") {
    auto connection = Serve(sockets.served, recorder);
    for (size_t i = 0; i < first.size(); ++i) {
      CHECK(recorder.requests.empty());
      WriteAll(sockets.host, first.substr(i, 1));
      pollfd p{connection->fd(), POLLIN, 0};
      REQUIRE(::poll(&p, 1, 5000) == 1);
      connection->ReadReady();
    }
    REQUIRE(recorder.requests.size() == 1);
    CHECK(recorder.requests[0].events(0).start().call_id() == "c1");
  }
  SECTION("a whole request and part of the next one read with HELLO") {
    auto connection =
        Serve(sockets.served, recorder, first + second.substr(0, 3));
    REQUIRE(recorder.requests.size() == 1);  // Start handled the whole one
    WriteAll(sockets.host, second.substr(3));
    REQUIRE(Pump(*connection, [&] { return recorder.requests.size() == 2; }));
    CHECK(recorder.requests[1].events(0).start().call_id() == "c2");
  }
  CHECK(!recorder.end.has_value());
}

TEST_CASE("raw_messages: MESSAGE payloads unparsed, SendMessages' frames "
          "written, no ring pieces (a Namespace stream's, stage 8)") {
  Recorder recorder;
  Sockets sockets;
  FrameConnectionOptions options;
  options.raw_messages = true;
  // Not a CallsRequest: a raw connection hands it over as it is.
  const std::string odd = "\xff\x01 not protobuf";
  auto connection = Serve(sockets.served, recorder,
                          EncodeFrame(FrameKind::kMessage, "first"), -1,
                          std::move(options));
  REQUIRE(recorder.messages == std::vector<std::string>{"first"});
  WriteAll(sockets.host, EncodeFrame(FrameKind::kMessage, odd));
  REQUIRE(Pump(*connection, [&] { return recorder.messages.size() == 2; }));
  CHECK(recorder.messages[1] == odd);
  CHECK(recorder.requests.empty());

  auto sent = connection->SendMessages({"one", std::string(100000, 'x')});
  REQUIRE(sent.ok());
  std::string expected = EncodeFrame(FrameKind::kMessage, "one") +
                         EncodeFrame(FrameKind::kMessage,
                                     std::string(100000, 'x'));
  std::string got;
  REQUIRE(Pump(*connection, [&] {
    got += ReadAvailable(sockets.host);
    return got.size() >= expected.size();
  }));
  CHECK(got == expected);

  // A ring piece has no ring to come from: refused.
  WriteAll(sockets.host, EncodeFrame(FrameKind::kRingMessage, "x"));
  Pump(*connection, [] { return false; }, absl::Seconds(5));
  REQUIRE(recorder.end.has_value());
  CHECK(recorder.end->code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a 9 MiB upload arrives whole through socket bytes and through "
          "the host's ring") {
  constexpr size_t kPiece = 3u << 20;
  const std::string data = Bytes(3 * kPiece, 'u');
  std::vector<CallsRequest> upload = {
      Start("big", data.substr(0, kPiece), data.size()),
      Chunk("big", data.substr(kPiece, kPiece), kPiece),
      Chunk("big", data.substr(2 * kPiece), 2 * kPiece)};
  Recorder recorder;
  Sockets sockets;
  std::unique_ptr<FrameConnection> connection;
  std::unique_ptr<ipc::PayloadArea> ring;
  std::string bytes;

  SECTION("socket bytes") {
    connection = Serve(sockets.served, recorder);
    for (const CallsRequest& request : upload) bytes += Message(request);
  }
  SECTION("the host's ring") {
    auto created = ipc::PayloadArea::Create(16u << 20, /*sealed=*/true);
    REQUIRE(created.ok());
    ring = std::move(*created);
    connection = Serve(sockets.served, recorder, "", ::dup(ring->fd()));
    for (const CallsRequest& request : upload) bytes += RingFrame(request, *ring);
    CHECK(bytes.size() < 4096);  // only the pieces' places went on the socket
  }
  std::thread host([&] { WriteAll(sockets.host, bytes); });
  REQUIRE(Pump(*connection, [&] { return recorder.requests.size() == 3; }));
  host.join();
  CHECK(recorder.bulk_views == 3);  // none was copied to be parsed
  std::string got = recorder.requests[0].events(0).start().arguments();
  CHECK(recorder.requests[0].events(0).start().arguments_size() == data.size());
  got += recorder.requests[1].events(0).argument_chunk().data();
  got += recorder.requests[2].events(0).argument_chunk().data();
  CHECK(got == data);
  if (ring != nullptr) {
    // The pieces were released: a 10 MiB piece fits only in a ring the
    // connection gave back (9 MiB were in the 16 MiB ring).
    CHECK(ring->Put(Bytes(10u << 20, 'r')).has_value());
  }
  CHECK(!recorder.end.has_value());
}

TEST_CASE("a large Send is written in pieces as the host reads, batched as "
          "the daemon batches") {
  std::vector<SandboxEventPtr> events;
  std::string expected;
  for (int i = 0; i < 9; ++i) {
    events.push_back(ResultChunk("big", Bytes(1u << 20, static_cast<char>(i))));
    expected += events.back()->result_chunk().data();
  }
  for (int i = 0; i < 100; ++i) events.push_back(Result(absl::StrCat("s", i), "v"));
  Recorder recorder;
  Sockets sockets;
  sockets.SmallBuffers();
  std::unique_ptr<FrameConnection> connection;
  std::unique_ptr<ipc::PayloadArea> ring;
  SECTION("socket bytes") { connection = Serve(sockets.served, recorder); }
  SECTION("through the host's ring") {
    auto created = ipc::PayloadArea::Create(4u << 20, /*sealed=*/true);
    REQUIRE(created.ok());
    ring = std::move(*created);
    connection = Serve(sockets.served, recorder, "", ::dup(ring->fd()));
  }
  auto backlog = connection->Send(events);
  REQUIRE(backlog.ok());
  CHECK(*backlog == FrameConnection::Backlog::kQueued);  // the socket is small
  CHECK(connection->UnwrittenBytes() > 0);
  CHECK((connection->PollEvents() & POLLOUT) != 0);
  // The host reads as it can. (The ring, smaller than the results, takes
  // what fits when Send puts them; the rest goes as socket bytes.)
  std::string read;
  std::vector<HostFrame> frames;
  REQUIRE(Pump(*connection, [&] {
    read += ReadAvailable(sockets.host);
    // Whole frames are taken out (and their ring pieces released) at once.
    while (true) {
      auto frame = ParseFrame(read);
      REQUIRE(frame.ok());
      if (frame->frame_bytes == 0) break;
      for (HostFrame& parsed :
           ParseFrames(absl::string_view(read).substr(0, frame->frame_bytes),
                       ring.get())) {
        frames.push_back(std::move(parsed));
      }
      read.erase(0, frame->frame_bytes);
    }
    return connection->UnwrittenBytes() == 0 && read.empty();
  }));
  const std::vector<SandboxEvent> got = EventsOf(frames);
  REQUIRE(got.size() == events.size());
  std::string data;
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i].SerializeAsString() == events[i]->SerializeAsString());
    if (got[i].has_result_chunk()) data += got[i].result_chunk().data();
  }
  CHECK(data == expected);
  // 100 small results are batched into the last message, not 100 frames.
  CHECK(frames.size() <= 10);
  if (ring != nullptr) {
    size_t ring_frames = 0;
    for (const HostFrame& frame : frames) ring_frames += frame.kind == FrameKind::kRingMessage;
    CHECK(ring_frames >= 1);
    CHECK(ring_frames < frames.size());
  }
}

TEST_CASE("malformed frames end the connection with STATUS 3 saying why") {
  struct Case {
    std::string name;
    std::function<std::string(ipc::PayloadArea*)> bytes;
    std::string says;
    bool ring = false;
  };
  char oversized[kFrameHeaderBytes];
  EncodeFrameHeader(FrameKind::kMessage, kMaxFrameMessageBytes + 1, oversized);
  const std::string oversized_header(oversized, sizeof(oversized));
  const std::vector<Case> cases = {
      {"a length over the frame wire's limit",
       [&](ipc::PayloadArea*) { return oversized_header; }, "at most"},
      {"an unknown kind",
       [](ipc::PayloadArea*) { return std::string("\0\0\0\0\x09", 5); },
       "unknown frame kind 9"},
      {"a payload over the connection's max_message_bytes",
       [](ipc::PayloadArea*) { return Message(Start("c", Bytes(5000, 'o'))); },
       "at most 4096 are allowed"},
      {"a second HELLO",
       [](ipc::PayloadArea*) {
         return EncodeFrame(FrameKind::kHello, EncodeHello({{"k", "v"}}));
       },
       "second HELLO"},
      {"a STATUS from the host",
       [](ipc::PayloadArea*) {
         return EncodeFrame(FrameKind::kStatus,
                            EncodeStatus(absl::StatusCode::kOk, ""));
       },
       "may not send frames of kind 4"},
      {"a non-empty HALF_CLOSE",
       [](ipc::PayloadArea*) { return std::string("\x01\0\0\0\x03x", 6); },
       "kind 3"},
      {"a frame after HALF_CLOSE",
       [](ipc::PayloadArea*) {
         return EncodeFrame(FrameKind::kHalfClose, "") + Message(Start("c"));
       },
       "after HALF_CLOSE"},
      {"a RING_MESSAGE without a ring",
       [](ipc::PayloadArea*) {
         return EncodeFrame(FrameKind::kRingMessage, EncodeRingHead({}));
       },
       "without a payload ring"},
      {"a ring piece out of the ring's bounds",
       [](ipc::PayloadArea*) {
         CallsRequest request = Chunk("c", "", 0);
         const std::string message = request.SerializeAsString();
         return EncodeFrame(FrameKind::kRingMessage,
                            EncodeRingHead({{static_cast<uint32_t>(message.size()),
                                             (1u << 20) - 10, 100}}) +
                                message);
       },
       "outside the", true},
      {"ring pieces overlapping",
       [](ipc::PayloadArea* ring) {
         CallsRequest request = Chunk("c", Bytes(100, 'a'), 0);
         const std::string frame = RingFrame(request, *ring);
         // The same piece twice, for two chunks.
         auto decoded = DecodeRingMessage(
             absl::string_view(frame).substr(kFrameHeaderBytes), kMaxFrameMessageBytes);
         REQUIRE(decoded.ok());
         const std::string one(decoded->bytes);
         std::vector<RingPieceRef> pieces = decoded->pieces;
         RingPieceRef again = pieces[0];
         again.at += static_cast<uint32_t>(one.size());
         pieces.push_back(again);
         return EncodeFrame(FrameKind::kRingMessage,
                            EncodeRingHead(pieces) + one + one);
       },
       "overlaps", true},
      {"a ring piece that is not a bulk field",
       [](ipc::PayloadArea* ring) {
         CallsRequest request;
         request.add_events()->mutable_ack()->set_call_id(std::string(100, 'z'));
         const std::string message = request.SerializeAsString();
         const std::optional<uint64_t> pos = ring->Put(Bytes(10, 'q'));
         REQUIRE(pos.has_value());
         return EncodeFrame(FrameKind::kRingMessage,
                            EncodeRingHead({{4, *pos, 10}}) + message);
       },
       "ring piece", true},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name) {
      Recorder recorder;
      Sockets sockets;
      std::unique_ptr<ipc::PayloadArea> ring;
      int ring_fd = -1;
      if (c.ring) {
        auto created = ipc::PayloadArea::Create(1u << 20, /*sealed=*/true);
        REQUIRE(created.ok());
        ring = std::move(*created);
        ring_fd = ::dup(ring->fd());
      }
      FrameConnectionOptions options;
      options.max_message_bytes = 4096;
      auto connection = Serve(sockets.served, recorder, "", ring_fd, options);
      // A good request first: it is handled, the bad frame ends the rest.
      WriteAll(sockets.host, Message(Start("good")) + c.bytes(ring.get()) +
                                 Message(Start("never")));
      REQUIRE(Pump(*connection, [&] { return recorder.end.has_value(); }));
      CHECK(recorder.end->code() == absl::StatusCode::kInvalidArgument);
      CHECK_THAT(std::string(recorder.end->message()),
                 Catch::Matchers::Contains(c.says));
      REQUIRE(recorder.requests.size() == 1);
      CHECK(recorder.requests[0].events(0).start().call_id() == "good");
      // The host reads the STATUS, then EOF.
      const FrameStatus status = LastStatus(ParseFrames(ReadToEof(sockets.host)));
      CHECK(status.code == 3);
      CHECK(status.details == recorder.end->message());
      CHECK(connection->Done());
      CHECK(connection->PollEvents() == 0);
      CHECK(absl::IsFailedPrecondition(connection->Send({Result("x", "v")}).status()));
    }
  }
}

TEST_CASE("a descriptor sent after HELLO is closed and refused") {
  Recorder recorder;
  Sockets sockets;
  auto connection = Serve(sockets.served, recorder);
  int pipe_fds[2];
  REQUIRE(::pipe2(pipe_fds, O_CLOEXEC) == 0);
  const std::string frame = Message(Start("c"));
  iovec iov{const_cast<char*>(frame.data()), frame.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &pipe_fds[1], sizeof(int));
  REQUIRE(::sendmsg(sockets.host, &msg, MSG_NOSIGNAL) ==
          static_cast<ssize_t>(frame.size()));
  ::close(pipe_fds[1]);
  REQUIRE(Pump(*connection, [&] { return recorder.end.has_value(); }));
  CHECK(recorder.end->code() == absl::StatusCode::kInvalidArgument);
  CHECK(recorder.requests.empty());
  CHECK(LastStatus(ParseFrames(ReadToEof(sockets.host))).code == 3);
  // The connection kept no copy: the pipe's write end is closed everywhere.
  char byte;
  CHECK(::read(pipe_fds[0], &byte, 1) == 0);
  ::close(pipe_fds[0]);
}

TEST_CASE("an unparseable MESSAGE gets a BadRequest error and the stream "
          "goes on") {
  Recorder recorder;
  Sockets sockets;
  auto connection = Serve(sockets.served, recorder);
  WriteAll(sockets.host, EncodeFrame(FrameKind::kMessage, "\xff\xff\xff") +
                             Message(Start("after")));
  REQUIRE(Pump(*connection, [&] { return recorder.requests.size() == 1; }));
  std::string read;
  REQUIRE(Pump(*connection, [&] {
    read += ReadAvailable(sockets.host);
    return !read.empty();
  }));
  const std::vector<SandboxEvent> events = EventsOf(ParseFrames(read));
  REQUIRE(events.size() == 1);
  CHECK(events[0].error().call_id().empty());
  CHECK(events[0].error().error().type() == "BadRequest");
  CHECK(events[0].error().error().code() ==
        static_cast<int>(absl::StatusCode::kInvalidArgument));
  CHECK(!recorder.end.has_value());
}

TEST_CASE("HALF_CLOSE reaches the consumer, which ends the stream with "
          "STATUS 0 after its results") {
  Recorder recorder;
  Sockets sockets;
  auto connection = Serve(sockets.served, recorder);
  recorder.on_request = [&](const CallsRequest& request) {
    CHECK(connection->Send({Result(request.events(0).start().call_id(), "r")})
              .ok());
  };
  recorder.on_half_close = [&] {
    connection->Finish(absl::StatusCode::kOk, "");
  };
  WriteAll(sockets.host, Message(Start("a")) + Message(Start("b")) +
                             EncodeFrame(FrameKind::kHalfClose, ""));
  REQUIRE(Pump(*connection, [&] { return recorder.end.has_value(); }));
  CHECK(recorder.half_closes == 1);
  CHECK(recorder.end->ok());
  const std::vector<HostFrame> frames = ParseFrames(ReadToEof(sockets.host));
  CHECK(LastStatus(frames).code == 0);
  const std::vector<SandboxEvent> events = EventsOf(frames);
  REQUIRE(events.size() == 2);
  CHECK(events[0].result().call_id() == "a");
  CHECK(events[1].result().call_id() == "b");
}

TEST_CASE("an EOF without STATUS ends the connection as UNAVAILABLE") {
  Recorder recorder;
  Sockets sockets;
  auto connection = Serve(sockets.served, recorder);
  WriteAll(sockets.host, Message(Start("a")));
  ::close(sockets.host);
  sockets.host = -1;
  REQUIRE(Pump(*connection, [&] { return recorder.end.has_value(); }));
  CHECK(recorder.requests.size() == 1);
  CHECK(absl::IsUnavailable(*recorder.end));
}

TEST_CASE("the calls-CPU answer is a HELLO frame holding the value") {
  Recorder recorder;
  Sockets sockets;
  auto connection = Serve(sockets.served, recorder);
  REQUIRE(connection->SendCallsCpuAnswer("off").ok());
  connection->Finish(absl::StatusCode::kUnavailable, "shutting down");
  REQUIRE(Pump(*connection, [&] { return recorder.end.has_value(); }));
  const std::vector<HostFrame> frames = ParseFrames(ReadToEof(sockets.host));
  REQUIRE(frames.size() == 2);
  REQUIRE(frames[0].kind == FrameKind::kHello);
  auto hello = DecodeHello(frames[0].payload);
  REQUIRE(hello.ok());
  const std::string* value = FindMetadata(*hello, kFrameCallsCpuKey);
  REQUIRE(value != nullptr);
  CHECK(*value == "off");
  CHECK(LastStatus(frames).code == 14);
  CHECK(LastStatus(frames).details == "shutting down");
}

TEST_CASE("a ring that is not sealed is refused with STATUS 3") {
  Recorder recorder;
  Sockets sockets;
  auto unsealed = ipc::PayloadArea::Create(1u << 20, /*sealed=*/false);
  REQUIRE(unsealed.ok());
  auto connection = FrameConnection::Create(sockets.served, "",
                                            ::dup((*unsealed)->fd()), &recorder, {});
  REQUIRE(absl::IsInvalidArgument(connection.status()));
  const std::vector<HostFrame> frames = ParseFrames(ReadToEof(sockets.host));
  CHECK(LastStatus(frames).code == 3);
  CHECK_THAT(LastStatus(frames).details,
             Catch::Matchers::Contains("F_SEAL_SHRINK"));
}

TEST_CASE("a host that stops reading: bytes queue, back-pressure, reads "
          "pause, then STATUS 8 after the stalled bound") {
  Recorder recorder;
  Sockets sockets;
  sockets.SmallBuffers();
  FrameConnectionOptions options;
  options.max_unwritten_bytes = 256u << 10;
  options.pause_reads_above_bytes = 512u << 10;
  options.stalled_host_timeout = absl::Milliseconds(200);
  auto connection = Serve(sockets.served, recorder, "", -1, options);
  std::vector<FrameConnection::Backlog> backlogs;
  for (int i = 0; i < 4; ++i) {
    auto backlog = connection->Send({ResultChunk("c", Bytes(200u << 10, 'a'))});
    REQUIRE(backlog.ok());
    backlogs.push_back(*backlog);
  }
  CHECK(backlogs[0] != FrameConnection::Backlog::kOverBound);
  CHECK(backlogs.back() == FrameConnection::Backlog::kOverBound);
  CHECK(connection->UnwrittenBytes() > options.max_unwritten_bytes);
  // Over the read pause: the host's frames wait in the socket.
  CHECK((connection->PollEvents() & POLLIN) == 0);
  WriteAll(sockets.host, Message(Start("waits")));

  SECTION("the writer waits for room; the host never reads") {
    std::optional<absl::Status> waited;
    std::thread writer([&] { waited = connection->AwaitRoom(); });
    writer.join();
    REQUIRE(waited.has_value());
    CHECK(absl::IsResourceExhausted(*waited));
    CHECK_THAT(std::string(waited->message()),
               Catch::Matchers::Contains("did not read its results"));
  }
  SECTION("the poll loop alone finds the stall") {
    CHECK(connection->NextDeadline() < absl::Now() + absl::Seconds(1));
    Pump(*connection, [] { return false; }, absl::Milliseconds(500));
    CHECK(!recorder.end.has_value());  // the STATUS waits in the queue
  }

  // The host reads now, within the STATUS's grace: the frame cut short is
  // completed, the rest dropped, and the STATUS follows.
  std::string read;
  std::thread host([&] { read = ReadToEof(sockets.host); });
  REQUIRE(Pump(*connection, [&] { return recorder.end.has_value(); }));
  host.join();
  CHECK(absl::IsResourceExhausted(*recorder.end));
  const std::vector<HostFrame> frames = ParseFrames(read);
  CHECK(LastStatus(frames).code == 8);
  CHECK(EventsOf(frames).size() < 4);
  CHECK(recorder.requests.empty());  // reads stayed paused
  CHECK(absl::IsFailedPrecondition(connection->Send({Result("x", "v")}).status()));
}

TEST_CASE("back-pressure ends once the host reads; paused reads go on") {
  Recorder recorder;
  Sockets sockets;
  sockets.SmallBuffers();
  FrameConnectionOptions options;
  options.max_unwritten_bytes = 256u << 10;
  options.pause_reads_above_bytes = 512u << 10;
  options.stalled_host_timeout = absl::Seconds(30);
  auto connection = Serve(sockets.served, recorder, "", -1, options);
  for (int i = 0; i < 4; ++i) {
    REQUIRE(connection->Send({ResultChunk("c", Bytes(200u << 10, 'a'))}).ok());
  }
  CHECK((connection->PollEvents() & POLLIN) == 0);
  WriteAll(sockets.host, Message(Start("waited")));
  std::atomic<bool> stop{false};
  std::string read;
  std::thread host([&] {
    absl::SleepFor(absl::Milliseconds(100));
    while (!stop.load()) {
      read += ReadAvailable(sockets.host);
      absl::SleepFor(absl::Milliseconds(1));
    }
  });
  std::optional<absl::Status> waited;
  std::thread writer([&] { waited = connection->AwaitRoom(); });
  REQUIRE(Pump(*connection, [&] { return recorder.requests.size() == 1; }));
  writer.join();
  CHECK(waited.has_value());
  CHECK((waited.has_value() && waited->ok()));
  REQUIRE(Pump(*connection, [&] { return connection->UnwrittenBytes() == 0; }));
  absl::SleepFor(absl::Milliseconds(20));
  stop = true;
  host.join();
  read += ReadAvailable(sockets.host);
  CHECK(EventsOf(ParseFrames(read)).size() == 4);
  CHECK(!recorder.end.has_value());
}

TEST_CASE("a writer thread and the poll thread at once") {
  Recorder recorder;
  Sockets sockets;
  sockets.SmallBuffers();
  auto connection = Serve(sockets.served, recorder);
  constexpr int kCalls = 2000;
  std::string requests;
  for (int i = 0; i < kCalls; ++i) requests += Message(Start(absl::StrCat("c", i)));
  std::thread host_writer([&] { WriteAll(sockets.host, requests); });
  std::string read;
  std::thread host_reader([&] { read = ReadToEof(sockets.host); });
  std::thread writer([&] {
    for (int i = 0; i < kCalls; ++i) {
      auto backlog = connection->Send({Result(absl::StrCat("r", i), Bytes(300, 'v'))});
      REQUIRE(backlog.ok());
      if (*backlog == FrameConnection::Backlog::kOverBound) {
        REQUIRE(connection->AwaitRoom().ok());
      }
    }
    connection->Finish(absl::StatusCode::kOk, "");
  });
  REQUIRE(Pump(*connection, [&] { return recorder.end.has_value(); }));
  writer.join();
  host_writer.join();
  host_reader.join();
  CHECK(recorder.end->ok());
  const std::vector<HostFrame> frames = ParseFrames(read);
  CHECK(LastStatus(frames).code == 0);
  const std::vector<SandboxEvent> events = EventsOf(frames);
  REQUIRE(events.size() == kCalls);
  for (int i = 0; i < kCalls; ++i) {
    CHECK(events[static_cast<size_t>(i)].result().call_id() == absl::StrCat("r", i));
  }
  // The requests read before the STATUS were all handed over in order.
  for (size_t i = 0; i < recorder.requests.size(); ++i) {
    CHECK(recorder.requests[i].events(0).start().call_id() == absl::StrCat("c", i));
  }
}

}  // namespace
}  // namespace agentix::sandbox
