#include "sandbox/runtime_service.h"

#include <grpcpp/grpcpp.h>

#include <thread>

#include <catch2/catch.hpp>

#include "sandbox/fake_worker_calls.h"
#include "sandbox/test_server.h"

namespace agentix::sandbox {
namespace {

using runtime::v1::CallsRequest;
using runtime::v1::CallsResponse;

struct Harness {
  explicit Harness(SessionOptions options = FakeWorkerSessionOptions())
      : manager(std::move(options)),
        service(&manager, "test-version"),
        server([this](grpc::ServerBuilder& b) { service.AddTo(b); }) {
    service.Start(server.reactions());
    stub = runtime::v1::RuntimeService::NewStub(server.Channel());
  }
  SessionManager manager;
  RuntimeServiceImpl service;
  TestServer server;
  std::unique_ptr<runtime::v1::RuntimeService::Stub> stub;
};

// A stream of `method` that sends raw bytes, as a broken or hostile client
// would; reads raw bytes too.
std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>>
RawStream(Harness& h, const char* method, grpc::ClientContext* ctx) {
  return std::unique_ptr<
      grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>>(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer,
                                                grpc::ByteBuffer>::
          Create(h.server.Channel().get(),
                 grpc::internal::RpcMethod(
                     method, grpc::internal::RpcMethod::BIDI_STREAMING),
                 ctx));
}

grpc::ByteBuffer Bytes(const std::string& s) {
  grpc::Slice slice(s);
  return grpc::ByteBuffer(&slice, 1);
}

// Not a protobuf: field 1 (length-delimited) claims 100 bytes, 2 follow.
constexpr char kGarbage[] = "\x0a\x64zz";

template <typename Message>
Message Parse(grpc::ByteBuffer& buffer) {
  Message m;
  REQUIRE(grpc::SerializationTraits<Message>::Deserialize(&buffer, &m).ok());
  return m;
}

TEST_CASE("An unparseable Calls message gets BadRequest; the stream goes on",
          "[sandbox]") {
  Harness h;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto stream =
      RawStream(h, "/agentix.runtime.v1.RuntimeService/Calls", &ctx);
  REQUIRE(stream->Write(Bytes(kGarbage)));
  grpc::ByteBuffer raw;
  REQUIRE(stream->Read(&raw));
  CallsResponse resp = Parse<CallsResponse>(raw);
  REQUIRE(resp.events_size() == 1);
  const auto& error = resp.events(0).error().error();
  REQUIRE(error.type() == "BadRequest");
  REQUIRE(error.code() == static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  // The same stream still runs calls.
  CallsRequest req;
  AddStart(req, "after", "fake::echo", "served");
  std::string bytes;
  REQUIRE(req.SerializeToString(&bytes));
  REQUIRE(stream->Write(Bytes(bytes)));
  REQUIRE(stream->WritesDone());
  std::string value;
  while (stream->Read(&raw)) {
    const CallsResponse got = Parse<CallsResponse>(raw);
    for (const auto& e : got.events()) {
      if (e.has_result()) value = e.result().value();
    }
  }
  REQUIRE(stream->Finish().ok());
  REQUIRE(value == "served");
}

TEST_CASE("An unparseable Logs, Traces or Namespace message ends that stream "
          "with INVALID_ARGUMENT",
          "[sandbox]") {
  Harness h;
  for (const char* method : {"/agentix.runtime.v1.RuntimeService/Logs",
                             "/agentix.runtime.v1.RuntimeService/Traces",
                             "/agentix.runtime.v1.RuntimeService/Namespace"}) {
    INFO(method);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(20));
    auto stream = RawStream(h, method, &ctx);
    REQUIRE(stream->Write(Bytes(kGarbage)));
    grpc::ByteBuffer raw;
    while (stream->Read(&raw)) {
    }
    grpc::Status status = stream->Finish();
    REQUIRE(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    REQUIRE(status.error_message().find("unparseable") != std::string::npos);
  }
  // The daemon keeps serving.
  grpc::ClientContext ctx;
  runtime::v1::GetInfoResponse info;
  REQUIRE(h.stub->GetInfo(&ctx, runtime::v1::GetInfoRequest(), &info).ok());
  REQUIRE(info.status() == "ok");
}

TEST_CASE("Calls multiplexes a batch of calls on one stream", "[sandbox]") {
  Harness h;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto stream = h.stub->Calls(&ctx);
  CallsRequest req;
  AddStart(req, "a", "fake::echo", "one");
  AddStart(req, "b", "fake::sleep", "50");
  AddStart(req, "c", "fake::error", "");
  REQUIRE(stream->Write(req));
  // Half-close: the stream must still deliver every result, then finish OK.
  REQUIRE(stream->WritesDone());
  std::map<std::string, runtime::v1::SandboxEvent> terminal;
  CallsResponse resp;
  while (stream->Read(&resp)) {
    for (const auto& e : resp.events()) {
      if (e.has_result()) terminal[e.result().call_id()] = e;
      if (e.has_error()) terminal[e.error().call_id()] = e;
    }
  }
  grpc::Status status = stream->Finish();
  REQUIRE(status.ok());
  REQUIRE(terminal.size() == 3);
  REQUIRE(terminal["a"].result().value() == "one");
  REQUIRE(terminal["b"].result().value() == "done");
  REQUIRE(terminal["c"].error().error().type() == "ValueError");
  REQUIRE(terminal["c"].error().error().traceback() == "fake traceback");
}

TEST_CASE("An exception's class and state are forwarded, the state bounded",
          "[sandbox]") {
  Harness h;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto stream = h.stub->Calls(&ctx);
  CallsRequest req;
  AddStart(req, "small", "fake::error_state", "100");
  AddStart(req, "big", "fake::error_state", std::to_string(64 * 1024 + 1));
  REQUIRE(stream->Write(req));
  REQUIRE(stream->WritesDone());
  std::map<std::string, runtime::v1::RemoteError> errors;
  CallsResponse resp;
  while (stream->Read(&resp)) {
    for (const auto& e : resp.events()) {
      if (e.has_error()) errors[e.error().call_id()] = e.error().error();
    }
  }
  REQUIRE(stream->Finish().ok());
  REQUIRE(errors.size() == 2);
  REQUIRE(errors["small"].type_module() == "builtins");
  REQUIRE(errors["small"].type_qualname() == "ValueError");
  REQUIRE(errors["small"].state() == std::string(100, 's'));
  // Over the bound: the error goes through without its state.
  REQUIRE(errors["big"].type() == "ValueError");
  REQUIRE(errors["big"].type_qualname() == "ValueError");
  REQUIRE(errors["big"].state().empty());
}

TEST_CASE("A stream that goes away leaves its call retained for resume",
          "[sandbox]") {
  Harness h;
  {
    grpc::ClientContext ctx;
    auto stream = h.stub->Calls(&ctx);
    CallsRequest req;
    AddStart(req, "r", "fake::sleep", "100");
    REQUIRE(stream->Write(req));
    ctx.TryCancel();
    stream->Finish();
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto stream = h.stub->Calls(&ctx);
  CallsRequest req;
  req.add_events()->mutable_resume()->add_call_ids("r");
  REQUIRE(stream->Write(req));
  REQUIRE(stream->WritesDone());
  CallsResponse resp;
  std::string value;
  while (stream->Read(&resp)) {
    for (const auto& e : resp.events()) {
      if (e.has_result()) value = e.result().value();
    }
  }
  REQUIRE(stream->Finish().ok());
  REQUIRE(value == "done");
}

TEST_CASE("Logs delivers worker log records, buffered before subscribing",
          "[sandbox]") {
  Harness h;
  // A call logs before anyone listens on Logs.
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(20));
    auto calls = h.stub->Calls(&ctx);
    CallsRequest req;
    AddStart(req, "l1", "fake::log", "first");
    AddStart(req, "l2", "fake::log", "second");
    REQUIRE(calls->Write(req));
    REQUIRE(calls->WritesDone());
    CallsResponse resp;
    while (calls->Read(&resp)) {
    }
    REQUIRE(calls->Finish().ok());
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto logs = h.stub->Logs(&ctx);
  runtime::v1::LogsRequest subscribe;
  subscribe.mutable_subscribe()->set_after_seq(0);
  REQUIRE(logs->Write(subscribe));
  std::vector<runtime::v1::LogRecord> got;
  runtime::v1::LogsResponse resp;
  while (got.size() < 2 && logs->Read(&resp)) {
    for (const auto& r : resp.records()) got.push_back(r);
  }
  REQUIRE(got.size() == 2);
  REQUIRE(got[0].message() == "first");
  REQUIRE(got[0].seq() == 1);
  REQUIRE(got[0].logger() == "fake");
  REQUIRE(got[0].level_name() == "WARNING");
  REQUIRE(got[0].call_id() == "l1");
  REQUIRE(got[0].worker_id().size() == 8);
  REQUIRE(got[1].message() == "second");
  REQUIRE(got[1].seq() == 2);
  runtime::v1::LogsRequest ack;
  ack.mutable_ack()->set_seq(2);
  REQUIRE(logs->Write(ack));
  REQUIRE(logs->WritesDone());
  while (logs->Read(&resp)) {
  }
  REQUIRE(logs->Finish().ok());
  REQUIRE(h.manager.logs().buffered() == 0);
}

// Runs `callable` with `args` on its own Calls stream until it finishes.
void RunCall(Harness& h, const std::string& callable, const std::string& args) {
  static int calls_made = 0;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto calls = h.stub->Calls(&ctx);
  CallsRequest req;
  AddStart(req, "run-" + std::to_string(++calls_made), callable, args);
  REQUIRE(calls->Write(req));
  REQUIRE(calls->WritesDone());
  CallsResponse resp;
  while (calls->Read(&resp)) {
  }
  REQUIRE(calls->Finish().ok());
}

// A Logs stream on `ctx` (given a 60 s deadline) subscribed after seq 1, the
// worker's start record: what it then gets is what the test's calls log.
std::unique_ptr<grpc::ClientReaderWriter<runtime::v1::LogsRequest,
                                         runtime::v1::LogsResponse>>
SubscribeLogsAfterStart(Harness& h, grpc::ClientContext& ctx) {
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto logs = h.stub->Logs(&ctx);
  runtime::v1::LogsRequest subscribe;
  subscribe.mutable_subscribe()->set_after_seq(1);
  REQUIRE(logs->Write(subscribe));
  return logs;
}

// The burst the paused-host tests log: 4,000 records of 10 KiB (40 MiB, far
// past kSideChannelMaxUnwrittenBytes and what gRPC's flow control takes in;
// within the 10,000-record buffer).
constexpr int kBurstRecords = 4000;
constexpr int kBurstPad = 10 << 10;
static_assert(size_t{kBurstRecords} * kBurstPad >
              4 * kSideChannelMaxUnwrittenBytes);

// Has the worker log the burst, in one call.
void LogBurst(Harness& h) {
  RunCall(h, "fake::logs", std::to_string(kBurstRecords) + ":0:" +
                               std::to_string(kBurstPad));
}

TEST_CASE("A burst of log records is coalesced into few Logs messages",
          "[sandbox]") {
  Harness h;
  RunCall(h, "fake::log", "worker started");  // the worker is up
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto logs = h.stub->Logs(&ctx);
  runtime::v1::LogsRequest subscribe;
  subscribe.mutable_subscribe()->set_after_seq(1);
  REQUIRE(logs->Write(subscribe));
  // 2,000 records, one worker write every 50 µs: sent one message per
  // record while the stream is free, they would reach the host in about as
  // many messages.
  constexpr int kRecords = 2000;
  std::vector<std::string> got;
  int messages = 0;
  runtime::v1::LogsResponse resp;
  // Read while the burst runs, as a host does.
  const auto start = std::chrono::steady_clock::now();
  std::thread reader([&] {
    while (got.size() < kRecords && logs->Read(&resp)) {
      ++messages;
      for (const auto& r : resp.records()) got.push_back(r.message());
    }
  });
  RunCall(h, "fake::logs", std::to_string(kRecords) + ":50");
  reader.join();
  const auto burst_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - start)
                            .count();
  // Every record, in order: the last ones of the burst, held back for
  // coalescing, are written when the delay is over.
  REQUIRE(got.size() == kRecords);
  for (int i = 0; i < kRecords; ++i) REQUIRE(got[i] == std::to_string(i));
  // At most one message per coalescing delay of the burst, plus the first
  // one, which goes out at once (the records are far below the size that
  // goes out regardless).
  INFO("messages: " << messages << " in " << burst_ms << " ms");
  CHECK(messages <= burst_ms / kSideChannelCoalesceDelay.count() + 2);
  // While the burst goes on the delay grows (4, 8, then 16 ms): well under
  // one message per 4 ms (a fixed 4 ms gives about burst_ms / 4). The bound
  // leaves room for a loaded machine: a producer stalled for longer than the
  // delay is a quiet moment that starts the growth again (ASan at load ~10
  // gave 41 messages in ~275 ms). batching_writer_test pins the growth
  // itself without timing.
  CHECK(messages <= burst_ms / 6 + 4);
  // A lone record after a quiet moment is delivered as well.
  RunCall(h, "fake::log", "lone");
  REQUIRE(logs->Read(&resp));
  REQUIRE(resp.records_size() == 1);
  REQUIRE(resp.records(0).message() == "lone");
  ctx.TryCancel();
  logs->Finish();
}

TEST_CASE("A Logs subscriber that falls behind is paused, not ended: it "
          "gets every record of a burst the buffer holds, each once",
          "[sandbox]") {
  Harness h;
  RunCall(h, "fake::log", "worker started");  // the worker is up
  grpc::ClientContext ctx;
  auto logs = SubscribeLogsAfterStart(h, ctx);
  // The burst (kBurstRecords) while this host reads nothing. The daemon used
  // to end such a stream with RESOURCE_EXHAUSTED and drop what it held for it.
  constexpr int kRecords = kBurstRecords;
  LogBurst(h);
  std::vector<uint64_t> seqs;
  std::vector<std::string> got;
  runtime::v1::LogsResponse resp;
  while (got.size() < kRecords && logs->Read(&resp)) {
    for (const auto& r : resp.records()) {
      seqs.push_back(r.seq());
      got.push_back(r.message().substr(0, r.message().find(' ')));
    }
  }
  REQUIRE(got.size() == kRecords);
  for (int i = 0; i < kRecords; ++i) REQUIRE(got[i] == std::to_string(i));
  for (size_t i = 1; i < seqs.size(); ++i) REQUIRE(seqs[i] == seqs[i - 1] + 1);
  // The stream is still open: a later record arrives on it.
  runtime::v1::LogsRequest ack;
  ack.mutable_ack()->set_seq(seqs.back());
  REQUIRE(logs->Write(ack));
  RunCall(h, "fake::log", "after");
  REQUIRE(logs->Read(&resp));
  REQUIRE(resp.records_size() == 1);
  REQUIRE(resp.records(0).message() == "after");
  REQUIRE(h.manager.logs().dropped_total() == 0);
  REQUIRE(logs->WritesDone());
  while (logs->Read(&resp)) {
  }
  REQUIRE(logs->Finish().ok());
}

// Reads `logs` until it has `n` records (or the stream ends), acking each
// message; returns their messages' first words.
std::vector<std::string> ReadRecords(
    grpc::ClientReaderWriter<runtime::v1::LogsRequest,
                             runtime::v1::LogsResponse>& logs,
    size_t n, std::vector<uint64_t>* seqs = nullptr) {
  std::vector<std::string> got;
  runtime::v1::LogsResponse resp;
  while (got.size() < n && logs.Read(&resp)) {
    for (const auto& r : resp.records()) {
      if (seqs != nullptr) seqs->push_back(r.seq());
      got.push_back(r.message().substr(0, r.message().find(' ')));
    }
    if (resp.records_size() > 0) {
      runtime::v1::LogsRequest ack;
      ack.mutable_ack()->set_seq(resp.records(resp.records_size() - 1).seq());
      logs.Write(ack);
    }
  }
  return got;
}

TEST_CASE("A host reading its Logs stream while another is paused gets "
          "every record; its acks free nothing the paused one still needs",
          "[sandbox]") {
  Harness h;
  RunCall(h, "fake::log", "worker started");  // the worker is up
  grpc::ClientContext paused_ctx;
  grpc::ClientContext reading_ctx;
  auto paused = SubscribeLogsAfterStart(h, paused_ctx);
  auto reading = SubscribeLogsAfterStart(h, reading_ctx);
  // 40 MiB in 4,000 records: the host that reads nothing meanwhile is
  // paused (kSideChannelMaxUnwrittenBytes); the other reads and acks all.
  constexpr int kRecords = kBurstRecords;
  std::vector<std::string> read_by_reader;
  std::thread reader(
      [&] { read_by_reader = ReadRecords(*reading, kRecords); });
  LogBurst(h);
  reader.join();
  REQUIRE(read_by_reader.size() == kRecords);
  // The paused host now reads: every record, once, in order, none dropped.
  std::vector<uint64_t> seqs;
  const std::vector<std::string> got = ReadRecords(*paused, kRecords, &seqs);
  REQUIRE(got.size() == kRecords);
  for (int i = 0; i < kRecords; ++i) {
    REQUIRE(got[i] == std::to_string(i));
    REQUIRE(read_by_reader[i] == std::to_string(i));
  }
  for (size_t i = 1; i < seqs.size(); ++i) REQUIRE(seqs[i] == seqs[i - 1] + 1);
  REQUIRE(h.manager.logs().dropped_total() == 0);
  // Both acked everything: the buffer frees it (acks arrive in order, the
  // paused host's last).
  for (int i = 0; i < 200 && h.manager.logs().buffered() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE(h.manager.logs().buffered() == 0);
  for (auto* logs : {paused.get(), reading.get()}) {
    REQUIRE(logs->WritesDone());
    runtime::v1::LogsResponse resp;
    while (logs->Read(&resp)) {
    }
    REQUIRE(logs->Finish().ok());
  }
}

TEST_CASE("A paused Logs host that goes away frees its subscriber place and "
          "what the buffer held for it",
          "[sandbox]") {
  Harness h;
  RunCall(h, "fake::log", "worker started");  // the worker is up
  h.manager.logs().SetMaxSubscribers(1);
  auto gone_ctx = std::make_unique<grpc::ClientContext>();
  auto gone = SubscribeLogsAfterStart(h, *gone_ctx);
  constexpr int kRecords = kBurstRecords;
  LogBurst(h);
  // It read nothing: paused, holding the records. It goes away.
  gone_ctx->TryCancel();
  REQUIRE(gone->Finish().error_code() == grpc::StatusCode::CANCELLED);
  gone.reset();
  // The daemon ends its stream soon after: the one place is free again (a
  // subscribe before that is refused, and retried here).
  std::unique_ptr<grpc::ClientContext> ctx;
  std::unique_ptr<grpc::ClientReaderWriter<runtime::v1::LogsRequest,
                                           runtime::v1::LogsResponse>>
      logs;
  std::vector<uint64_t> seqs;
  std::vector<std::string> got;
  for (int attempt = 0; attempt < 100; ++attempt) {
    ctx = std::make_unique<grpc::ClientContext>();
    logs = SubscribeLogsAfterStart(h, *ctx);
    got = ReadRecords(*logs, kRecords, &seqs);
    if (!got.empty()) break;
    const grpc::Status refused = logs->Finish();
    REQUIRE(refused.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE(got.size() == kRecords);
  for (int i = 0; i < kRecords; ++i) REQUIRE(got[i] == std::to_string(i));
  // Nothing is kept for the host that went away once this one acked all.
  for (int i = 0; i < 200 && h.manager.logs().buffered() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE(h.manager.logs().buffered() == 0);
  REQUIRE(logs->WritesDone());
  runtime::v1::LogsResponse resp;
  while (logs->Read(&resp)) {
  }
  REQUIRE(logs->Finish().ok());
}

SessionOptions WithPausedSubscriberTimeout(absl::Duration timeout) {
  SessionOptions options = FakeWorkerSessionOptions();
  options.paused_subscriber_timeout = timeout;
  return options;
}

TEST_CASE("A paused Logs host that reads nothing for the paused-subscriber "
          "timeout is ended with RESOURCE_EXHAUSTED and its place freed; "
          "its next stream gets every record it had not",
          "[sandbox]") {
  Harness h(WithPausedSubscriberTimeout(absl::Milliseconds(300)));
  RunCall(h, "fake::log", "worker started");  // the worker is up
  h.manager.logs().SetMaxSubscribers(1);
  grpc::ClientContext stuck_ctx;
  auto stuck = SubscribeLogsAfterStart(h, stuck_ctx);
  constexpr int kRecords = kBurstRecords;
  LogBurst(h);
  // It reads nothing, its connection stays: once the timeout has passed
  // the one subscriber place is free for another stream (a subscribe
  // before that is refused, and retried here).
  grpc::Status refused;
  bool fitted = false;
  for (int attempt = 0; attempt < 200 && !fitted; ++attempt) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(60));
    auto other = h.stub->Logs(&ctx);
    runtime::v1::LogsRequest fresh;
    fresh.mutable_subscribe()->set_after_seq(kRecords + 10);  // nothing old
    REQUIRE(other->Write(fresh));
    REQUIRE(other->WritesDone());
    runtime::v1::LogsResponse resp;
    while (other->Read(&resp)) {
    }
    refused = other->Finish();
    if (refused.ok()) {
      fitted = true;
    } else {
      REQUIRE(refused.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  REQUIRE(fitted);
  // The host reads again: what the daemon had written is there, then the
  // stream's end, typed, saying what happened and what to do.
  std::vector<uint64_t> seqs;
  std::vector<std::string> got;
  runtime::v1::LogsResponse resp;
  while (stuck->Read(&resp)) {
    for (const auto& r : resp.records()) {
      seqs.push_back(r.seq());
      got.push_back(r.message().substr(0, r.message().find(' ')));
    }
  }
  const grpc::Status ended = stuck->Finish();
  REQUIRE(ended.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(ended.error_message().find("--paused-subscriber-timeout-s") !=
        std::string::npos);
  CHECK(ended.error_message().find("subscribe again with after_seq") !=
        std::string::npos);
  REQUIRE(got.size() < kRecords);
  // It re-opens after its last record and gets the rest, each once, in
  // order, and no drop report (the buffer held them all).
  grpc::ClientContext again_ctx;
  again_ctx.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(60));
  auto again = h.stub->Logs(&again_ctx);
  runtime::v1::LogsRequest resume;
  resume.mutable_subscribe()->set_after_seq(seqs.empty() ? 1 : seqs.back());
  REQUIRE(again->Write(resume));
  const size_t before = got.size();
  std::vector<std::string> rest =
      ReadRecords(*again, kRecords - before, &seqs);
  got.insert(got.end(), rest.begin(), rest.end());
  REQUIRE(got.size() == kRecords);
  for (int i = 0; i < kRecords; ++i) REQUIRE(got[i] == std::to_string(i));
  for (size_t i = 1; i < seqs.size(); ++i) REQUIRE(seqs[i] == seqs[i - 1] + 1);
  REQUIRE(again->WritesDone());
  while (again->Read(&resp)) {
    for (const auto& r : resp.records()) {
      CHECK(r.message().find("were dropped") == std::string::npos);
    }
  }
  REQUIRE(again->Finish().ok());
}

TEST_CASE("A Logs host that reads slowly but steadily is not ended by the "
          "paused-subscriber timeout",
          "[sandbox]") {
  // The timeout counts from the last write the host took, not from the
  // pause: this burst keeps the stream paused for longer than the timeout
  // in all, while every message is read well within it. The host reads from
  // before the burst starts (a host that read nothing while a slow burst
  // ran — one call taking over a second under a sanitizer — would rightly
  // be ended).
  Harness h(WithPausedSubscriberTimeout(absl::Seconds(1)));
  RunCall(h, "fake::log", "worker started");  // the worker is up
  grpc::ClientContext ctx;
  auto logs = SubscribeLogsAfterStart(h, ctx);
  constexpr int kRecords = kBurstRecords;
  std::vector<std::string> got;
  const auto start = std::chrono::steady_clock::now();
  std::thread slow_reader([&] {
    runtime::v1::LogsResponse resp;
    while (got.size() < kRecords && logs->Read(&resp)) {
      for (const auto& r : resp.records()) {
        got.push_back(r.message().substr(0, r.message().find(' ')));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  LogBurst(h);
  slow_reader.join();
  REQUIRE(got.size() == kRecords);
  // (Not a timing assertion: the case only tests something if reading took
  // longer than the timeout, which 160-odd messages at 10 ms each do.)
  CHECK(std::chrono::steady_clock::now() - start > std::chrono::seconds(1));
  for (int i = 0; i < kRecords; ++i) REQUIRE(got[i] == std::to_string(i));
  REQUIRE(logs->WritesDone());
  runtime::v1::LogsResponse resp;
  while (logs->Read(&resp)) {
  }
  REQUIRE(logs->Finish().ok());
}

TEST_CASE("GetInfo reports version and worker state", "[sandbox]") {
  Harness h;
  grpc::ClientContext ctx;
  runtime::v1::GetInfoResponse info;
  REQUIRE(h.stub->GetInfo(&ctx, runtime::v1::GetInfoRequest(), &info).ok());
  REQUIRE(info.status() == "ok");
  REQUIRE(info.version() == "test-version");
  REQUIRE(info.worker_pid() == 0);  // no call yet: no worker
}

}  // namespace
}  // namespace agentix::sandbox
