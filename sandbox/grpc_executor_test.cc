#include "sandbox/grpc_executor.h"

#include <dirent.h>
#include <grpc/grpc.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "agentix/runtime/v1/runtime.grpc.pb.h"
#include "sandbox/test_server.h"

namespace agentix::sandbox {
namespace {

using runtime::v1::NamespaceRequest;
using runtime::v1::NamespaceResponse;
using Service = runtime::v1::RuntimeService::WithRawMethod_Namespace<
    runtime::v1::RuntimeService::Service>;

// How many of this process's threads are named `name`.
int ThreadsNamed(const std::string& name) {
  int count = 0;
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  while (dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    std::string comm;
    std::ifstream(std::string("/proc/self/task/") + entry->d_name + "/comm") >>
        comm;
    if (comm == name) ++count;
  }
  ::closedir(dir);
  return count;
}

// Answers each event with its name, from a thread of its own (as the
// daemon's worker-reader thread writes results) while the reaction thread
// reads the next one; finishes after the half-close.
class EchoStream final
    : public ServerStream<NamespaceRequest, NamespaceResponse> {
 public:
  EchoStream(Service* service, CompletionQueueThread* thread) {
    AwaitCall(
        [service](grpc::ServerContext* context, Stream* s,
                  grpc::ServerCompletionQueue* queue, void* tag) {
          service->RequestNamespace(context, s, queue, queue, tag);
        },
        thread, [service, thread] { new EchoStream(service, thread); });
  }

 private:
  void OnStart() override { StartRead(&request_); }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    response_.set_namespace_(request_.event().event());
    std::thread([this] { StartWrite(&response_); }).detach();
  }
  void OnBadMessage(const std::string&) override {
    Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad"));
  }
  void OnWriteDone(bool ok) override {
    if (ok) {
      StartRead(&request_);
    } else {
      Finish(grpc::Status::CANCELLED);
    }
  }
  void OnDone() override { delete this; }

  NamespaceRequest request_;
  NamespaceResponse response_;
};

TEST_CASE("With gRPC's executor inline, no executor thread runs and "
          "concurrent streams on one connection still complete",
          "[grpc_executor]") {
  grpc_init();
  // The check can fail: initialised, gRPC runs its default executor thread.
  // It is started asynchronously (not yet there right after grpc_init under
  // ASan), so wait for it a while.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (ThreadsNamed("default-executo") == 0 &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(ThreadsNamed("default-executo") == 1);
  RunGrpcExecutorInline();
  CHECK(ThreadsNamed("default-executo") == 0);
  {
    Service service;
    TestServer server(
        [&](grpc::ServerBuilder& builder) { builder.RegisterService(&service); },
        absl::ZeroDuration(), TestSocketPath("exec"));
    new EchoStream(&service, server.reactions());
    auto channel = server.SocketChannel();  // one connection for all
    auto stub = runtime::v1::RuntimeService::NewStub(channel);
    constexpr int kStreams = 8;
    constexpr int kRoundTrips = 200;
    std::atomic<int> completed{0};
    std::vector<std::thread> clients;
    for (int c = 0; c < kStreams; ++c) {
      clients.emplace_back([&, c] {
        grpc::ClientContext context;
        auto stream = stub->Namespace(&context);
        NamespaceRequest request;
        NamespaceResponse response;
        for (int i = 0; i < kRoundTrips; ++i) {
          const std::string name = std::to_string(c) + "/" + std::to_string(i);
          request.mutable_event()->set_event(name);
          if (!stream->Write(request) || !stream->Read(&response) ||
              response.namespace_() != name) {
            return;
          }
        }
        if (stream->WritesDone() && !stream->Read(&response) &&
            stream->Finish().ok()) {
          ++completed;
        }
      });
    }
    for (auto& client : clients) client.join();
    CHECK(completed == kStreams);
    CHECK(ThreadsNamed("default-executo") == 0);
    server.Stop();
  }
  grpc_shutdown();
}

}  // namespace
}  // namespace agentix::sandbox
