// Writes the seed corpora of the fuzz targets with the project's own
// encoders, so every seed is a valid input the real code produces:
//   bazel run //fuzz:make_seeds -- $PWD/fuzz/corpus
// (tools/fuzz --seeds does this with the fuzz build).
#include <msgpack.hpp>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "agentix/runtime/v1/runtime.pb.h"
#include "wire/frame_codec.h"
#include "worker/ipc/frame.h"
#include "worker/ipc/ledger.h"

namespace {

using agentix::ipc::Frame;
using agentix::ipc::FrameType;
using agentix::runtime::v1::CallsRequest;
using agentix::runtime::v1::HostEvent;

bool Write(const std::string& dir, const std::string& name,
           const std::string& bytes) {
  std::ofstream out(dir + "/" + name, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(out);
}

std::string Encode(const Frame& f) {
  std::string out;
  if (!agentix::ipc::AppendFrame(f, out).ok()) std::abort();
  return out;
}

std::vector<std::pair<std::string, Frame>> Frames() {
  std::vector<std::pair<std::string, Frame>> v;
  Frame f;
  f.type = FrameType::kCall;
  f.call_id = "c1";
  f.callable = "mod::fn";
  f.encoding = 2;
  f.data = std::string("\x92\x91\x01\x80", 4);
  f.total_size = 4;
  f.context = "ctx";
  f.stream_window = 4;
  v.push_back({"call", f});
  f = Frame();
  f.type = FrameType::kArgChunk;
  f.call_id = "c1";
  f.data = "more";
  v.push_back({"arg_chunk", f});
  f = Frame();
  f.type = FrameType::kCancel;
  f.call_id = "c1";
  v.push_back({"cancel", f});
  f = Frame();
  f.type = FrameType::kShutdown;
  v.push_back({"shutdown", f});
  f = Frame();
  f.type = FrameType::kStreamAck;
  f.call_id = "c1";
  f.index = 3;
  v.push_back({"stream_ack", f});
  f = Frame();
  f.type = FrameType::kReady;
  f.pid = 1234;
  f.detail = "3.11";
  v.push_back({"ready", f});
  f = Frame();
  f.type = FrameType::kBootError;
  f.error.type = "ImportError";
  f.error.message = "no module";
  f.error.returncode = 3;
  v.push_back({"boot_error", f});
  f = Frame();
  f.type = FrameType::kResultChunk;
  f.call_id = "c1";
  f.data = "chunk";
  v.push_back({"result_chunk", f});
  f = Frame();
  f.type = FrameType::kResult;
  f.call_id = "c1";
  f.encoding = 1;
  f.data = "value";
  f.total_size = 10;
  v.push_back({"result", f});
  f = Frame();
  f.type = FrameType::kError;
  f.call_id = "c1";
  f.error.code = 1;
  f.error.type = "Cancelled";
  f.error.message = "remote call cancelled";
  f.error.traceback = "Traceback";
  f.error.cancelled = true;
  v.push_back({"error", f});
  f = Frame();
  f.type = FrameType::kStreamItem;
  f.call_id = "c1";
  f.index = 7;
  f.encoding = 1;
  f.data = "item";
  v.push_back({"stream_item", f});
  f = Frame();
  f.type = FrameType::kLog;
  {
    agentix::runtime::v1::LogRecord r;
    r.set_logger("agentix.sandbox.stdout");
    r.set_level(30);
    r.set_level_name("WARNING");
    r.set_message("hello");
    r.set_time_unix_nanos(1700000000000000000);
    r.set_file("x.py");
    r.set_line(3);
    r.set_origin(agentix::runtime::v1::LOG_ORIGIN_STDOUT);
    r.set_call_id("c1");
    r.set_extras(std::string("\x81\xa1k\xa1v", 5));
    f.record = r.SerializeAsString();
  }
  v.push_back({"log", f});
  f = Frame();
  f.type = FrameType::kTrace;
  {
    agentix::runtime::v1::TraceEvent e;
    e.set_kind(agentix::runtime::v1::TRACE_EVENT_KIND_SPAN_END);
    e.set_agentix_trace_id("trace_0123");
    e.set_agentix_span_id("span_4567");
    e.set_name("work");
    e.set_start_time_unix_nanos(1);
    e.set_end_time_unix_nanos(2);
    auto* a = e.add_attributes();
    a->set_key("k");
    a->mutable_value()->set_int_value(1);
    auto* event = e.add_events();
    event->set_name("e");
    event->set_time_unix_nanos(5);
    e.set_status(agentix::runtime::v1::SPAN_STATUS_CODE_OK);
    f.record = e.SerializeAsString();
  }
  v.push_back({"trace", f});
  return v;
}

template <typename T>
std::string Pack(const T& value) {
  msgpack::sbuffer buffer;
  msgpack::pack(buffer, value);
  return std::string(buffer.data(), buffer.size());
}

bool WriteFrameSeeds(const std::string& dir) {
  bool ok = true;
  std::string all(1, '\x2a');  // piece-size seed byte, then the stream
  for (const auto& [name, frame] : Frames()) {
    const std::string wire = Encode(frame);
    // As a stream: one seed byte + the framed bytes.
    ok &= Write(dir, "stream_" + name, std::string(1, '\x07') + wire);
    // As a bare body (what DecodeFrameBody sees).
    ok &= Write(dir, "body_" + name, wire.substr(4));
    all += wire;
  }
  ok &= Write(dir, "stream_all", all);
  return ok;
}

bool WriteMsgpackSeeds(const std::string& dir) {
  bool ok = true;
  ok &= Write(dir, "nil", Pack(msgpack::type::nil_t()));
  ok &= Write(dir, "bool", Pack(true));
  ok &= Write(dir, "uint64_max", Pack(uint64_t{18446744073709551615u}));
  ok &= Write(dir, "int64_min", Pack(int64_t{-9223372036854775807 - 1}));
  ok &= Write(dir, "double", Pack(3.25));
  ok &= Write(dir, "float32", Pack(1.5f));
  ok &= Write(dir, "str", Pack(std::string("h\xc3\xa9llo")));
  ok &= Write(dir, "bin",
              Pack(std::vector<char>{'\x00', '\xff', '\x10'}));
  // [args, kwargs] as a call's arguments travel with encoding 2.
  ok &= Write(dir, "call_args",
              Pack(std::make_tuple(
                  std::make_tuple(1, std::string("two"), 3.0),
                  std::map<std::string, std::vector<int>>{{"k", {1, 2}}})));
  ok &= Write(dir, "nested",
              Pack(std::vector<std::map<std::string, std::vector<bool>>>{
                  {{"a", {true, false}}}, {}}));
  // Refused inputs, kept as seeds so the error paths are covered at once.
  ok &= Write(dir, "ext", std::string("\xd4\x01\x02", 3));
  ok &= Write(dir, "int_key_map", std::string("\x81\x01\x02", 3));
  ok &= Write(dir, "bad_utf8", std::string("\xa2\xc3\x28", 3));
  ok &= Write(dir, "truncated_array", std::string("\x93\x01", 2));
  ok &= Write(dir, "trailing", std::string("\x01\x02", 2));
  return ok;
}

HostEvent Start(const std::string& id, const std::string& callable,
                const std::string& args, uint64_t total = 0,
                uint32_t window = 0) {
  HostEvent e;
  auto* s = e.mutable_start();
  s->set_call_id(id);
  s->set_callable(callable);
  s->set_arguments(args);
  s->set_arguments_size(total);
  s->set_stream_window(window);
  return e;
}

bool WriteSession(const std::string& dir, const std::string& name,
                  const std::vector<HostEvent>& events) {
  CallsRequest request;
  for (const auto& e : events) *request.add_events() = e;
  return Write(dir, name, request.SerializeAsString());
}

bool WriteSessionSeeds(const std::string& dir) {
  bool ok = true;
  HostEvent chunk;
  chunk.mutable_argument_chunk()->set_call_id("a");
  chunk.mutable_argument_chunk()->set_data("world");
  HostEvent cancel;
  cancel.mutable_cancel()->set_call_id("h");
  HostEvent resume;
  resume.mutable_resume()->add_call_ids("e");
  resume.mutable_resume()->add_call_ids("unknown");
  HostEvent ack;
  ack.mutable_ack()->set_call_id("e");
  HostEvent stream_ack;
  stream_ack.mutable_stream_ack()->set_call_id("s");
  stream_ack.mutable_stream_ack()->set_next_index(2);
  ok &= WriteSession(dir, "echo", {Start("e", "fake::echo", "hello")});
  ok &= WriteSession(dir, "chunked",
                     {Start("a", "fake::echo", "hello ", 11), chunk});
  ok &= WriteSession(dir, "chunk_overflow",
                     {Start("a", "fake::echo", "hi", 3), chunk});
  ok &= WriteSession(dir, "cancel", {Start("h", "fake::hang", ""), cancel});
  ok &= WriteSession(dir, "resume_ack",
                     {Start("e", "fake::echo", "x"), resume, ack});
  ok &= WriteSession(dir, "stream",
                     {Start("s", "fake::stream", "5", 0, 2), stream_ack});
  ok &= WriteSession(dir, "errors",
                     {Start("r", "fake::error", ""),
                      Start("m", "no.such::thing", "")});
  ok &= WriteSession(dir, "bad_requests",
                     {HostEvent(), Start("", "fake::echo", "x"),
                      Start("big", "fake::echo", "", 1ull << 40),
                      Start("short", "fake::echo", "toolong", 3)});
  ok &= WriteSession(dir, "worker_dies",
                     {Start("k", "fake::hang", ""),
                      Start("x", "fake::exit", "7")});
  ok &= WriteSession(dir, "garbage", {Start("g", "fake::garbage", "")});
  ok &= WriteSession(dir, "double", {Start("d", "fake::double", "")});
  return ok;
}

bool WriteNamespaceSeeds(const std::string& dir) {
  using agentix::runtime::v1::NamespaceResponse;
  NamespaceResponse opened;
  opened.set_namespace_("/llm");
  opened.set_opened(true);
  opened.set_instance_id("d41d8cd98f00b204");
  NamespaceResponse events;
  events.set_namespace_("/llm");
  auto* request = events.add_events();
  request->set_event("complete");
  request->set_data(
      "\x82\xaarequest_id\xa1x\xa4"
      "data\xc0");
  request->set_request_id("x");
  auto* reply = events.add_events();
  reply->set_event("complete:error");
  reply->set_data("\x80");
  reply->mutable_error()->set_type("ValueError");
  reply->mutable_error()->set_message("température");
  reply->mutable_error()->set_status_code(429);
  events.add_events()->set_event("agentix:host_connected");
  return Write(dir, "opened", opened.SerializeAsString()) &&
         Write(dir, "events", events.SerializeAsString());
}

bool WriteCallResultsSeeds(const std::string& dir) {
  using agentix::runtime::v1::CallsResponse;
  CallsResponse noop;
  auto* result = noop.add_events()->mutable_result();
  result->set_call_id("eab30144a6f622fc0000000000000001");
  result->set_encoding(agentix::runtime::v1::ENCODING_PICKLE);
  result->set_value(std::string("\x80\x05N.", 4));
  CallsResponse many;
  for (int i = 0; i < 3; ++i) {
    auto* each = many.add_events()->mutable_result();
    each->set_call_id("appel-" + std::to_string(i));
    each->set_value(std::string(200, static_cast<char>(i)));
    each->set_value_size(1 << 21);
    each->set_log_seq(7);
    each->set_trace_seq(UINT64_MAX);
  }
  CallsResponse mixed = noop;
  mixed.add_events()->mutable_error()->set_call_id("e");
  return Write(dir, "noop", noop.SerializeAsString()) &&
         Write(dir, "many", many.SerializeAsString()) &&
         Write(dir, "mixed", mixed.SerializeAsString());
}

// side_wire_fuzzer: a first byte (0: LogsResponse, 1: TracesResponse), then
// the message.
bool WriteSideSeeds(const std::string& dir) {
  using namespace agentix::runtime::v1;
  LogsResponse logs;
  logs.set_instance_id("d41d8cd98f00b204");
  LogRecord* record = logs.add_records();
  record->set_seq(7);
  record->set_logger("bench.side");
  record->set_level(20);
  record->set_level_name("INFO");
  record->set_message("side-channel record 7 température");
  record->set_time_unix_nanos(1764670000123456789);
  record->set_file("/sandbox/side_targets.py");
  record->set_line(31);
  record->set_function("log_burst");
  record->set_origin(LOG_ORIGIN_LOGGING);
  record->set_worker_id("1a2b3c4d");
  record->set_call_id("call-1");
  record->set_context("sandbox-host-worker-1a2b3c4d");
  record->set_extras("\x81\xa1k\x01");
  logs.add_records()->set_exception_text("Traceback ...");
  TracesResponse traces;
  traces.set_instance_id("d41d8cd98f00b204");
  TraceEvent* start = traces.add_events();
  start->set_seq(1);
  start->set_kind(TRACE_EVENT_KIND_TRACE_START);
  start->set_agentix_trace_id("trace_0123456789abcdef0123456789abcdef");
  start->set_trace_id(std::string(16, '\x01'));
  start->set_name("bench");
  Attribute* meta = start->add_attributes();
  meta->set_key("user");
  meta->mutable_value()->set_string_value("x");
  TraceEvent* end = traces.add_events();
  end->set_seq(2);
  end->set_kind(TRACE_EVENT_KIND_SPAN_END);
  end->set_agentix_span_id("span_0123456789abcdef01234567");
  end->set_name("s");
  end->set_end_time_unix_nanos(2);
  Attribute* number = end->add_attributes();
  number->set_key("i");
  number->mutable_value()->set_int_value(-3);
  Attribute* ratio = end->add_attributes();
  ratio->set_key("r");
  ratio->mutable_value()->set_double_value(0.5);
  auto* event = end->add_events();
  event->set_name("retry");
  event->add_attributes()->mutable_value()->set_bool_value(true);
  end->set_error_message("boom");
  end->add_error_data()->mutable_value()->set_bytes_value("\xff");
  return Write(dir, "logs", std::string(1, '\0') + logs.SerializeAsString()) &&
         Write(dir, "traces", std::string(1, '\1') + traces.SerializeAsString());
}

// What a host sends on PATH.calls: HELLO, MESSAGEs, HALF_CLOSE, in one
// stream, and the refused shapes (unknown kind, oversized length, a bad
// HELLO), plus a daemon's STATUS.
// A Namespace stream on the frame wire: HELLO naming it, OpenNamespace, one
// event, HALF_CLOSE.
bool WriteNamespaceStreamSeed(const std::string& dir) {
  using namespace agentix::sandbox;
  const std::string hello = EncodeFrame(
      FrameKind::kHello, EncodeHello({{"authorization", "Bearer t0k"},
                                      {kFrameStreamKey, kFrameStreamNamespace}}));
  agentix::runtime::v1::NamespaceRequest open;
  open.mutable_open()->set_namespace_("/plug");
  agentix::runtime::v1::NamespaceRequest event;
  event.mutable_event()->set_event("ping");
  event.mutable_event()->set_data("\x81\xa1x\x01");
  return Write(dir, "namespace-stream",
               hello + EncodeFrame(FrameKind::kMessage, open.SerializeAsString()) +
                   EncodeFrame(FrameKind::kMessage, event.SerializeAsString()) +
                   EncodeFrame(FrameKind::kHalfClose, ""));
}

bool WriteFrameWireSeeds(const std::string& dir) {
  using namespace agentix::sandbox;
  agentix::runtime::v1::CallsRequest request;
  auto* start = request.add_events()->mutable_start();
  start->set_call_id("c1");
  start->set_callable("fake::echo");
  start->set_arguments("hi");
  const std::string hello = EncodeFrame(
      FrameKind::kHello, EncodeHello({{"authorization", "Bearer t0k"},
                                      {"agentix-client-id", "client-1"}}));
  const std::string message =
      EncodeFrame(FrameKind::kMessage, request.SerializeAsString());
  const std::string half_close = EncodeFrame(FrameKind::kHalfClose, "");
  char oversized[kFrameHeaderBytes];
  EncodeFrameHeader(FrameKind::kMessage, kMaxFrameMessageBytes + 1, oversized);
  // Bulk fields the daemon splices (frame_splice.h): a StartCall's first
  // argument bytes among its other fields, chunks with and without offset.
  agentix::runtime::v1::CallsRequest bulk;
  auto* first = bulk.add_events()->mutable_start();
  first->set_call_id("c2");
  first->set_callable("fake::echo");
  first->set_arguments("0123456789");
  first->set_arguments_size(30);
  first->set_context("ctx");
  (*first->mutable_baggage())["k"] = "v";
  auto* chunk = bulk.add_events()->mutable_argument_chunk();
  chunk->set_call_id("c2");
  chunk->set_data("abcdefghij");
  chunk->set_offset(10);
  bulk.add_events()->mutable_argument_chunk()->set_data("klmnopqrst");
  bulk.add_events()->mutable_ack()->set_call_id("c0");
  const std::string bulk_message =
      EncodeFrame(FrameKind::kMessage, bulk.SerializeAsString());
  // The same message as a RING_MESSAGE: the start's arguments and the
  // first chunk's data in the ring (positions the fuzzer's fixed ring holds).
  const std::string serialized = bulk.SerializeAsString();
  const size_t args_at = serialized.find("0123456789");
  const size_t data_at = serialized.find("abcdefghij");
  const std::string ring_payload =
      EncodeRingHead({{static_cast<uint32_t>(args_at), 0, 10},
                      {static_cast<uint32_t>(data_at - 10), 10, 10}}) +
      serialized.substr(0, args_at) +
      serialized.substr(args_at + 10, data_at - args_at - 10) +
      serialized.substr(data_at + 10);
  const std::string ring_message =
      EncodeFrame(FrameKind::kRingMessage, ring_payload);
  return Write(dir, "stream", hello + message + message + half_close) &&
         Write(dir, "bulk", hello + bulk_message) &&
         Write(dir, "ring", hello + ring_message) &&
         Write(dir, "hello-only", hello) &&
         Write(dir, "status",
               EncodeFrame(FrameKind::kStatus,
                           EncodeStatus(absl::StatusCode::kUnauthenticated,
                                        "wrong token"))) &&
         Write(dir, "unknown-kind", hello + std::string("\0\0\0\0\x09", 5)) &&
         Write(dir, "oversized",
               hello + std::string(oversized, sizeof(oversized))) &&
         Write(dir, "bad-hello", EncodeFrame(FrameKind::kHello, "\x05\x00AB")) &&
         WriteNamespaceStreamSeed(dir);
}

// What a peer sends the C++ client on a Calls connection (the fuzzer's first
// byte: bit 0 = the client asked for calls-CPU answers).
bool WriteClientFrameReaderSeeds(const std::string& dir) {
  using namespace agentix::sandbox;
  agentix::runtime::v1::CallsResponse response;
  auto* chunk = response.add_events()->mutable_result_chunk();
  chunk->set_call_id("c1");
  chunk->set_data("lead");
  auto* result = response.add_events()->mutable_result();
  result->set_call_id("c1");
  result->set_value("tail");
  result->set_value_size(8);
  auto* error = response.add_events()->mutable_error();
  error->set_call_id("c2");
  response.add_events()->mutable_stream_item()->set_call_id("c3");
  const std::string message = EncodeFrame(FrameKind::kMessage, response.SerializeAsString());
  const std::string told =
      EncodeFrame(FrameKind::kHello, EncodeHello({{kFrameCallsCpuKey, "off"}}));
  const std::string ok = EncodeFrame(FrameKind::kStatus, EncodeStatus(absl::StatusCode::kOk, ""));
  char oversized[kFrameHeaderBytes];
  EncodeFrameHeader(FrameKind::kMessage, kMaxFrameMessageBytes + 1, oversized);
  char promised[kFrameHeaderBytes];  // a whole MESSAGE's length, then EOF
  EncodeFrameHeader(FrameKind::kMessage, kMaxFrameMessageBytes, promised);
  const std::string plain(1, '\0'), asked(1, '\1'), spins(1, '\2');  // the first byte
  return Write(dir, "results", plain + message + message + ok) &&
         Write(dir, "told", asked + told + message + told + ok) &&
         Write(dir, "unasked-hello", plain + told) &&
         Write(dir, "eof", spins + message + message.substr(0, 7)) &&
         Write(dir, "unauthenticated",
               plain + EncodeFrame(FrameKind::kStatus,
                                    EncodeStatus(absl::StatusCode::kUnauthenticated, "no"))) &&
         Write(dir, "ring", plain + EncodeFrame(FrameKind::kRingMessage, std::string(2, '\0'))) &&
         Write(dir, "oversized", plain + std::string(oversized, sizeof(oversized))) &&
         Write(dir, "promised", asked + std::string(promised, sizeof(promised)) + "abc") &&
         Write(dir, "not-a-response", plain + EncodeFrame(FrameKind::kMessage, "\xff\xff"));
}

// frame_connection_fuzzer: a mode byte (bit 0: the host's ring, bit 1: a
// 1024-byte message limit, bits 2-4: bytes read past HELLO, bits 5-7: how
// the rest is cut), then what a host sends after HELLO.
bool WriteFrameConnectionSeeds(const std::string& dir) {
  using namespace agentix::sandbox;
  agentix::runtime::v1::CallsRequest request;
  auto* start = request.add_events()->mutable_start();
  start->set_call_id("c1");
  start->set_callable("mod::fn");
  start->set_arguments("hi");
  const std::string message =
      EncodeFrame(FrameKind::kMessage, request.SerializeAsString());
  const std::string half_close = EncodeFrame(FrameKind::kHalfClose, "");
  // An upload whose chunk's data lies in the fuzzer's ring (positions 0-9).
  agentix::runtime::v1::CallsRequest upload;
  auto* first = upload.add_events()->mutable_start();
  first->set_call_id("c2");
  first->set_callable("mod::fn");
  first->set_arguments("0123456789");
  first->set_arguments_size(20);
  auto* chunk = upload.add_events()->mutable_argument_chunk();
  chunk->set_call_id("c2");
  chunk->set_data("abcdefghij");
  chunk->set_offset(10);
  const std::string serialized = upload.SerializeAsString();
  const size_t data_at = serialized.find("abcdefghij");
  const std::string ring_message = EncodeFrame(
      FrameKind::kRingMessage,
      EncodeRingHead({{static_cast<uint32_t>(data_at), 0, 10}}) +
          serialized.substr(0, data_at) + serialized.substr(data_at + 10));
  char oversized[kFrameHeaderBytes];
  EncodeFrameHeader(FrameKind::kMessage, kMaxFrameMessageBytes + 1, oversized);
  agentix::runtime::v1::CallsRequest large = request;
  large.mutable_events(0)->mutable_start()->set_arguments(std::string(1500, 'x'));
  auto seed = [&](const char* name, uint8_t mode, const std::string& bytes) {
    return Write(dir, name, std::string(1, static_cast<char>(mode)) + bytes);
  };
  return seed("requests", 0x00, message + message + half_close) &&
         // 97 bytes read with HELLO, the rest written 38 bytes at a time.
         seed("pre-and-pieces", (1 << 2) | (1 << 5),
              message + message + message + message + half_close) &&
         seed("upload", 0x00,
              EncodeFrame(FrameKind::kMessage, serialized) + half_close) &&
         seed("ring", 0x01, ring_message + message) &&
         seed("unparseable", 0x00,
              EncodeFrame(FrameKind::kMessage, "\xff\xff") + message) &&
         seed("after-half-close", 0x00, half_close + message) &&
         seed("unknown-kind", 0x00, message + std::string("\0\0\0\0\x09", 5)) &&
         seed("oversized", 0x00,
              message + std::string(oversized, sizeof(oversized))) &&
         seed("over-limit", 0x02,
              EncodeFrame(FrameKind::kMessage, large.SerializeAsString()));
}

}  // namespace

// ledger_reader_fuzzer: two count bytes, then a ledger the writer filled
// (running, retained and finished calls of known clients).
bool WriteLedgerSeeds(const std::string& dir) {
  namespace ipc = agentix::ipc;
  bool ok = true;
  for (uint32_t n : {1u, 4u}) {
    std::string region(ipc::LedgerBytes(n, n), '\0');
    if (!ipc::FormatLedger(absl::MakeSpan(region.data(), region.size()), n, n)
             .ok()) {
      std::abort();
    }
    auto writer =
        ipc::LedgerWriter::Open(absl::MakeSpan(region.data(), region.size()));
    if (!writer.ok()) std::abort();
    auto done = (*writer)->Started(1, "0123456789abcdef0123456789abcdef");
    if (done) (*writer)->Finished(*done);
    auto running = (*writer)->Started(2, "running");
    auto retained = (*writer)->Started(0, "retained");
    if (retained) (*writer)->Retained(*retained);
    (void)running;
    const std::string counts{static_cast<char>(n), static_cast<char>(n)};
    ok &= Write(dir, "ledger_" + std::to_string(n), counts + region);
  }
  return ok;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds CORPUS_DIR\n");
    return 2;
  }
  const std::string root = argv[1];
  bool ok = WriteFrameSeeds(root + "/frame_fuzzer") &&
            WriteMsgpackSeeds(root + "/msgpack_convert_fuzzer") &&
            WriteNamespaceSeeds(root + "/namespace_wire_fuzzer") &&
            WriteCallResultsSeeds(root + "/call_results_wire_fuzzer") &&
            WriteSideSeeds(root + "/side_wire_fuzzer") &&
            WriteSessionSeeds(root + "/session_fuzzer") &&
            WriteFrameWireSeeds(root + "/frame_wire_fuzzer") &&
            WriteClientFrameReaderSeeds(root + "/client_frame_reader_fuzzer") &&
            WriteFrameConnectionSeeds(root + "/frame_connection_fuzzer") &&
            WriteLedgerSeeds(root + "/ledger_reader_fuzzer");
  if (!ok) {
    std::fprintf(stderr, "make_seeds: could not write under %s (do the "
                 "<target> directories exist?)\n", root.c_str());
    return 1;
  }
  return 0;
}
