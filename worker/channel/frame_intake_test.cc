// read_frames: decoding, dead channels, chunked and ring-borne arguments.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agentix/runtime/v1/runtime.pb.h"
#include "absl/time/time.h"
#include "testing/resident_pages.h"
#include "testing/status_matchers.h"
#include "worker/channel/channel_state.h"
#include "worker/channel/channel_test_util.h"
#include "base/unique_fd.h"
#include "wire/frame_codec.h"
#include "worker/ipc/descriptors.h"
#include "worker/ipc/frame.h"
#include "worker/ipc/io.h"
#include "worker/ipc/payload_area.h"

namespace agentix::worker {
namespace {

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
  // Each is a named record of its kind: the same items by name.
  REQUIRE(PyEval("[type(f).__name__ for f in frames]") ==
          "['CallFrame', 'ArgsFrame', 'CancelFrame', 'StreamAckFrame', "
          "'ShutdownFrame']");
  REQUIRE(PyEval("(frames[0].kind, frames[0].call_id, frames[0].callable, "
                 "frames[0].encoding, frames[0].data, frames[0].total_size, "
                 "frames[0].context, frames[0].stream_window)") ==
          "(1, 'c1', 'math::factorial', 1, None, 7, b'ctx', 16)");
  REQUIRE(PyEval("(frames[1].call_id, frames[1].data, frames[1].received)") ==
          "('c1', b'\\x80\\x05\\x00rest', 7)");
  REQUIRE(PyEval("frames[2].call_id") == "c1");
  REQUIRE(PyEval("(frames[3].call_id, frames[3].index)") ==
          "('c1', 5000000000)");
  REQUIRE(PyEval("frames[4].kind == w.SHUTDOWN") == "True");
  ipc::Frame event;
  event.type = ipc::FrameType::kNamespaceEvent;
  event.ns.name = "/plugin";
  event.ns.event = "ask";
  event.ns.request_id = "r1";
  event.ns.has_error = true;
  event.ns.error_type = "KeyError";
  event.ns.error_message = "k";
  event.ns.status_code = 404;
  event.data = "\x81";
  pair.Send(event);
  ipc::Frame env;
  env.type = ipc::FrameType::kSetEnv;
  env.data = std::string("A=1\0B=2\0", 8);
  pair.Send(env);
  Py("frames = ch.read_frames()\n");
  REQUIRE(PyEval("[type(f).__name__ for f in frames]") ==
          "['NamespaceEventFrame', 'SetEnvFrame']");
  REQUIRE(PyEval("tuple(frames[0]) == (w.NS_EVENT, '/plugin', 'ask', "
                 "b'\\x81', 'r1', 'KeyError', 'k', 404)") == "True");
  REQUIRE(PyEval("(frames[0].namespace, frames[0].event, frames[0].data, "
                 "frames[0].request_id, frames[0].error_type, "
                 "frames[0].error_message, frames[0].status_code)") ==
          "('/plugin', 'ask', b'\\x81', 'r1', 'KeyError', 'k', 404)");
  REQUIRE(PyEval("(frames[1].kind, frames[1].entries)") ==
          "(8, b'A=1\\x00B=2\\x00')");

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

// Channels made while it lives serve direct connections (the worker's
// --direct_calls).
struct ServeDirectCalls {
  ServeDirectCalls() { SetServeDirectCalls(true); }
  ~ServeDirectCalls() { SetServeDirectCalls(false); }
};

// Hands the worker one end of a fresh socket pair with `conn` (a
// direct_conn frame), as the daemon's hand-over does; returns the host's
// end. The worker then holds the only other copy.
base::UniqueFd HandOverSocket(Pair& pair, const ipc::Frame& conn) {
  int host[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, host) == 0);
  base::UniqueFd host_end(host[0]);
  base::UniqueFd handed(host[1]);
  std::string bytes;
  REQUIRE_OK(ipc::AppendFrame(conn, bytes));
  const int fds[] = {handed.get()};
  REQUIRE_OK(ipc::SendWithDescriptors(pair.peer, bytes, fds));
  return host_end;
}

// A direct_conn is served (docs/DIRECT-CALLS.md, stage 3): the host's
// StartCall comes out of read_frames() as the same CALL record a relayed
// call frame gives; HALF_CLOSE with no call open ends the connection with
// STATUS 0 and EOF, and the daemon gets direct_closed. Descriptors that do
// not match their frame kill the channel.
TEST_CASE("A direct_conn is served beside the link; stray descriptors are a "
          "ProtocolError", "[channel][direct]") {
  ServeDirectCalls serve_direct;
  Pair pair;
  ipc::Frame conn;
  conn.type = ipc::FrameType::kDirectConn;
  conn.direct_conn.conn = 42;
  conn.direct_conn.client = "client-a";
  base::UniqueFd host_end = HandOverSocket(pair, conn);
  REQUIRE(PyEval("ch.read_frames()") == "[]");
  // A StartCall on the direct socket: polled through fileno().
  runtime::v1::CallsRequest request;
  auto* start = request.add_events()->mutable_start();
  start->set_call_id("d-1");
  start->set_callable("m::f");
  start->set_encoding(runtime::v1::ENCODING_MSGPACK);
  start->set_arguments(std::string("\x92\x90\x80", 3));
  const std::string message = sandbox::EncodeFrame(
      sandbox::FrameKind::kMessage, request.SerializeAsString());
  REQUIRE(::write(host_end.get(), message.data(), message.size()) ==
          static_cast<ssize_t>(message.size()));
  Py("import select\n"
     "got = []\n"
     "while not got:\n"
     "    select.select([ch.fileno()], [], [], 10)\n"
     "    got += ch.read_frames()\n");
  CHECK(PyEval("[(f.kind == w.CALL, f.call_id, f.callable, f.encoding, "
               "f.data, f.total_size) for f in got]") ==
        "[(True, 'd-1', 'm::f', 2, b'\\x92\\x90\\x80', 3)]");
  // The driver's reply goes to the host, not the link.
  Py("ch.send_result('d-1', 2, b'\\xc0')\n");
  // HALF_CLOSE: the call is terminal, so STATUS 0 follows its result.
  const std::string half = sandbox::EncodeFrame(sandbox::FrameKind::kHalfClose, "");
  REQUIRE(::write(host_end.get(), half.data(), half.size()) ==
          static_cast<ssize_t>(half.size()));
  std::string got;
  char buffer[256];
  for (;;) {
    Py("select.select([ch.fileno()], [], [], 0.05)\n"
       "ch.read_frames()\n");
    pollfd pfd{host_end.get(), POLLIN, 0};
    if (::poll(&pfd, 1, 50) == 0) continue;
    const ssize_t n = ::read(host_end.get(), buffer, sizeof buffer);
    REQUIRE(n >= 0);
    if (n == 0) break;
    got.append(buffer, static_cast<size_t>(n));
  }
  auto frame = sandbox::ParseFrame(got);
  REQUIRE(frame.ok());
  REQUIRE(frame->kind == sandbox::FrameKind::kMessage);
  runtime::v1::CallsResponse response;
  REQUIRE(response.ParseFromString(std::string(frame->payload)));
  REQUIRE(response.events_size() == 1);
  CHECK(response.events(0).result().call_id() == "d-1");
  CHECK(response.events(0).result().value() == "\xc0");
  const std::string rest = got.substr(frame->frame_bytes);  // outlives the view
  auto status_frame = sandbox::ParseFrame(rest);
  REQUIRE(status_frame.ok());
  REQUIRE(status_frame->kind == sandbox::FrameKind::kStatus);
  auto status = sandbox::DecodeStatus(status_frame->payload);
  REQUIRE(status.ok());
  CHECK(status->code == 0);
  Py("ch.read_frames()\n");
  // The daemon: direct_closed for that connection.
  FrameCollector collector(pair.peer);
  auto frames = collector.Wait(1, absl::Seconds(5));
  REQUIRE(frames.size() == 1);
  CHECK(frames[0].type == ipc::FrameType::kDirectClosed);
  CHECK(frames[0].direct_conn.conn == 42);

  SECTION("a direct_conn without its descriptor") {
    pair.Send(conn);
    CHECK(Raised("ch.read_frames()", "w.ProtocolError") ==
          "a 'direct_conn' frame came without its descriptors");
  }
  SECTION("a descriptor with a frame that carries none") {
    ipc::Frame cancel;
    cancel.type = ipc::FrameType::kCancel;
    cancel.call_id = "c";
    std::string cancel_bytes;
    REQUIRE_OK(ipc::AppendFrame(cancel, cancel_bytes));
    const int stray[] = {host_end.get()};
    REQUIRE_OK(ipc::SendWithDescriptors(pair.peer, cancel_bytes, stray));
    CHECK(Raised("ch.read_frames()", "w.ProtocolError") ==
          "descriptors arrived with frames that carry none");
  }
}

// A direct call's large result (docs/DECISIONS.md "stop-40: a direct result
// is cut once"): cut by the channel into whole 1 MiB ResultChunks and the
// result with the rest, each chunk's buffer taken from the worker's
// ChunkBuffers; once the host acks the call they come back, and the next
// result reuses them.
TEST_CASE("A direct result is cut into chunks from recycled buffers",
          "[channel][direct]") {
  ServeDirectCalls serve_direct;
  Pair pair;
  ipc::Frame conn;
  conn.type = ipc::FrameType::kDirectConn;
  conn.direct_conn.conn = 7;
  conn.direct_conn.client = "client-r";
  conn.direct_conn.max_payload = uint64_t{64} << 20;
  conn.direct_conn.max_retained = 16;
  conn.direct_conn.max_retained_bytes = uint64_t{64} << 20;
  conn.direct_conn.stalled_ms = 20000;
  base::UniqueFd host_end = HandOverSocket(pair, conn);
  REQUIRE(PyEval("ch.read_frames()") == "[]");
  PyObject* main = PyImport_AddModule("__main__");
  ChunkBuffers& buffers =
      Channel(PyDict_GetItemString(PyModule_GetDict(main), "ch"))
          .direct->chunk_buffers();

  auto send = [&](const runtime::v1::CallsRequest& request) {
    const std::string message = sandbox::EncodeFrame(
        sandbox::FrameKind::kMessage, request.SerializeAsString());
    REQUIRE_OK(ipc::WriteAll(host_end.get(), message));
  };
  std::string unread;
  // The host's events up to and including the next result, the channel
  // driven meanwhile (it writes what the socket did not take at once).
  auto events_to_result = [&] {
    std::vector<runtime::v1::SandboxEvent> events;
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (events.empty() || !events.back().has_result()) {
      REQUIRE(absl::Now() < deadline);
      Py("select.select([ch.fileno()], [], [], 0.01)\n"
         "ch.read_frames()\n");
      char buffer[1 << 16];
      const ssize_t n =
          ::recv(host_end.get(), buffer, sizeof buffer, MSG_DONTWAIT);
      if (n > 0) unread.append(buffer, static_cast<size_t>(n));
      for (;;) {
        auto frame = sandbox::ParseFrame(unread);
        REQUIRE(frame.ok());
        if (frame->frame_bytes == 0) break;
        REQUIRE(frame->kind == sandbox::FrameKind::kMessage);
        runtime::v1::CallsResponse response;
        REQUIRE(response.ParseFromString(std::string(frame->payload)));
        for (const auto& event : response.events()) events.push_back(event);
        unread.erase(0, frame->frame_bytes);
      }
    }
    return events;
  };
  // Starts `id`, answers it with a result of two parts (3 MiB + 5 bytes:
  // three whole chunks, the rest in the result) and checks what the host
  // got.
  auto call = [&](const std::string& id) {
    runtime::v1::CallsRequest request;
    auto* start = request.add_events()->mutable_start();
    start->set_call_id(id);
    start->set_callable("m::f");
    start->set_encoding(runtime::v1::ENCODING_MSGPACK);
    start->set_arguments(std::string("\x92\x90\x80", 3));
    send(request);
    Py("import select\n"
       "got = []\n"
       "while not got:\n"
       "    select.select([ch.fileno()], [], [], 10)\n"
       "    got += ch.read_frames()\n");
    REQUIRE(PyEval("[(f.kind == w.CALL, f.call_id) for f in got]") ==
            absl::StrCat("[(True, '", id, "')]"));
    Py(absl::StrCat("ch.send_result('", id,
                    "', 2, [b'a' * (2 << 20), b'b' * ((1 << 20) + 5)])\n"
                    "ch.flush()\n"));
    std::vector<runtime::v1::SandboxEvent> events = events_to_result();
    REQUIRE(events.size() == 4);
    const std::string mib(ipc::kChunkBytes, 'a');
    CHECK(events[0].result_chunk().call_id() == id);
    CHECK(events[0].result_chunk().data() == mib);
    CHECK(events[1].result_chunk().data() == mib);
    CHECK(events[2].result_chunk().data() ==
          std::string(ipc::kChunkBytes, 'b'));
    CHECK(events[3].result().call_id() == id);
    CHECK(events[3].result().value() == "bbbbb");
    CHECK(events[3].result().value_size() == 3 * ipc::kChunkBytes + 5);
  };
  auto ack = [&](const std::string& id) {
    runtime::v1::CallsRequest request;
    request.add_events()->mutable_ack()->set_call_id(id);
    send(request);
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (buffers.kept() < 3) {
      REQUIRE(absl::Now() < deadline);
      Py("select.select([ch.fileno()], [], [], 0.01)\n"
         "ch.read_frames()\n");
    }
  };

  call("r-1");
  CHECK(buffers.fresh() == 3);
  CHECK(buffers.reused() == 0);
  CHECK(buffers.kept() == 0);  // retained until the host acks
  ack("r-1");
  CHECK(buffers.kept() == 3);
  call("r-2");
  CHECK(buffers.fresh() == 3);
  CHECK(buffers.reused() == 3);
  ack("r-2");

  // A large argument's pieces are copied from the host's bytes straight
  // into the call's bytes (LandDirectArgument): no chunk buffer is taken.
  runtime::v1::CallsRequest request;
  auto* start = request.add_events()->mutable_start();
  start->set_call_id("a-1");
  start->set_callable("m::f");
  start->set_encoding(runtime::v1::ENCODING_MSGPACK);
  start->set_arguments(std::string(3 * ipc::kChunkBytes, 'x'));
  // More than the socket holds: written while the channel reads.
  const std::string message = sandbox::EncodeFrame(
      sandbox::FrameKind::kMessage, request.SerializeAsString());
  absl::Status written;
  std::thread writer(
      [&] { written = ipc::WriteAll(host_end.get(), message); });
  Py("got = []\n"
     "for _ in range(1000):\n"
     "    if any(f[0] == w.ARGS for f in got): break\n"
     "    select.select([ch.fileno()], [], [], 0.01)\n"
     "    got += ch.read_frames()\n");
  writer.join();
  REQUIRE_OK(written);
  CHECK(PyEval("[f[0] == w.ARGS and f[1] == 'a-1' and "
               "f[2] == b'x' * (3 << 20) for f in got][-1]") == "True");
  CHECK(buffers.fresh() == 3);
  CHECK(buffers.reused() == 3);
  CHECK(buffers.kept() == 3);
}

TEST_CASE("Oversized frame lengths are refused before reading the body",
          "[channel]") {
  Pair pair;
  pair.SendRaw(std::string("\xff\xff\xff\x7f", 4));
  REQUIRE(Raised("ch.read_frames()", "w.ProtocolError").find("exceeds") !=
          std::string::npos);
}

// Reads frames into the Python list `got` until the assembled arguments
// (an ArgsFrame) are among them.
void ReadUntilArgs() {
  Py("import select\n"
     "got = []\n"
     "while not any(f[0] == w.ARGS for f in got):\n"
     "    select.select([ch.fileno()], [], [], 10)\n"
     "    got += ch.read_frames()\n");
}

// `got` holds the call frame without data, then the arguments: `total`
// bytes, byte i being i % `modulus`. Drops `got`.
void CheckAssembled(size_t total, int modulus) {
  REQUIRE(PyEval("got[0][4] is None") == "True");
  REQUIRE(PyEval("got[1][3]") == std::to_string(total));
  REQUIRE(PyEval(absl::StrCat("got[1][2] == bytes(i % ", modulus,
                              " for i in range(", total, "))")) == "True");
  Py("del got\n");
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
  ReadUntilArgs();
  sender.join();
  REQUIRE(PyEval("len(got)") == "2");
  REQUIRE(PyEval("got[0][:4] + got[0][5:]") ==
          absl::StrCat("(1, 'big', 'm::f', 1, ", total, ", b'', 0)"));
  REQUIRE(PyEval("got[1][:2] == (w.ARGS, 'big')") == "True");
  REQUIRE(PyEval("type(got[1][2]).__name__") == "bytes");
  CheckAssembled(total, 253);
}

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
  ReadUntilArgs();
  sender.join();
  // At least the first pieces, and some after the pause (space released).
  CHECK(in_ring >= 3);
  CheckAssembled(total, 241);
}

// The pickled (args, kwargs) `expr` as the host makes it (pickle.dump
// into a file, protocol 5), in the C++ string `out`; `value` names it.
std::string HostPickle(const std::string& expr) {
  Py(absl::StrCat("import io, pickle\n"
                  "value = ", expr, "\n"
                  "_f = io.BytesIO()\n"
                  "pickle.dump(value, _f, protocol=5)\n"
                  "stream = _f.getvalue()\n"));
  const std::string hex = PyEval("stream.hex()");
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

TEST_CASE("Large pickled argument values are assembled in their own objects",
          "[channel][args][ring]") {
  constexpr size_t kChunk = ipc::kChunkBytes;
  RingPair pair(4 * kChunk);
  // 2.5 MiB of bytes, a small value, a 1.5 MiB bytearray, a 64 KiB value
  // (the threshold) and one just below it: everything but the last leaves
  // the stream.
  const std::string args = HostPickle(
      "((bytes(range(256)) * 10240, b'small', bytearray(b'x' * 1572864), "
      "b'y' * 65536), {'below': b'z' * 65535})");
  std::thread sender([&] {
    pair.Send(pair.Place(CallFrame("big", "", args.size()),
                         args.substr(0, kChunk)));
    for (size_t off = kChunk; off < args.size(); off += kChunk) {
      pair.Send(pair.Place(ChunkFrame("big", ""), args.substr(off, kChunk)));
    }
  });
  ReadUntilArgs();
  sender.join();
  REQUIRE(PyEval("got[1][3]") == std::to_string(args.size()));
  Py("data = got[1][2]\n");
  REQUIRE(PyEval("[type(x).__name__ for x in data]") ==
          "['bytes', 'bytes', 'bytearray', 'bytes']");
  REQUIRE(PyEval("len(data[0]) < 65535 + 200") == "True");
  REQUIRE(PyEval("pickle.loads(data[0], buffers=data[1:]) == value") == "True");
  // The very objects made here, not copies.
  REQUIRE(PyEval("pickle.loads(data[0], buffers=data[1:])[0][0] is data[1]") ==
          "True");
  Py("del got, data, value, stream\n");
}

TEST_CASE("Msgpack and unsplittable arguments arrive as one bytes object",
          "[channel][args]") {
  Pair pair;
  const std::string pickled = HostPickle("((b'q' * 70000,), {})");
  ipc::Frame msgpack = CallFrame("m", pickled.substr(0, 100), pickled.size());
  msgpack.encoding = 2;
  pair.Send(msgpack);
  pair.Send(ChunkFrame("m", pickled.substr(100)));
  ReadUntilArgs();
  REQUIRE(PyEval("got[1][2] == stream") == "True");
  // A value longer than the rest of the stream stays in it (the loader
  // then reports the truncated stream as it would have).
  const std::string cut = pickled.substr(0, pickled.size() - 100);
  pair.Send(CallFrame("p", cut.substr(0, 100), cut.size()));
  pair.Send(ChunkFrame("p", cut.substr(100)));
  ReadUntilArgs();
  REQUIRE(PyEval("got[1][2] == stream[:-100]") == "True");
  Py("del got, value, stream\n");
}

TEST_CASE("A large argument value's pages are filled when it begins, not "
          "chunk by chunk as its bytes arrive",
          "[channel][args]") {
  // Fresh memory faulted in a page at a time as the chunks are copied cost
  // the first 64 MiB echo ~0.3 s of the worker's CPU on these VMs; filled
  // at once (base::PrefaultForWrite) it is a fraction of that.
  constexpr size_t kValue = size_t{12} << 20;
  constexpr size_t kHugePage = size_t{2} << 20;
  Pair pair;
  Py(absl::StrCat("import pickle\n"
                  "stream = pickle.dumps(((b'v' * ", kValue, ",), {}), protocol=5)\n"
                  "head = stream[:", ipc::kChunkBytes, "].hex()\n"));
  const std::string hex = PyEval("head");
  std::string head(hex.size() / 2, '\0');
  for (size_t i = 0; i < head.size(); ++i) {
    head[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  }
  const uint64_t total = std::stoull(PyEval("len(stream)"));
  Py("del head, stream\n");
  std::thread sender([&] { pair.Send(CallFrame("v", head, total)); });
  Py("import select\n"
     "got = []\n"
     "while not got:\n"
     "    select.select([ch.fileno()], [], [], 10)\n"
     "    got += ch.read_frames()\n");
  sender.join();
  REQUIRE(PyEval("repr([tuple(f) for f in got])") ==
          absl::StrCat("[(1, 'v', 'm::f', 1, None, ", total, ", b'', 0)]"));
  Py("del got\n");
  // Only the first chunk (1 MiB of the value) has come; the value's whole
  // 2 MiB pages (at least 10 MiB of its 12) are in memory already.
  PyObject* channel = testing::EvalPython("ch");
  REQUIRE(channel != nullptr);
  const Upload& upload = Channel(channel).uploads.at("v");
  Py_DECREF(channel);  // `ch` in __main__ keeps it
  REQUIRE(upload.values != nullptr);
  PyObject* value = PyList_GET_ITEM(upload.values, PyList_GET_SIZE(upload.values) - 1);
  REQUIRE(static_cast<size_t>(PyBytes_GET_SIZE(value)) == kValue);
  const auto at = reinterpret_cast<uintptr_t>(PyBytes_AS_STRING(value));
  const uintptr_t first = (at + kHugePage - 1) & ~uintptr_t{kHugePage - 1};
  const uintptr_t last = (at + kValue) & ~uintptr_t{kHugePage - 1};
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  CHECK(agentix::testing::ResidentPages(reinterpret_cast<const void*>(first), last - first) ==
        (last - first) / page);
  ipc::Frame cancel;
  cancel.type = ipc::FrameType::kCancel;
  cancel.call_id = "v";
  pair.Send(cancel);
  REQUIRE(ReadAll() == "[[(3, 'v')], [], [], []]");
}

TEST_CASE("A cancel in the middle of a large value releases it",
          "[channel][args]") {
  Pair pair;
  const std::string pickled = HostPickle("((b'q' * 200000,), {})");
  pair.Send(CallFrame("c", pickled.substr(0, 100000), pickled.size()));
  ipc::Frame cancel;
  cancel.type = ipc::FrameType::kCancel;
  cancel.call_id = "c";
  pair.Send(cancel);
  pair.Send(ChunkFrame("c", pickled.substr(100000)));  // dropped
  REQUIRE(ReadAll() ==
          absl::StrCat("[[(1, 'c', 'm::f', 1, None, ", pickled.size(),
                       ", b'', 0), (3, 'c')], [], [], []]"));
  Py("del value, stream\n");
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

}  // namespace
}  // namespace agentix::worker
