#include "sandbox/batching_writer.h"

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "agentix/runtime/v1/runtime.grpc.pb.h"
#include "sandbox/log_buffer.h"
#include "sandbox/test_server.h"
#include "sandbox/wire_limits.h"

namespace agentix::sandbox {
namespace {

using runtime::v1::LogRecord;
using runtime::v1::LogsRequest;
using runtime::v1::LogsResponse;
using Service = runtime::v1::RuntimeService::WithRawMethod_Logs<
    runtime::v1::RuntimeService::Service>;

struct Records {
  static auto* Get(LogsResponse& r) { return r.mutable_records(); }
};
using Writer = BatchingWriter<LogsRequest, LogsResponse, LogRecord, Records>;

// A record whose message has `size` bytes (so the record a few more).
std::shared_ptr<const LogRecord> Record(uint64_t seq, size_t size) {
  auto record = std::make_shared<LogRecord>();
  record->set_seq(seq);
  record->set_message(std::string(size, 'x'));
  return record;
}

// Sizes that overfill a message under the old "until 4 MiB" rule: records
// just under 1 MiB (five fit 4 MiB of payload but not with their framing),
// small ones between, and one as large as a producer may make an item.
std::vector<size_t> Sizes() {
  std::vector<size_t> sizes;
  for (int i = 0; i < 12; ++i) {
    sizes.push_back(1000000);
    sizes.push_back(100 + i);
    sizes.push_back(838000);
  }
  sizes.push_back(kMaxWireItemBytes - 64);
  for (int i = 0; i < 9; ++i) sizes.push_back(466000);
  return sizes;
}

// On the subscribe, enqueues one record per Sizes() entry in a single
// Enqueue (the backlog a late subscriber finds), then finishes once the
// client half-closes and everything is written.
class BacklogStream final : public ServerStream<LogsRequest, LogsResponse> {
 public:
  explicit BacklogStream(Service* service, CompletionQueueThread* thread)
      : writer_(this, Header()) {
    AwaitCall(
        [service](grpc::ServerContext* context, Stream* s,
                  grpc::ServerCompletionQueue* queue, void* tag) {
          service->RequestLogs(context, s, queue, queue, tag);
        },
        thread, [service, thread] { new BacklogStream(service, thread); });
  }

 private:
  static LogsResponse Header() {
    LogsResponse header;
    header.set_instance_id(std::string(32, 'i'));
    return header;
  }
  void OnStart() override { StartRead(&request_); }
  void OnReadDone(bool ok) override {
    if (!ok) {
      writer_.OnReadsDone();
      return;
    }
    std::vector<Writer::ItemPtr> items;
    uint64_t seq = 0;
    for (size_t size : Sizes()) items.push_back(Record(++seq, size));
    writer_.Enqueue(std::move(items));
    StartRead(&request_);
  }
  void OnBadMessage(const std::string&) override {
    writer_.Fail(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad"));
  }
  void OnWriteDone(bool ok) override { writer_.OnWriteDone(ok); }
  void OnCancel() override { writer_.OnCancel(); }
  void OnDone() override {
    writer_.Detach();
    delete this;
  }

  Writer writer_;
  LogsRequest request_;
};

TEST_CASE("Every message fits a default client's 4 MiB limit, framing "
          "included, and carries the items in order",
          "[batching_writer]") {
  Service service;
  TestServer server(
      [&](grpc::ServerBuilder& builder) { builder.RegisterService(&service); });
  new BacklogStream(&service, server.reactions());
  // A default client: no receive limit raised.
  auto stub = runtime::v1::RuntimeService::NewStub(server.Channel());
  grpc::ClientContext context;
  auto stream = stub->Logs(&context);
  LogsRequest subscribe;
  subscribe.mutable_subscribe();
  REQUIRE(stream->Write(subscribe));
  REQUIRE(stream->WritesDone());
  const std::vector<size_t> sizes = Sizes();
  LogsResponse response;
  uint64_t next_seq = 1;
  size_t messages = 0;
  size_t largest = 0;
  while (stream->Read(&response)) {
    ++messages;
    const size_t wire = response.ByteSizeLong() + kGrpcFramePrefixBytes;
    largest = std::max(largest, wire);
    CHECK(wire <= kDefaultClientMessageLimit);
    CHECK(response.instance_id() == std::string(32, 'i'));
    for (const LogRecord& record : response.records()) {
      REQUIRE(record.seq() == next_seq);
      CHECK(record.message().size() == sizes[next_seq - 1]);
      ++next_seq;
    }
  }
  const grpc::Status status = stream->Finish();
  INFO(status.error_message());
  CHECK(status.ok());
  CHECK(next_seq == sizes.size() + 1);
  // Batching still happens: 34 MiB in about nine messages, not one each.
  CHECK(messages < sizes.size() / 2);
  CHECK(largest > (3u << 20));
}

TEST_CASE("An item's framed size counts its tag and varint length",
          "[batching_writer]") {
  CHECK(FramedItemBytes(0) == 2);
  CHECK(FramedItemBytes(127) == 129);
  CHECK(FramedItemBytes(128) == 131);
  CHECK(FramedItemBytes(1u << 20) == (1u << 20) + 4);
  LogsResponse message;
  for (size_t size : {0u, 5u, 200u, 20000u, 3000000u}) {
    LogRecord* r = message.add_records();
    r->set_message(std::string(size, 'y'));
  }
  size_t sum = 0;
  for (const LogRecord& r : message.records()) {
    sum += FramedItemBytes(r.ByteSizeLong());
  }
  CHECK(sum == message.ByteSizeLong());
}

TEST_CASE("Oversized records and events are cut to one message's item",
          "[batching_writer]") {
  LogRecord sent;  // as the worker sends it (runtime.proto's LogRecord)
  sent.set_logger("big");
  sent.set_message(std::string(10u << 20, 'm'));
  sent.set_exception_text(std::string(3u << 20, 't'));
  sent.set_extras(std::string(2u << 20, '\x01'));
  LogRecord record = ToLogRecord(sent.SerializeAsString(), "w1");
  CHECK(record.ByteSizeLong() <= kMaxWireItemBytes);
  CHECK(record.message().find("[truncated: ") != std::string::npos);
  CHECK(record.logger() == "big");

  runtime::v1::TraceEvent trace;
  trace.set_name(std::string(6u << 20, 'n'));
  TruncateForWire(*trace.mutable_name(), 6u << 20);  // fits: unchanged
  CHECK(trace.name().size() == (6u << 20));
  auto fitted = ToTraceEvent(trace.SerializeAsString(), "w1");
  REQUIRE(fitted.has_value());
  CHECK(fitted->ByteSizeLong() <= kMaxWireItemBytes);

  // Many large events: each is cut, none is dropped.
  runtime::v1::TraceEvent span;
  for (int i = 0; i < 1000; ++i) {
    auto* event = span.add_events();
    event->set_name(std::string(5000, 'e'));
    auto* a = event->add_attributes();
    a->set_key(std::string(300, 'k'));
    a->mutable_value()->set_string_value(std::string(1000, 'v'));
  }
  FitTraceEvent(span);
  CHECK(span.ByteSizeLong() <= kMaxWireItemBytes);
  CHECK(span.events_size() == 1000);
  CHECK(span.events(999).name().size() > 1024);
  CHECK(span.events(999).attributes(0).key().size() == 300);

  // A cut never splits a UTF-8 character.
  std::string text;
  for (int i = 0; i < 100; ++i) text += "\xc3\xa9";  // é
  TruncateForWire(text, 101);
  CHECK(text.find(" ... [truncated: ") == 36);  // 37 would split an é
  CHECK(static_cast<unsigned char>(text[35]) == 0xa9);
  CHECK(text.size() <= 101);
}

}  // namespace
}  // namespace agentix::sandbox
