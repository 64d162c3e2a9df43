#include "worker/ipc/frame.h"

#include <catch2/catch.hpp>
#include <msgpack.hpp>

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>
#include <vector>

#include "testing/status_matchers.h"
#include "worker/ipc/io.h"

namespace agentix::ipc {
namespace {

std::string Encode(const Frame& f) {
  std::string out;
  REQUIRE_OK(AppendFrame(f, out));
  return out;
}

Frame Decode(const std::string& wire) {
  FrameReader reader;
  reader.Append(wire.data(), wire.size());
  auto next = reader.Next();
  REQUIRE(next.ok());
  REQUIRE(next->has_value());
  return std::move(**next);
}

TEST_CASE("Every frame type round-trips", "[ipc]") {
  Frame call;
  call.type = FrameType::kCall;
  call.call_id = "abc";
  call.callable = "pkg.mod::fn";
  call.encoding = 1;
  call.data = std::string("\x00\x01binary", 8);
  call.total_size = 8;
  call.context = "ctx";
  call.stream_window = 16;
  Frame got = Decode(Encode(call));
  REQUIRE(got.stream_window == 16);
  REQUIRE(got.type == FrameType::kCall);
  REQUIRE(got.call_id == "abc");
  REQUIRE(got.callable == "pkg.mod::fn");
  REQUIRE(got.encoding == 1);
  REQUIRE(got.data == call.data);
  REQUIRE(got.total_size == 8);
  REQUIRE(got.context == "ctx");

  Frame err;
  err.type = FrameType::kError;
  err.call_id = "x";
  err.error.code = 1;
  err.error.type = "Cancelled";
  err.error.message = "remote call cancelled";
  err.error.traceback = "tb";
  err.error.cancelled = true;
  err.error.returncode = -9;
  got = Decode(Encode(err));
  REQUIRE(got.type == FrameType::kError);
  REQUIRE(got.error.type == "Cancelled");
  REQUIRE(got.error.message == "remote call cancelled");
  REQUIRE(got.error.traceback == "tb");
  REQUIRE(got.error.cancelled);
  REQUIRE(got.error.returncode == -9);
  REQUIRE(got.error.code == 1);
  REQUIRE(got.error.type_module.empty());
  REQUIRE(got.error.state.empty());

  // A Python exception's class and pickled state (binary, NULs included).
  err.error.cancelled = false;
  err.error.returncode.reset();
  err.error.type = "AppError";
  err.error.type_module = "app.errors";
  err.error.type_qualname = "Outer.AppError";
  err.error.state = std::string("\x80\x04\x00state", 8);
  got = Decode(Encode(err));
  REQUIRE(got.error.type_module == "app.errors");
  REQUIRE(got.error.type_qualname == "Outer.AppError");
  REQUIRE(got.error.state == err.error.state);
  REQUIRE_FALSE(got.error.returncode.has_value());

  Frame item;
  item.type = FrameType::kStreamItem;
  item.call_id = "s";
  item.index = 7;
  item.encoding = 1;
  item.data = "v";
  got = Decode(Encode(item));
  REQUIRE(got.type == FrameType::kStreamItem);
  REQUIRE(got.index == 7);
  REQUIRE(got.data == "v");
  REQUIRE(got.encoding == 1);

  for (FrameType t : {FrameType::kArgChunk, FrameType::kCancel,
                      FrameType::kShutdown, FrameType::kReady,
                      FrameType::kBootError, FrameType::kResultChunk,
                      FrameType::kResult, FrameType::kStreamAck}) {
    Frame f;
    f.type = t;
    f.call_id = "id";
    f.data = "d";
    f.pid = 42;
    REQUIRE(Decode(Encode(f)).type == t);
  }
}

TEST_CASE("set_env and env_set round-trip (an env block with NULs)",
          "[ipc]") {
  Frame set;
  set.type = FrameType::kSetEnv;
  set.data = std::string("A=1\0B=x=y\0", 10);
  Frame got = Decode(Encode(set));
  REQUIRE(got.type == FrameType::kSetEnv);
  REQUIRE(got.data == set.data);
  REQUIRE(FrameTypeName(FrameType::kSetEnv) == "set_env");

  Frame ack;
  ack.type = FrameType::kEnvSet;
  got = Decode(Encode(ack));
  REQUIRE(got.type == FrameType::kEnvSet);
  REQUIRE(got.detail.empty());
  ack.detail = "OSError: putenv failed";
  got = Decode(Encode(ack));
  REQUIRE(got.detail == "OSError: putenv failed");
  REQUIRE(FrameTypeName(FrameType::kEnvSet) == "env_set");
}

TEST_CASE("collapse and session_state round-trip", "[ipc]") {
  Frame collapse;
  collapse.type = FrameType::kCollapse;
  collapse.direct_conn.client = "client-7";
  Frame got = Decode(Encode(collapse));
  REQUIRE(got.type == FrameType::kCollapse);
  CHECK(got.direct_conn.client == "client-7");
  CHECK(FrameTypeName(FrameType::kCollapse) == "collapse");

  Frame state;
  state.type = FrameType::kSessionState;
  state.direct_conn.client = "client-7";
  state.record = std::string("\x01\x00\x01\x00a\x00\x00\x00\x00", 9);
  for (bool last : {false, true}) {
    state.last = last;
    got = Decode(Encode(state));
    REQUIRE(got.type == FrameType::kSessionState);
    CHECK(got.direct_conn.client == "client-7");
    CHECK(got.record == state.record);
    CHECK(got.last == last);
  }
  CHECK(FrameTypeName(FrameType::kSessionState) == "session_state");

  // direct_conn carries the client's ledger slot.
  Frame conn;
  conn.type = FrameType::kDirectConn;
  conn.direct_conn.client = "client-7";
  conn.direct_conn.client_slot = 41;
  got = Decode(Encode(conn));
  CHECK(got.direct_conn.client_slot == 41);
  CHECK(got.direct_conn.ns_name.empty());

  // A Namespace stream's names its namespace and the daemon's instance id
  // (docs/DIRECT-CALLS.md stage 8); a Calls connection's frame is unchanged.
  const std::string calls_bytes = Encode(conn);
  conn.direct_conn.ns_name = "/plug";
  conn.direct_conn.instance_id = "inst-9";
  const std::string ns_bytes = Encode(conn);
  CHECK(ns_bytes.size() > calls_bytes.size());
  got = Decode(ns_bytes);
  CHECK(got.direct_conn.ns_name == "/plug");
  CHECK(got.direct_conn.instance_id == "inst-9");
  CHECK(got.direct_conn.client_slot == 41);

  Frame relayed;
  relayed.type = FrameType::kNsRelayed;
  relayed.ns.name = "/plug";
  got = Decode(Encode(relayed));
  CHECK(got.type == FrameType::kNsRelayed);
  CHECK(got.ns.name == "/plug");
}

TEST_CASE("Direct calls' side-channel frames round-trip", "[ipc][direct]") {
  // A log or trace record of a direct call names its connection; one of a
  // relayed call is today's two-key frame.
  for (FrameType type : {FrameType::kLog, FrameType::kTrace}) {
    Frame record;
    record.type = type;
    record.record = "rec";
    const std::string plain = Encode(record);
    Frame got = Decode(plain);
    CHECK(got.direct_conn.conn == 0);
    record.direct_conn.conn = 1ull << 40;
    const std::string tagged = Encode(record);
    CHECK(tagged.size() > plain.size());
    got = Decode(tagged);
    REQUIRE(got.type == type);
    CHECK(got.record == "rec");
    CHECK(got.direct_conn.conn == 1ull << 40);
  }

  Frame ask;
  ask.type = FrameType::kBarrierAsk;
  ask.call_id = "c1";
  for (bool untagged : {false, true}) {
    ask.untagged = untagged;
    Frame got = Decode(Encode(ask));
    REQUIRE(got.type == FrameType::kBarrierAsk);
    CHECK(got.call_id == "c1");
    CHECK(got.untagged == untagged);
  }
  CHECK(FrameTypeName(FrameType::kBarrierAsk) == "barrier_ask");

  Frame barrier;
  barrier.type = FrameType::kBarrier;
  barrier.call_id = "c1";
  barrier.log_seq = 12;
  barrier.trace_seq = (1ull << 63) + 5;
  Frame got = Decode(Encode(barrier));
  REQUIRE(got.type == FrameType::kBarrier);
  CHECK(got.call_id == "c1");
  CHECK(got.log_seq == 12);
  CHECK(got.trace_seq == (1ull << 63) + 5);
  CHECK(FrameTypeName(FrameType::kBarrier) == "barrier");

  Frame answer;
  answer.type = FrameType::kCallsCpuAnswer;
  answer.detail = "off";
  got = Decode(Encode(answer));
  REQUIRE(got.type == FrameType::kCallsCpuAnswer);
  CHECK(got.detail == "off");
  CHECK(FrameTypeName(FrameType::kCallsCpuAnswer) == "calls_cpu_answer");

  // Wrong msgpack types are refused: untagged not a bool, a seq not an int.
  auto bad = DecodeFrameBody(
      std::string("\x82\xa1t\xab" "barrier_ask\xa8untagged\x01", 25));
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  bad = DecodeFrameBody(std::string("\x82\xa1t\xa7" "barrier\xa7log_seq\xa1x", 21));
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  // The same bodies with the right types decode (the lengths above are exact).
  CHECK(DecodeFrameBody(
            std::string("\x82\xa1t\xab" "barrier_ask\xa8untagged\xc3", 25))
            .ok());
  CHECK(DecodeFrameBody(std::string("\x82\xa1t\xa7" "barrier\xa7log_seq\x07", 20))
            .ok());
}

TEST_CASE("FrameReader yields frames split at any byte", "[ipc]") {
  Frame a;
  a.type = FrameType::kResult;
  a.call_id = "a";
  a.data = std::string(3000, 'v');
  Frame b;
  b.type = FrameType::kCancel;
  b.call_id = "b";
  std::string wire = Encode(a) + Encode(b);
  FrameReader reader;
  std::vector<Frame> frames;
  for (char c : wire) {
    reader.Append(&c, 1);
    auto next = reader.Next();
    REQUIRE(next.ok());
    if (next->has_value()) frames.push_back(std::move(**next));
  }
  REQUIRE(frames.size() == 2);
  REQUIRE(frames[0].data == a.data);
  REQUIRE(frames[1].call_id == "b");
  REQUIRE(reader.buffered() == 0);
}

TEST_CASE("NextInto decodes in place what Next returns, frame by frame",
          "[ipc]") {
  Frame log;
  log.type = FrameType::kLog;
  log.record = std::string(300, 'r');  // past the short-string buffer
  log.direct_conn.conn = 7;
  Frame result;
  result.type = FrameType::kResult;
  result.call_id = "c-1";
  result.data = "payload";
  const std::string wire = Encode(log) + Encode(result);
  FrameReader reader;
  reader.Append(wire.data(), wire.size() - 1);  // the second lacks a byte
  std::vector<Frame> frames;
  while (true) {
    Frame& frame = frames.emplace_back();
    absl::StatusOr<bool> got = reader.NextInto(frame);
    REQUIRE(got.ok());
    if (!*got) {
      frames.pop_back();
      break;
    }
  }
  REQUIRE(frames.size() == 1);
  CHECK(frames[0].type == FrameType::kLog);
  CHECK(frames[0].record == log.record);
  CHECK(frames[0].direct_conn.conn == 7);
  reader.Append(wire.data() + wire.size() - 1, 1);
  Frame& second = frames.emplace_back();
  absl::StatusOr<bool> got = reader.NextInto(second);
  REQUIRE(got.ok());
  REQUIRE(*got);
  CHECK(second.type == FrameType::kResult);
  CHECK(second.call_id == "c-1");
  CHECK(second.data == "payload");
  CHECK(reader.buffered() == 0);

  // A bad body is the same typed error as Next's, and the frame is consumed.
  const std::string bad("\x01\x00\x00\x00\xc1", 5);  // length 1, not msgpack
  reader.Append(bad.data(), bad.size());
  Frame garbage;
  got = reader.NextInto(garbage);
  REQUIRE_FALSE(got.ok());
  CHECK(got.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(reader.buffered() == 0);
}

TEST_CASE("A truncated frame waits for more bytes and shows as buffered",
          "[ipc]") {
  Frame a;
  a.type = FrameType::kCancel;
  a.call_id = "abc";
  std::string wire = Encode(a);
  FrameReader reader;
  reader.Append(wire.data(), wire.size() - 2);
  auto next = reader.Next();
  REQUIRE(next.ok());
  REQUIRE_FALSE(next->has_value());
  REQUIRE(reader.buffered() == wire.size() - 2);
}

TEST_CASE("CompleteFrames counts the whole frames buffered, not a partial one",
          "[ipc]") {
  Frame log;
  log.type = FrameType::kLog;
  log.record = "serialized record";
  const std::string one = Encode(log);
  FrameReader reader;
  REQUIRE(reader.CompleteFrames() == 0);
  const std::string wire = one + one + one;
  reader.Append(wire.data(), wire.size() - 1);  // the third lacks a byte
  REQUIRE(reader.CompleteFrames() == 2);
  reader.Append(wire.data() + wire.size() - 1, 1);
  REQUIRE(reader.CompleteFrames() == 3);
  // Frames already taken are not counted; every decode reuses the reader's
  // msgpack zone, and each frame still owns its own bytes.
  std::vector<Frame> frames;
  for (int i = 0; i < 3; ++i) {
    auto next = reader.Next();
    REQUIRE(next.ok());
    REQUIRE(next->has_value());
    frames.push_back(std::move(**next));
    REQUIRE(reader.CompleteFrames() == static_cast<size_t>(2 - i));
  }
  for (const Frame& f : frames) REQUIRE(f.record == "serialized record");
  // A length prefix alone is not a frame.
  const unsigned char header[4] = {0x10, 0, 0, 0};
  reader.Append(reinterpret_cast<const char*>(header), 4);
  REQUIRE(reader.CompleteFrames() == 0);
}

TEST_CASE("An oversized length is refused before its body arrives", "[ipc]") {
  const unsigned char header[4] = {0xff, 0xff, 0xff, 0x7f};
  FrameReader reader;
  reader.Append(reinterpret_cast<const char*>(header), 4);
  auto next = reader.Next();
  REQUIRE(next.status().code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(next.status().message().find("frame limit") != std::string::npos);
}

TEST_CASE("Encoding an oversized frame fails without writing", "[ipc]") {
  Frame f;
  f.type = FrameType::kResult;
  f.data.assign(kMaxFrameBytes, 'x');
  std::string out = "keep";
  absl::Status s = AppendFrame(f, out);
  REQUIRE(s.code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(out == "keep");
}

std::string WithPrefix(const std::string& body) {
  std::string out(4, '\0');
  out[0] = static_cast<char>(body.size() & 0xff);
  out[1] = static_cast<char>((body.size() >> 8) & 0xff);
  out += body;
  return out;
}

absl::Status DecodeWire(const std::string& wire) {
  FrameReader reader;
  reader.Append(wire.data(), wire.size());
  return reader.Next().status();
}

TEST_CASE("Garbage frames give InvalidArgument, never a crash", "[ipc]") {
  // Not msgpack at all.
  REQUIRE(DecodeWire(WithPrefix("\xc1\xc1\xc1")).code() ==
          absl::StatusCode::kInvalidArgument);
  // msgpack, but not a map.
  msgpack::sbuffer buf;
  msgpack::pack(buf, std::vector<int>{1, 2, 3});
  REQUIRE(DecodeWire(WithPrefix(std::string(buf.data(), buf.size()))).code() ==
          absl::StatusCode::kInvalidArgument);
  // A map without a type.
  buf.clear();
  msgpack::pack(buf, std::map<std::string, int>{{"x", 1}});
  REQUIRE(DecodeWire(WithPrefix(std::string(buf.data(), buf.size()))).code() ==
          absl::StatusCode::kInvalidArgument);
  // An unknown type.
  buf.clear();
  msgpack::pack(buf, std::map<std::string, std::string>{{"t", "explode"}});
  absl::Status s = DecodeWire(WithPrefix(std::string(buf.data(), buf.size())));
  REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(s.message().find("explode") != std::string::npos);
  // A field of the wrong type.
  buf.clear();
  msgpack::packer<msgpack::sbuffer> p(buf);
  p.pack_map(2);
  p.pack(std::string("t"));
  p.pack(std::string("cancel"));
  p.pack(std::string("call_id"));
  p.pack(std::vector<int>{1});
  REQUIRE(DecodeWire(WithPrefix(std::string(buf.data(), buf.size()))).code() ==
          absl::StatusCode::kInvalidArgument);
  // An empty body.
  REQUIRE(DecodeWire(WithPrefix("")).code() ==
          absl::StatusCode::kInvalidArgument);
  // Trailing bytes after a valid body.
  buf.clear();
  msgpack::pack(buf, std::map<std::string, std::string>{{"t", "shutdown"}});
  REQUIRE(DecodeWire(WithPrefix(std::string(buf.data(), buf.size()) + "x"))
              .code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("Deeply nested garbage is refused by the unpack limits", "[ipc]") {
  std::string body(200, '\x91');  // 200 nested one-element arrays
  body += '\x01';
  REQUIRE(DecodeWire(WithPrefix(body)).code() ==
          absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace agentix::ipc

namespace agentix::ipc {
namespace {

TEST_CASE("AppendDataFrame encodes chunks like AppendFrame", "[ipc]") {
  Frame f;
  f.type = FrameType::kArgChunk;
  f.call_id = "abc";
  f.data = std::string(5000, 'q');
  std::string a, b;
  REQUIRE_OK(AppendFrame(f, a));
  REQUIRE_OK(AppendDataFrame(FrameType::kArgChunk, "abc", f.data, b));
  REQUIRE(a == b);
  REQUIRE(AppendDataFrame(FrameType::kCall, "abc", "", b).code() ==
          absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace agentix::ipc

namespace agentix::ipc {
namespace {

TEST_CASE("Log and trace frames carry the record's bytes unchanged",
          "[ipc]") {
  // The record is a serialized agentix.runtime.v1.LogRecord or TraceEvent;
  // this codec neither knows nor checks its fields (any bytes, NULs
  // included).
  for (FrameType type : {FrameType::kLog, FrameType::kTrace}) {
    Frame f;
    f.type = type;
    f.record = std::string("\x12\x06app.db\x18\x1e\x00\xff", 12);
    std::string wire;
    REQUIRE_OK(AppendFrame(f, wire));
    FrameReader reader;
    reader.Append(wire.data(), wire.size());
    auto next = reader.Next();
    REQUIRE(next.ok());
    REQUIRE((*next)->type == type);
    REQUIRE((*next)->record == f.record);
  }
  // A record that is not bytes is a bad frame.
  auto bad = DecodeFrameBody(std::string("\x82\xa1t\xa3log\xa6record\x01", 14));
  REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
  bad = DecodeFrameBody(std::string("\x82\xa1t\xa5trace\xa6record\x01", 16));
  REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace agentix::ipc

namespace agentix::ipc {
namespace {

TEST_CASE("Namespace event frames round-trip, with and without an error",
          "[ipc]") {
  Frame f;
  f.type = FrameType::kNamespaceEvent;
  f.ns.name = "/abridge";
  f.ns.event = "/v1/messages:error";
  f.ns.request_id = "r1";
  f.data = std::string("\x81\xa1k\xc4\x01\x00", 6);  // {"k": b"\0"}
  Frame plain = Decode(Encode(f));
  REQUIRE(plain.type == FrameType::kNamespaceEvent);
  REQUIRE(plain.ns.name == "/abridge");
  REQUIRE(plain.ns.event == "/v1/messages:error");
  REQUIRE(plain.ns.request_id == "r1");
  REQUIRE_FALSE(plain.ns.has_error);
  REQUIRE(plain.data == f.data);

  f.ns.has_error = true;
  f.ns.error_type = "HTTPError";
  f.ns.error_message = "upstream said no";
  f.ns.status_code = 503;
  Frame failed = Decode(Encode(f));
  REQUIRE(failed.ns.has_error);
  REQUIRE(failed.ns.error_type == "HTTPError");
  REQUIRE(failed.ns.error_message == "upstream said no");
  REQUIRE(failed.ns.status_code == 503);
}

TEST_CASE("A namespace frame whose ns field is not a map is refused", "[ipc]") {
  std::string body;
  {
    msgpack::sbuffer buffer;
    msgpack::packer<msgpack::sbuffer> p(buffer);
    p.pack_map(2);
    p.pack(std::string("t"));
    p.pack(std::string("ns_event"));
    p.pack(std::string("ns"));
    p.pack(7);
    body.assign(buffer.data(), buffer.size());
  }
  auto frame = DecodeFrameBody(body);
  REQUIRE(frame.status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace agentix::ipc

namespace agentix::ipc {
namespace {

TEST_CASE("EncodeFrameAround gives AppendFrame's bytes around the payload",
          "[ipc]") {
  const std::string payload(300000, 'p');
  for (FrameType type : {FrameType::kArgChunk, FrameType::kResultChunk,
                         FrameType::kResult, FrameType::kStreamItem}) {
    Frame f;
    f.type = type;
    f.call_id = "call-7";
    f.encoding = 2;
    f.index = 70000;
    f.total_size = (1u << 20) * 16 + 3;
    for (size_t size : {size_t{0}, size_t{31}, size_t{300}, payload.size()}) {
      f.data = payload.substr(0, size);
      std::string want;
      REQUIRE_OK(AppendFrame(f, want));
      std::string head = "stale", tail = "stale";
      REQUIRE_OK(EncodeFrameAround(f, size, head, tail));
      REQUIRE(head + f.data + tail == want);
    }
  }
  Frame call;
  call.type = FrameType::kCall;
  std::string head, tail;
  REQUIRE(EncodeFrameAround(call, 1, head, tail).code() ==
          absl::StatusCode::kInvalidArgument);
  Frame chunk;
  chunk.type = FrameType::kResultChunk;
  REQUIRE(EncodeFrameAround(chunk, kMaxFrameBytes, head, tail).code() ==
          absl::StatusCode::kResourceExhausted);
}

TEST_CASE("Next(&data) returns the payload as a view into the buffer",
          "[ipc]") {
  Frame chunk;
  chunk.type = FrameType::kArgChunk;
  chunk.call_id = "c";
  chunk.data = std::string(5000, 'a');
  Frame cancel;
  cancel.type = FrameType::kCancel;
  cancel.call_id = "c";
  std::string wire;
  REQUIRE_OK(AppendFrame(chunk, wire));
  REQUIRE_OK(AppendFrame(cancel, wire));
  FrameReader reader;
  reader.Append(wire.data(), wire.size());
  std::string_view data = "stale";
  auto first = reader.Next(&data);
  REQUIRE(first.ok());
  REQUIRE(first->has_value());
  REQUIRE((*first)->data.empty());  // not copied
  REQUIRE(data == chunk.data);
  // A frame without a "data" field leaves the view empty.
  auto second = reader.Next(&data);
  REQUIRE(second.ok());
  REQUIRE((*second)->type == FrameType::kCancel);
  REQUIRE(data.empty());
  // The view survives Next() calls that find nothing, until Append.
  auto none = reader.Next(&data);
  REQUIRE(none.ok());
  REQUIRE(!none->has_value());
  REQUIRE(reader.buffered() == 0);
}

TEST_CASE("ReadFrom reads frames straight from a socket, across reads",
          "[ipc]") {
  int fds[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  // Payloads of several sizes, so frames straddle reads of 64 KiB and the
  // buffer both compacts and grows.
  std::string wire;
  std::vector<std::string> payloads;
  for (size_t size : {10u, 70000u, 3u << 20, 1u, (1u << 20) + 7}) {
    Frame f;
    f.type = FrameType::kResultChunk;
    f.call_id = "c" + std::to_string(payloads.size());
    f.data = std::string(size, static_cast<char>('a' + payloads.size()));
    payloads.push_back(f.data);
    REQUIRE_OK(AppendFrame(f, wire));
  }
  absl::Status written;  // checked after join: Catch2 asserts on one thread
  std::thread writer([&] { written = WriteAll(fds[0], wire); });
  FrameReader reader;
  std::vector<Frame> got;
  size_t total = 0;
  while (got.size() < payloads.size()) {
    const ssize_t n = reader.ReadFrom(fds[1], 64 << 10);
    REQUIRE(n > 0);
    total += static_cast<size_t>(n);
    while (true) {
      auto next = reader.Next();
      REQUIRE(next.ok());
      if (!next->has_value()) break;
      got.push_back(std::move(**next));
    }
  }
  writer.join();
  REQUIRE_OK(written);
  REQUIRE(total == wire.size());
  REQUIRE(reader.buffered() == 0);
  for (size_t i = 0; i < payloads.size(); ++i) {
    REQUIRE(got[i].call_id == "c" + std::to_string(i));
    REQUIRE(got[i].data == payloads[i]);
  }
  close(fds[0]);
  REQUIRE(reader.ReadFrom(fds[1], 16) == 0);  // end of stream
  close(fds[1]);
}

}  // namespace
}  // namespace agentix::ipc

namespace agentix::ipc {
namespace {

TEST_CASE("WriteAll(pieces) writes the concatenation, in order", "[ipc]") {
  int fds[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  // More pieces than one writev takes, empty ones included, and more bytes
  // than the socket buffer holds (partial writes).
  std::vector<std::string> storage;
  std::string want;
  for (int i = 0; i < 300; ++i) {
    storage.push_back(std::string(i % 7 == 0 ? 0 : 1000 + i * 37, 'a' + i % 26));
    want += storage.back();
  }
  std::vector<std::string_view> pieces(storage.begin(), storage.end());
  std::string got;
  std::thread reader([&] {
    char buffer[65536];
    while (got.size() < want.size()) {
      const ssize_t n = read(fds[1], buffer, sizeof buffer);
      if (n <= 0) break;
      got.append(buffer, static_cast<size_t>(n));
    }
  });
  REQUIRE_OK(WriteAll(fds[0], pieces));
  reader.join();
  REQUIRE(got == want);
  close(fds[1]);
  signal(SIGPIPE, SIG_IGN);  // as the worker and daemon do: EPIPE, not death
  REQUIRE(WriteAll(fds[0], pieces).code() == absl::StatusCode::kUnavailable);
  close(fds[0]);
}

TEST_CASE("Ring payload references round-trip in the four payload frames",
          "[ipc][ring]") {
  for (FrameType type : {FrameType::kCall, FrameType::kArgChunk,
                         FrameType::kResultChunk, FrameType::kResult}) {
    Frame f;
    f.type = type;
    f.call_id = "c1";
    f.callable = type == FrameType::kCall ? "m::f" : "";
    f.encoding = type == FrameType::kArgChunk ? 0 : 1;
    f.total_size =
        type == FrameType::kArgChunk || type == FrameType::kResultChunk
            ? 0
            : 5u << 20;
    f.in_ring = true;
    f.ring_pos = 123456789;
    f.ring_size = 1 << 20;
    Frame back = Decode(Encode(f));
    CHECK(back.type == type);
    CHECK(back.call_id == "c1");
    CHECK(back.in_ring);
    CHECK(back.ring_pos == 123456789);
    CHECK(back.ring_size == 1u << 20);
    CHECK(back.data.empty());
    CHECK(back.total_size == f.total_size);
    CHECK(back.callable == f.callable);
  }
  Frame log;
  log.type = FrameType::kLog;
  log.in_ring = true;
  log.ring_size = 1;
  std::string out;
  CHECK(AppendFrame(log, out).code() == absl::StatusCode::kInvalidArgument);
  CHECK(out.empty());
}

TEST_CASE("Malformed ring references are typed errors", "[ipc][ring]") {
  auto decode = [](std::initializer_list<std::pair<std::string, int>> ints,
                   bool with_data, const std::string& type) {
    msgpack::sbuffer buf;
    msgpack::packer<msgpack::sbuffer> p(buf);
    p.pack_map(ints.size() + 2 + (with_data ? 1 : 0));
    p.pack(std::string("t"));
    p.pack(type);
    p.pack(std::string("call_id"));
    p.pack(std::string("c"));
    for (const auto& [k, v] : ints) {
      p.pack(k);
      p.pack(v);
    }
    if (with_data) {
      p.pack(std::string("data"));
      p.pack_bin(1);
      p.pack_bin_body("x", 1);
    }
    return DecodeFrameBody(std::string_view(buf.data(), buf.size())).status();
  };
  CHECK(decode({{"ring_pos", 0}, {"ring_size", 10}}, false, "arg_chunk").ok());
  CHECK(decode({{"ring_pos", 0}}, false, "arg_chunk").code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(
      decode({{"ring_pos", 0}, {"ring_size", 0}}, false, "arg_chunk").code() ==
      absl::StatusCode::kInvalidArgument);
  CHECK(
      decode({{"ring_pos", 0}, {"ring_size", 10}}, true, "arg_chunk").code() ==
      absl::StatusCode::kInvalidArgument);
  CHECK(decode({{"ring_pos", 0}, {"ring_size", 10}}, false, "cancel").code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace agentix::ipc
