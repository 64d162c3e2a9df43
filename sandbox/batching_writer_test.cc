#include "sandbox/batching_writer.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agentix/runtime/v1/runtime.grpc.pb.h"
#include "sandbox/log_buffer.h"
#include "sandbox/test_server.h"
#include "wire/wire_limits.h"

namespace agentix::sandbox {
namespace {

using runtime::v1::LogRecord;
using runtime::v1::LogsRequest;
using runtime::v1::LogsResponse;
using Service = runtime::v1::RuntimeService::WithRawMethod_Logs<
    runtime::v1::RuntimeService::Service>;

struct Records : RepeatedMessageField<Records> {
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

// The reactions the test streams share: a Logs call whose completions go
// to the writer `W` the stream owns (shared: producer threads hold it too).
template <typename W>
class WriterStream : public ServerStream<LogsRequest, LogsResponse> {
 protected:
  explicit WriterStream(LogsResponse header = LogsResponse())
      : writer_(std::make_shared<W>(this, std::move(header))) {}

  // Awaits the next Logs call on `thread`; `on_accepted` as AwaitCall's.
  // Last in the derived constructor: the call may start at once.
  void AwaitLogs(Service* service, CompletionQueueThread* thread,
                 std::function<void()> on_accepted) {
    AwaitCall(
        [service](grpc::ServerContext* context, Stream* s,
                  grpc::ServerCompletionQueue* queue, void* tag) {
          service->RequestLogs(context, s, queue, queue, tag);
        },
        thread, std::move(on_accepted));
  }

  void OnBadMessage(const std::string&) override {
    writer_->Fail(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad"));
  }
  void OnWriteDone(bool ok) override { writer_->OnWriteDone(ok); }
  void OnCancel() override { writer_->OnCancel(); }
  void OnDone() override {
    writer_->Detach();
    delete this;
  }

  const std::shared_ptr<W> writer_;
  LogsRequest request_;
};

// Checks one message a default client read (no receive limit raised): it
// fits that client's 4 MiB limit, framing included. Returns its wire size.
size_t CheckFitsDefaultClient(const LogsResponse& response) {
  const size_t wire = response.ByteSizeLong() + kGrpcFramePrefixBytes;
  CHECK(wire <= kDefaultClientMessageLimit);
  return wire;
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
class BacklogStream final : public WriterStream<Writer> {
 public:
  BacklogStream(Service* service, CompletionQueueThread* thread)
      : WriterStream(Header()) {
    AwaitLogs(service, thread,
              [service, thread] { new BacklogStream(service, thread); });
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
      writer_->OnReadsDone();
      return;
    }
    std::vector<Writer::ItemPtr> items;
    uint64_t seq = 0;
    for (size_t size : Sizes()) items.push_back(Record(++seq, size));
    writer_->Enqueue(std::move(items));
    StartRead(&request_);
  }
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
    largest = std::max(largest, CheckFitsDefaultClient(response));
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

// A record tagged with its producer (logger) and that producer's sequence.
std::shared_ptr<const LogRecord> Tagged(const char* producer, uint64_t seq,
                                        size_t size) {
  auto record = std::make_shared<LogRecord>();
  record->set_logger(producer);
  record->set_seq(seq);
  record->set_message(std::string(size, 'z'));
  return record;
}

// A writer whose half-closed stream also waits for its producer thread.
class ProducerWriter final : public Writer {
 public:
  using Writer::Writer;
  std::atomic<bool> producer_done{false};

 private:
  bool ReadyToFinish() override { return producer_done.load(); }
};

constexpr uint64_t kProducerItems = 3000;
constexpr uint64_t kHostRequests = 400;

// The Calls stream's situation: the worker-reader thread (here `producer_`)
// starts writes on the stream directly while the reaction thread writes
// too (answers to the host's events, here two records per request). Every
// 97th producer record and every 61st reaction record is large, so batches
// hit the message cap from both threads.
class TwoWriterStream final : public WriterStream<ProducerWriter> {
 public:
  TwoWriterStream(Service* service, CompletionQueueThread* thread,
                  std::thread* producer)
      : WriterStream(Header()), producer_(producer) {
    AwaitLogs(service, thread, nullptr);
  }

 private:
  static LogsResponse Header() {
    LogsResponse header;
    header.set_instance_id("two-writers");
    return header;
  }
  void OnStart() override {
    *producer_ = std::thread([writer = writer_] {
      for (uint64_t seq = 1; seq <= kProducerItems; ++seq) {
        const size_t size = seq % 97 == 0 ? 1500000 : 40;
        if (!writer->Enqueue({Tagged("reader", seq, size)})) return;
      }
      writer->producer_done = true;
      // Any write's completion re-checks whether the stream may finish.
      writer->Enqueue({Tagged("end", 1, 1)});
    });
    StartRead(&request_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {
      writer_->OnReadsDone();
      return;
    }
    std::vector<Writer::ItemPtr> items;
    for (int i = 0; i < 2; ++i) {
      ++reaction_seq_;
      items.push_back(Tagged("reaction", reaction_seq_,
                             reaction_seq_ % 61 == 0 ? 2500000 : 30));
    }
    writer_->Enqueue(std::move(items));
    StartRead(&request_);
  }

  std::thread* const producer_;
  uint64_t reaction_seq_ = 0;  // reaction thread only
};

TEST_CASE("Writes started by another thread and by the reaction thread on "
          "one stream deliver every item once, in order, within the cap",
          "[batching_writer][concurrency]") {
  Service service;
  TestServer server(
      [&](grpc::ServerBuilder& builder) { builder.RegisterService(&service); },
      absl::ZeroDuration(), TestSocketPath("bw-two"));
  std::thread producer;
  new TwoWriterStream(&service, server.reactions(), &producer);
  auto stub = runtime::v1::RuntimeService::NewStub(server.SocketChannel());
  grpc::ClientContext context;
  auto stream = stub->Logs(&context);
  std::thread host([&] {
    LogsRequest request;
    request.mutable_ack()->set_seq(1);
    for (uint64_t i = 0; i < kHostRequests; ++i) {
      if (!stream->Write(request)) return;
    }
    stream->WritesDone();
  });
  std::map<std::string, uint64_t> last;  // producer -> last seq seen
  bool in_order = true;
  size_t largest = 0;
  LogsResponse response;
  while (stream->Read(&response)) {
    largest = std::max(largest, CheckFitsDefaultClient(response));
    CHECK(response.instance_id() == "two-writers");
    for (const LogRecord& record : response.records()) {
      uint64_t& seen = last[record.logger()];
      if (record.seq() != seen + 1) in_order = false;
      seen = record.seq();
    }
  }
  host.join();
  const grpc::Status status = stream->Finish();
  if (producer.joinable()) producer.join();
  INFO(status.error_message());
  CHECK(status.ok());
  CHECK(in_order);
  CHECK(last["reader"] == kProducerItems);
  CHECK(last["reaction"] == 2 * kHostRequests);
  CHECK(last["end"] == 1);
  CHECK(largest > (3u << 20));
}

struct CancelCounters {
  std::atomic<int> cancelled{0};
  std::atomic<int> done{0};
  std::atomic<int> writes_done{0};
  std::atomic<int> accepted{0};
  std::atomic<bool> refused{false};
};

// On the subscribe, a producer thread enqueues the same 1 MiB record over
// and over (shared, so the backlog costs no memory) until the writer
// refuses; the host does not read, so a write stays in flight.
class FloodStream final : public WriterStream<Writer> {
 public:
  FloodStream(Service* service, CompletionQueueThread* thread,
              CancelCounters* counters, std::thread* producer)
      : counters_(counters), producer_(producer) {
    AwaitLogs(service, thread, nullptr);
  }

 private:
  void OnStart() override { StartRead(&request_); }
  void OnReadDone(bool ok) override {
    if (!ok || started_) return;  // no more reads: the cancel ends it
    started_ = true;
    *producer_ = std::thread([writer = writer_, counters = counters_] {
      auto record = Tagged("flood", 1, 1u << 20);
      const auto give_up =
          std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (std::chrono::steady_clock::now() < give_up) {
        if (!writer->Enqueue({record})) {
          counters->refused = true;
          return;
        }
        ++counters->accepted;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
  }
  void OnWriteDone(bool ok) override {
    ++counters_->writes_done;
    WriterStream::OnWriteDone(ok);
  }
  void OnCancel() override {
    ++counters_->cancelled;
    WriterStream::OnCancel();
  }
  void OnDone() override {
    ++counters_->done;
    WriterStream::OnDone();  // deletes this
  }

  CancelCounters* const counters_;
  std::thread* const producer_;
  bool started_ = false;
};

TEST_CASE("A stream cancelled while another thread's write is in flight "
          "ends once and refuses later items",
          "[batching_writer][concurrency]") {
  Service service;
  TestServer server(
      [&](grpc::ServerBuilder& builder) { builder.RegisterService(&service); },
      absl::ZeroDuration(), TestSocketPath("bw-cancel"));
  CancelCounters counters;
  std::thread producer;
  new FloodStream(&service, server.reactions(), &counters, &producer);
  auto stub = runtime::v1::RuntimeService::NewStub(server.SocketChannel());
  grpc::ClientContext context;
  auto stream = stub->Logs(&context);
  LogsRequest subscribe;
  subscribe.mutable_subscribe();
  REQUIRE(stream->Write(subscribe));
  LogsResponse response;
  REQUIRE(stream->Read(&response));  // writes flow; now stop reading
  CHECK(response.records_size() >= 1);
  // Flow control soon holds a write in flight (the host's window fills):
  // no write completes for a while although the producer's items pile up.
  bool held = false;
  for (int i = 0; i < 50 && !held; ++i) {
    const int accepted = counters.accepted.load();
    const int writes_done = counters.writes_done.load();
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    held = counters.writes_done.load() == writes_done &&
           counters.accepted.load() > accepted;
  }
  REQUIRE(held);
  context.TryCancel();
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while ((counters.done.load() == 0 || !counters.refused.load()) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  CHECK(counters.refused.load());
  CHECK(counters.cancelled == 1);
  CHECK(counters.done == 1);
  if (producer.joinable()) producer.join();
  while (stream->Read(&response)) {
  }
  CHECK(stream->Finish().error_code() == grpc::StatusCode::CANCELLED);
  server.Stop();
  CHECK(counters.done == 1);
}

// Coalescing with a flush timer the test fires (or leaves late) itself: the
// writer and the times its flushes were asked for reach the test thread.
struct CoalescingProbe {
  std::promise<std::shared_ptr<Writer>> writer;
  std::mutex mu;
  std::vector<Writer::Clock::time_point> flushes;  // guarded by mu
  size_t Flushes() {
    std::lock_guard<std::mutex> lock(mu);
    return flushes.size();
  }
  // Waits (bounded) for the writer to ask for its `n`th flush: a record
  // queued behind a write still in flight is held when that write is done.
  bool AwaitFlushes(size_t n) {
    const auto give_up =
        std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (Flushes() < n) {
      if (std::chrono::steady_clock::now() > give_up) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return Flushes() == n;
  }
  Writer::Clock::time_point LastFlush() {
    std::lock_guard<std::mutex> lock(mu);
    return flushes.back();
  }
};

constexpr auto kTestDelay = std::chrono::milliseconds(100);
constexpr auto kTestMaxDelay = std::chrono::milliseconds(400);

class CoalescingStream final : public WriterStream<Writer> {
 public:
  CoalescingStream(Service* service, CompletionQueueThread* thread,
                   CoalescingProbe* probe)
      : probe_(probe) {
    writer_->SetCoalescing(
        {kTestDelay, 1u << 20,
         [probe](Writer::Clock::time_point when) {
           std::lock_guard<std::mutex> lock(probe->mu);
           probe->flushes.push_back(when);
         },
         kTestMaxDelay});
    AwaitLogs(service, thread, nullptr);
  }

 private:
  void OnStart() override {
    probe_->writer.set_value(writer_);
    StartRead(&request_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {
      writer_->OnReadsDone();
      return;
    }
    StartRead(&request_);
  }

  CoalescingProbe* const probe_;
};

TEST_CASE("A burst's coalescing delay grows while items wait, also when "
          "their flush runs late, and a quiet moment resets it",
          "[batching_writer][coalescing]") {
  Service service;
  TestServer server(
      [&](grpc::ServerBuilder& builder) { builder.RegisterService(&service); },
      absl::ZeroDuration(), TestSocketPath("bw-coalesce"));
  CoalescingProbe probe;
  new CoalescingStream(&service, server.reactions(), &probe);
  auto stub = runtime::v1::RuntimeService::NewStub(server.SocketChannel());
  grpc::ClientContext context;
  auto stream = stub->Logs(&context);
  REQUIRE(stream->Write(LogsRequest()));
  auto future = probe.writer.get_future();
  REQUIRE(future.wait_for(std::chrono::seconds(10)) ==
          std::future_status::ready);
  std::shared_ptr<Writer> writer = future.get();
  uint64_t seq = 0;
  LogsResponse response;
  // Reads one message; returns its records' seqs.
  auto read = [&] {
    std::vector<uint64_t> seqs;
    REQUIRE(stream->Read(&response));
    for (const LogRecord& record : response.records()) {
      seqs.push_back(record.seq());
    }
    return seqs;
  };
  auto sleep_past = [](Writer::Clock::time_point when) {
    std::this_thread::sleep_until(when + std::chrono::milliseconds(5));
  };

  // The first record finds nothing written yet: it goes at once.
  REQUIRE(writer->Enqueue({Record(++seq, 10)}));
  CHECK(read() == std::vector<uint64_t>{1});
  // The next, right after, waits for a flush one delay after that write.
  REQUIRE(writer->Enqueue({Record(++seq, 10)}));
  REQUIRE(probe.AwaitFlushes(1));
  // The flush is late (never fired here): a record after its time joins
  // the waiting one, and the burst's delay grows as if the flush had run.
  sleep_past(probe.LastFlush());
  REQUIRE(writer->Enqueue({Record(++seq, 10)}));
  CHECK(read() == std::vector<uint64_t>{2, 3});
  CHECK(writer->CoalescingDelay() == 2 * kTestDelay);
  writer->WriteHeldBack();  // the late flush comes at last: nothing to write
  // A flush that runs on time grows it too, up to the maximum.
  for (auto expected : {4 * kTestDelay, kTestMaxDelay}) {
    const size_t flushes = probe.Flushes();
    REQUIRE(writer->Enqueue({Record(++seq, 10)}));
    REQUIRE(probe.AwaitFlushes(flushes + 1));
    sleep_past(probe.LastFlush());
    writer->WriteHeldBack();
    CHECK(read() == std::vector<uint64_t>{seq});
    CHECK(writer->CoalescingDelay() == expected);
  }
  // A record that finds nothing waiting after the delay: a quiet moment.
  std::this_thread::sleep_for(kTestMaxDelay + std::chrono::milliseconds(50));
  REQUIRE(writer->Enqueue({Record(++seq, 10)}));
  CHECK(read() == std::vector<uint64_t>{seq});
  CHECK(writer->CoalescingDelay() == kTestDelay);
  stream->WritesDone();
  CHECK_FALSE(stream->Read(&response));
  CHECK(stream->Finish().ok());
}

// A producer that keeps what the writer refused (as the side channel's
// buffer keeps a paused subscriber's records) and offers it again from
// OnBacklogCleared, on the reaction thread, as SeqBuffer::Resume does.
class RefusingProducer {
 public:
  static constexpr size_t kHighBytes = 1u << 20;
  static constexpr size_t kItemBytes = 64u << 10;
  static constexpr uint64_t kItems = 400;  // 25 MiB

  void Start(std::shared_ptr<Writer> writer) {
    thread_ = std::thread([this, writer = std::move(writer)] {
      for (uint64_t seq = 1; seq <= kItems; ++seq) {
        std::lock_guard<std::mutex> lock(mu_);  // as SeqBuffer's deliver_mu_
        if (ended_) return;
        writer_ = writer;
        pending_.push_back(Tagged("producer", seq, kItemBytes));
        if (!paused_) OfferPending(lock);
      }
    });
  }
  // OnBacklogCleared of the writer (reaction thread, writer lock free).
  void Cleared() {
    std::lock_guard<std::mutex> lock(mu_);
    ++cleared_;
    if (!paused_) {
      ++spurious_;  // only a refused offer asks for this
      return;
    }
    paused_ = false;
    OfferPending(lock);
  }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  int refusals() {
    std::lock_guard<std::mutex> lock(mu_);
    return refusals_;
  }
  int cleared() {
    std::lock_guard<std::mutex> lock(mu_);
    return cleared_;
  }
  int spurious() {
    std::lock_guard<std::mutex> lock(mu_);
    return spurious_;
  }
  size_t most_queued() {
    std::lock_guard<std::mutex> lock(mu_);
    return most_queued_;
  }

 private:
  void OfferPending(std::lock_guard<std::mutex>&) {
    std::vector<Writer::ItemPtr> items(pending_.begin(), pending_.end());
    const size_t offered = items.size() * kItemBytes;
    switch (writer_->Offer(std::move(items), kHighBytes)) {
      case Writer::Offered::kQueued:
        pending_.clear();
        most_queued_ = std::max(most_queued_, writer_->QueuedBytes());
        CHECK(writer_->QueuedBytes() <= kHighBytes + offered + kItemBytes);
        break;
      case Writer::Offered::kBacklogged:
        ++refusals_;
        paused_ = true;
        break;
      case Writer::Offered::kEnded:
        ended_ = true;
        break;
    }
  }

  std::thread thread_;
  std::mutex mu_;
  std::shared_ptr<Writer> writer_;  // guarded by mu_
  std::deque<Writer::ItemPtr> pending_;  // guarded by mu_
  bool paused_ = false;  // guarded by mu_
  bool ended_ = false;  // guarded by mu_
  int refusals_ = 0;  // guarded by mu_
  int cleared_ = 0;  // guarded by mu_
  int spurious_ = 0;  // guarded by mu_
  size_t most_queued_ = 0;  // guarded by mu_
};

class RefusalWriter final : public Writer {
 public:
  RefusalWriter(Reactor* reactor, LogsResponse header)
      : Writer(reactor, std::move(header)) {}
  RefusingProducer* producer = nullptr;  // set before the first Offer

 protected:
  void OnBacklogCleared() override { producer->Cleared(); }
};

class RefusalStream final : public WriterStream<RefusalWriter> {
 public:
  RefusalStream(Service* service, CompletionQueueThread* thread,
                RefusingProducer* producer)
      : producer_(producer) {
    writer_->producer = producer;
    AwaitLogs(service, thread, nullptr);
  }

 private:
  void OnStart() override { StartRead(&request_); }
  void OnReadDone(bool ok) override {
    if (!ok) {
      writer_->OnReadsDone();
      return;
    }
    if (!started_) {
      started_ = true;
      producer_->Start(writer_);
    }
    StartRead(&request_);
  }

  RefusingProducer* const producer_;
  bool started_ = false;
};

TEST_CASE("An offer past the backlog bound is refused without ending the "
          "stream; OnBacklogCleared lets the producer offer it again from "
          "the reaction thread, and every item arrives once, in order",
          "[batching_writer][concurrency]") {
  Service service;
  TestServer server(
      [&](grpc::ServerBuilder& builder) { builder.RegisterService(&service); },
      absl::ZeroDuration(), TestSocketPath("bw-refuse"));
  RefusingProducer producer;
  new RefusalStream(&service, server.reactions(), &producer);
  auto stub = runtime::v1::RuntimeService::NewStub(server.SocketChannel());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(60));
  auto stream = stub->Logs(&context);
  LogsRequest subscribe;
  subscribe.mutable_subscribe();
  REQUIRE(stream->Write(subscribe));
  // Read nothing until the writer has refused an offer (bounded).
  const auto give_up =
      std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (producer.refusals() == 0 &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  REQUIRE(producer.refusals() > 0);
  uint64_t last = 0;
  bool in_order = true;
  LogsResponse response;
  while (last < RefusingProducer::kItems && stream->Read(&response)) {
    for (const LogRecord& record : response.records()) {
      if (record.seq() != last + 1) in_order = false;
      last = record.seq();
    }
  }
  producer.Join();
  CHECK(in_order);
  CHECK(last == RefusingProducer::kItems);
  // Each refusal was followed by exactly one OnBacklogCleared.
  CHECK(producer.cleared() == producer.refusals());
  CHECK(producer.spurious() == 0);
  CHECK(producer.most_queued() > RefusingProducer::kHighBytes);
  stream->WritesDone();
  while (stream->Read(&response)) {
  }
  CHECK(stream->Finish().ok());
}

}  // namespace
}  // namespace agentix::sandbox
