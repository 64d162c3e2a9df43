#include "sandbox/server_stream.h"

#include <grpcpp/grpcpp.h>

#include <dirent.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "agentix/runtime/v1/runtime.grpc.pb.h"
#include "sandbox/test_server.h"

namespace agentix::sandbox {
namespace {

using runtime::v1::NamespaceRequest;
using runtime::v1::NamespaceResponse;
// Streams parse their own messages: the method is registered raw.
using Service = runtime::v1::RuntimeService::WithRawMethod_Namespace<
    runtime::v1::RuntimeService::WithAsyncMethod_Calls<
        runtime::v1::RuntimeService::WithAsyncMethod_Logs<
            runtime::v1::RuntimeService::WithAsyncMethod_Traces<
                runtime::v1::RuntimeService::WithAsyncMethod_GetInfo<
                    runtime::v1::RuntimeService::Service>>>>>;

struct Counters {
  std::atomic<int> started{0};
  std::atomic<int> cancelled{0};
  std::atomic<int> done{0};
  std::atomic<int> bad{0};
};

// Answers every event with a response naming it; finishes OK when the
// client half-closes.
class EchoStream final
    : public ServerStream<NamespaceRequest, NamespaceResponse> {
 public:
  explicit EchoStream(Counters* counters) : counters_(counters) {}

 private:
  void OnStart() override {
    ++counters_->started;
    StartRead(&request_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {
      if (!finishing_.exchange(true)) Finish(grpc::Status::OK);
      return;
    }
    response_.Clear();
    response_.set_namespace_(request_.event().event());
    StartWrite(&response_);
  }
  void OnBadMessage(const std::string& /*error*/) override {
    ++counters_->bad;
    if (!finishing_.exchange(true)) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad"));
    }
  }
  void OnWriteDone(bool ok) override {
    if (ok) StartRead(&request_);
  }
  void OnCancel() override {
    ++counters_->cancelled;
    if (!finishing_.exchange(true)) Finish(grpc::Status::CANCELLED);
  }
  void OnDone() override {
    ++counters_->done;
    delete this;
  }

  Counters* const counters_;
  NamespaceRequest request_;
  NamespaceResponse response_;
  std::atomic<bool> finishing_{false};
};

void AwaitNext(Service* service, CompletionQueueThread* thread,
               Counters* counters) {
  auto* stream = new EchoStream(counters);
  stream->AwaitCall(
      [service](grpc::ServerContext* context, EchoStream::Stream* s,
                grpc::ServerCompletionQueue* queue, void* tag) {
        service->RequestNamespace(context, s, queue, queue, tag);
      },
      thread,
      [service, thread, counters] { AwaitNext(service, thread, counters); });
}

struct Harness {
  explicit Harness(absl::Duration spin = absl::ZeroDuration())
      : server([this](grpc::ServerBuilder& builder) {
          builder.RegisterService(&service);
        }, spin) {
    AwaitNext(&service, server.reactions(), &counters);
    stub = runtime::v1::RuntimeService::NewStub(server.Channel());
  }
  void Stop() { server.Stop(); }

  Counters counters;
  Service service;
  TestServer server;
  std::unique_ptr<runtime::v1::RuntimeService::Stub> stub;
};

NamespaceRequest Event(const std::string& name) {
  NamespaceRequest request;
  request.mutable_event()->set_event(name);
  return request;
}

bool Eventually(const std::function<bool()>& condition) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

TEST_CASE("A stream reads, writes and finishes after the half-close",
          "[server_stream]") {
  Harness h;
  grpc::ClientContext context;
  auto stream = h.stub->Namespace(&context);
  NamespaceResponse response;
  for (const char* name : {"a", "b", "c"}) {
    REQUIRE(stream->Write(Event(name)));
    REQUIRE(stream->Read(&response));
    CHECK(response.namespace_() == name);
  }
  REQUIRE(stream->WritesDone());
  CHECK_FALSE(stream->Read(&response));
  CHECK(stream->Finish().ok());
  REQUIRE(Eventually([&] { return h.counters.done == 1; }));
  CHECK(h.counters.cancelled == 0);
}

TEST_CASE("Concurrent streams each get their own call", "[server_stream]") {
  Harness h;
  constexpr int kStreams = 8;
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back([&, i] {
      grpc::ClientContext context;
      auto stream = h.stub->Namespace(&context);
      NamespaceResponse response;
      const std::string name = "s" + std::to_string(i);
      if (stream->Write(Event(name)) && stream->Read(&response) &&
          response.namespace_() == name && stream->WritesDone() &&
          !stream->Read(&response) && stream->Finish().ok()) {
        ++ok;
      }
    });
  }
  for (auto& client : clients) client.join();
  CHECK(ok == kStreams);
  REQUIRE(Eventually([&] { return h.counters.done == kStreams; }));
}

// A Namespace stream that has answered one event.
std::unique_ptr<grpc::ClientReaderWriter<NamespaceRequest, NamespaceResponse>>
OpenStream(Harness& h, grpc::ClientContext* context) {
  auto stream = h.stub->Namespace(context);
  NamespaceResponse response;
  REQUIRE(stream->Write(Event("x")));
  REQUIRE(stream->Read(&response));
  return stream;
}

TEST_CASE("A cancelled call gets OnCancel, then OnDone once",
          "[server_stream]") {
  Harness h;
  grpc::ClientContext context;
  auto stream = OpenStream(h, &context);
  NamespaceResponse response;
  context.TryCancel();
  while (stream->Read(&response)) {
  }
  CHECK(stream->Finish().error_code() == grpc::StatusCode::CANCELLED);
  REQUIRE(Eventually([&] { return h.counters.done == 1; }));
  CHECK(h.counters.cancelled == 1);
  h.Stop();
  CHECK(h.counters.done == 1);
}

TEST_CASE("Shutting down ends open streams and frees the awaiting ones",
          "[server_stream]") {
  Harness h;
  grpc::ClientContext context;
  auto stream = OpenStream(h, &context);
  NamespaceResponse response;
  // The open stream is cancelled by the shutdown; the stream awaiting the
  // next call is deleted without a reaction (no OnStart, no OnDone).
  h.Stop();
  CHECK(h.counters.started == 1);
  CHECK(h.counters.done == 1);
  CHECK_FALSE(stream->Read(&response));
}

// On-CPU time so far of this process's threads named `name`.
std::chrono::nanoseconds ThreadCpu(const std::string& name) {
  std::chrono::nanoseconds total{0};
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return total;
  while (dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    const std::string task = std::string("/proc/self/task/") + entry->d_name;
    std::string comm;
    std::ifstream(task + "/comm") >> comm;
    if (comm != name) continue;
    long long ns = 0;
    std::ifstream(task + "/schedstat") >> ns;
    total += std::chrono::nanoseconds(ns);
  }
  ::closedir(dir);
  return total;
}

TEST_CASE("A spinning reaction thread serves streams, stops spinning on an "
          "idle stream and shuts down",
          "[server_stream]") {
  // A long window makes the adaptation measurable: without it every
  // message of a stream paced slower than the window costs a full window
  // of CPU (30 x 25 ms here; with it, about two windows in all).
  Harness h(absl::Milliseconds(25));
  grpc::ClientContext context;
  auto stream = h.stub->Namespace(&context);
  NamespaceResponse response;
  for (int i = 0; i < 20; ++i) {  // back to back
    REQUIRE(stream->Write(Event("fast")));
    REQUIRE(stream->Read(&response));
    CHECK(response.namespace_() == "fast");
  }
  const auto cpu_before = ThreadCpu("test-cq");
  for (int i = 0; i < 30; ++i) {  // paced: each wait is longer than 25 ms
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    REQUIRE(stream->Write(Event("slow")));
    REQUIRE(stream->Read(&response));
    CHECK(response.namespace_() == "slow");
  }
  const auto spent = ThreadCpu("test-cq") - cpu_before;
  INFO("reaction thread CPU over the paced messages: "
       << std::chrono::duration_cast<std::chrono::microseconds>(spent).count()
       << " us");
  CHECK(spent < std::chrono::milliseconds(250));
  REQUIRE(stream->WritesDone());
  CHECK_FALSE(stream->Read(&response));
  CHECK(stream->Finish().ok());
  REQUIRE(Eventually([&] { return h.counters.done == 1; }));
  // Shutting down while the thread may be spinning.
  grpc::ClientContext open_context;
  auto open = OpenStream(h, &open_context);
  const auto stop_start = std::chrono::steady_clock::now();
  h.Stop();
  CHECK(std::chrono::steady_clock::now() - stop_start <
        std::chrono::seconds(5));
  CHECK(h.counters.done == 2);
  CHECK_FALSE(open->Read(&response));
}

}  // namespace
}  // namespace agentix::sandbox
