// ProviderServiceImpl's streaming reactors against a scripted controller
// whose StreamLogs blocks and whose Watch hands the test the observer: the
// paths the real controller (tested in providers/providerd_test.cc) cannot
// provoke on demand — a log reader blocked on a slow client, a client that
// cancels mid-stream, a watch client that stops reading.
#include "providers/service/provider_service.h"

#include <grpcpp/grpcpp.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "providers/core/errors.h"

namespace agentix::providers {
namespace {

using grpc::StatusCode;

class ScriptedController final : public SandboxController {
 public:
  // StreamLogs: 100 KiB pieces while the sink takes them (follow), else one.
  std::atomic<int64_t> log_bytes_taken{0};
  std::atomic<int> log_calls_returned{0};
  // Watch: the current observer, and whether its handle is gone.
  absl::Mutex mu;
  WatchObserver* observer ABSL_GUARDED_BY(mu) = nullptr;
  int unsubscribed ABSL_GUARDED_BY(mu) = 0;

  absl::Status Start() override { return absl::OkStatus(); }
  void Shutdown(bool) override {}
  void CreateSandbox(const pb::CreateSandboxRequest&, std::string,
                     CreateCallback done) override {
    done(absl::UnimplementedError("scripted"));
  }
  absl::StatusOr<pb::Sandbox> GetSandbox(const std::string&) override {
    return absl::UnimplementedError("scripted");
  }
  absl::StatusOr<pb::Credentials> GetCredentials(const std::string&) override {
    return absl::UnimplementedError("scripted");
  }
  absl::StatusOr<pb::ListSandboxesResponse> ListSandboxes(
      const pb::ListSandboxesRequest&) override {
    return absl::UnimplementedError("scripted");
  }
  class Handle final : public WatchHandle {
   public:
    explicit Handle(ScriptedController* c) : c_(c) {}
    ~Handle() override {
      absl::MutexLock lock(&c_->mu);
      c_->observer = nullptr;
      ++c_->unsubscribed;
    }
    ScriptedController* c_;
  };
  absl::StatusOr<std::unique_ptr<WatchHandle>> Watch(
      const pb::WatchSandboxesRequest&, WatchObserver* o) override {
    absl::MutexLock lock(&mu);
    observer = o;
    return std::make_unique<Handle>(this);
  }
  // Delivers an event as the controller's thread would; false when the
  // observer ended the subscription (or there is none).
  bool Deliver(int64_t rv) {
    absl::MutexLock lock(&mu);
    if (observer == nullptr) return false;
    pb::SandboxEvent event;
    event.set_type(pb::SandboxEvent::MODIFIED);
    event.set_resource_version(rv);
    (*event.mutable_sandbox()->mutable_annotations())["pad"] =
        std::string(4096, 'x');
    return observer->OnEvent(event);
  }
  void WaitSandbox(const pb::WaitSandboxRequest&, WaitCallback done) override {
    done(absl::UnimplementedError("scripted"));
  }
  absl::StatusOr<pb::Sandbox> ExtendSandbox(const pb::ExtendSandboxRequest&) override {
    return absl::UnimplementedError("scripted");
  }
  void DeleteSandbox(const pb::DeleteSandboxRequest&, DeleteCallback done) override {
    done(absl::UnimplementedError("scripted"));
  }
  absl::Status StreamLogs(const pb::StreamSandboxLogsRequest& request,
                          LogSink* sink) override {
    const std::string piece(100 << 10, 'l');
    int64_t offset = request.offset();
    do {
      if (!sink->OnLogData(offset, piece, offset == request.offset())) break;
      offset += static_cast<int64_t>(piece.size());
      log_bytes_taken += static_cast<int64_t>(piece.size());
    } while (request.follow());
    ++log_calls_returned;
    return absl::OkStatus();
  }
  absl::StatusOr<pb::WarmPool> CreateWarmPool(const pb::WarmPool&) override {
    return absl::UnimplementedError("scripted");
  }
  absl::StatusOr<pb::WarmPool> UpdateWarmPool(const pb::WarmPool&) override {
    return absl::UnimplementedError("scripted");
  }
  absl::StatusOr<pb::WarmPool> GetWarmPool(const std::string&) override {
    return absl::UnimplementedError("scripted");
  }
  std::vector<pb::WarmPool> ListWarmPools() override { return {}; }
  absl::Status DeleteWarmPool(const std::string&, bool) override {
    return absl::UnimplementedError("scripted");
  }
  pb::Capabilities GetCapabilities() override { return {}; }
  MetricsSnapshot Metrics() override { return {}; }
};

struct Server {
  ScriptedController controller;
  std::unique_ptr<ProviderServiceImpl> service;
  std::unique_ptr<grpc::Server> server;
  std::string dir;
  std::unique_ptr<pb::ProviderService::Stub> stub;

  explicit Server(ProviderServiceOptions options) {
    char tmp[] = "/tmp/agx-ps-XXXXXX";
    REQUIRE(::mkdtemp(tmp) != nullptr);
    dir = tmp;
    service = std::make_unique<ProviderServiceImpl>(&controller, options);
    grpc::ServerBuilder builder;
    const std::string address = absl::StrCat("unix://", dir, "/s.sock");
    builder.AddListeningPort(address, grpc::InsecureServerCredentials());
    builder.RegisterService(service.get());
    server = builder.BuildAndStart();
    REQUIRE(server != nullptr);
    // A small receive window so that a client that does not read holds
    // the server's writes back quickly.
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 1024);
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    stub = pb::ProviderService::NewStub(grpc::CreateCustomChannel(
        address, grpc::InsecureChannelCredentials(), args));
  }
  ~Server() {
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server->Wait();
    service.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

std::unique_ptr<grpc::ClientContext> Ctx() {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  return context;
}

bool Eventually(const std::function<bool()>& done,
                absl::Duration limit = absl::Seconds(5)) {
  const absl::Time end = absl::Now() + limit;
  while (!done()) {
    if (absl::Now() > end) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

TEST_CASE("log chunks keep their offsets and the 64 KiB cap", "[service]") {
  Server s({});
  pb::StreamSandboxLogsRequest request;
  request.set_offset(10);
  auto context = Ctx();
  auto reader = s.stub->StreamSandboxLogs(context.get(), request);
  pb::LogChunk chunk;
  int64_t offset = 10;
  int chunks = 0;
  while (reader->Read(&chunk)) {
    CHECK(chunk.offset() == offset);
    CHECK(chunk.data().size() <= (64u << 10));
    CHECK(chunk.truncated() == (chunks == 0));  // only the first piece says so
    offset += static_cast<int64_t>(chunk.data().size());
    ++chunks;
  }
  CHECK(reader->Finish().ok());
  CHECK(offset == 10 + (100 << 10));
  CHECK(chunks == 2);
  CHECK(Eventually([&] { return s.service->live_log_streams() == 0; }));
}

TEST_CASE("a follow stream is held back by its client and ends on cancel",
          "[service]") {
  ProviderServiceOptions options;
  options.max_log_queue = 4;
  Server s(options);
  pb::StreamSandboxLogsRequest request;
  request.set_follow(true);
  auto context = Ctx();
  auto reader = s.stub->StreamSandboxLogs(context.get(), request);
  pb::LogChunk chunk;
  REQUIRE(reader->Read(&chunk));
  // The client reads no more: the log thread must stall, not buffer.
  absl::SleepFor(absl::Milliseconds(300));
  const int64_t stalled = s.controller.log_bytes_taken.load();
  absl::SleepFor(absl::Milliseconds(300));
  CHECK(s.controller.log_bytes_taken.load() == stalled);
  CHECK(stalled < (8 << 20));  // queue (4 x 64 KiB) plus transport buffers
  CHECK(s.service->live_log_streams() == 1);
  context->TryCancel();
  while (reader->Read(&chunk)) {
  }
  CHECK(reader->Finish().error_code() == StatusCode::CANCELLED);
  // The blocked controller call returns (its sink said stop) and the thread
  // is gone.
  CHECK(Eventually([&] { return s.controller.log_calls_returned.load() == 1; }));
  CHECK(Eventually([&] { return s.service->live_log_streams() == 0; }));
}

TEST_CASE("log streams beyond the cap are refused with a reason", "[service]") {
  ProviderServiceOptions options;
  options.max_log_streams = 1;
  Server s(options);
  pb::StreamSandboxLogsRequest follow;
  follow.set_follow(true);
  auto context = Ctx();
  auto reader = s.stub->StreamSandboxLogs(context.get(), follow);
  pb::LogChunk chunk;
  REQUIRE(reader->Read(&chunk));
  auto context2 = Ctx();
  auto reader2 = s.stub->StreamSandboxLogs(context2.get(), follow);
  CHECK_FALSE(reader2->Read(&chunk));
  CHECK(reader2->Finish().error_code() == StatusCode::RESOURCE_EXHAUSTED);
  const auto& md = context2->GetServerTrailingMetadata();
  REQUIRE(md.count(kReasonMetadataKey) == 1);
  CHECK(md.find(kReasonMetadataKey)->second == kReasonTooManyLogStreams);
  context->TryCancel();
  while (reader->Read(&chunk)) {
  }
  reader->Finish();
  CHECK(Eventually([&] { return s.service->live_log_streams() == 0; }));
}

TEST_CASE("a watch client that stops reading is ended; memory stays bounded",
          "[service]") {
  ProviderServiceOptions options;
  options.max_watch_queue = 8;
  Server s(options);
  pb::WatchSandboxesRequest request;
  auto context = Ctx();
  auto reader = s.stub->WatchSandboxes(context.get(), request);
  REQUIRE(Eventually([&] {
    absl::MutexLock lock(&s.controller.mu);
    return s.controller.observer != nullptr;
  }));
  // 4 KiB events into a client that reads nothing: the transport takes a
  // little, then the queue fills and the observer says stop.
  int delivered = 0;
  while (s.controller.Deliver(delivered + 1)) {
    ++delivered;
    REQUIRE(delivered < 5000);
    absl::SleepFor(absl::Microseconds(200));  // let writes complete
  }
  pb::SandboxEvent event;
  int read = 0;
  while (reader->Read(&event)) {
    CHECK(event.resource_version() == read + 1);  // in order, no gap
    ++read;
  }
  CHECK(reader->Finish().error_code() == StatusCode::RESOURCE_EXHAUSTED);
  const auto& md = context->GetServerTrailingMetadata();
  REQUIRE(md.count(kReasonMetadataKey) == 1);
  CHECK(md.find(kReasonMetadataKey)->second == kReasonWatchClientTooSlow);
  CHECK(read <= delivered);
  CHECK(Eventually([&] {
    absl::MutexLock lock(&s.controller.mu);
    return s.controller.unsubscribed == 1;
  }));
}

TEST_CASE("watch cancel: Finish(CANCELLED), unsubscribed, no event after",
          "[service]") {
  Server s({});
  pb::WatchSandboxesRequest request;
  auto context = Ctx();
  auto reader = s.stub->WatchSandboxes(context.get(), request);
  REQUIRE(Eventually([&] {
    absl::MutexLock lock(&s.controller.mu);
    return s.controller.observer != nullptr;
  }));
  REQUIRE(s.controller.Deliver(1));
  pb::SandboxEvent event;
  REQUIRE(reader->Read(&event));
  CHECK(event.resource_version() == 1);
  context->TryCancel();
  while (reader->Read(&event)) {
  }
  CHECK(reader->Finish().error_code() == StatusCode::CANCELLED);
  CHECK(Eventually([&] {
    absl::MutexLock lock(&s.controller.mu);
    return s.controller.unsubscribed == 1;
  }));
  CHECK_FALSE(s.controller.Deliver(2));
}

TEST_CASE("a status becomes code, message and reason metadata", "[service]") {
  grpc::ServerContext context;
  absl::Status status = WithRetryAfter(
      ProviderError(absl::StatusCode::kResourceExhausted, kReasonPoolMiss,
                    "pool empty"),
      absl::Milliseconds(250));
  grpc::Status out = FinishStatus(&context, status);
  CHECK(out.error_code() == StatusCode::RESOURCE_EXHAUSTED);
  CHECK(out.error_message() == "pool empty");
  CHECK(FinishStatus(&context, absl::OkStatus()).ok());
}

}  // namespace
}  // namespace agentix::providers
