#include "sandbox/health_service.h"

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>

#include "sandbox/server_stream.h"

namespace agentix::sandbox {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

struct Harness {
  Harness() : health({"pkg.Service"}) {
    grpc::ServerBuilder builder;
    health.AddTo(builder);
    cq = builder.AddCompletionQueue();
    server = builder.BuildAndStart();
    reactions = std::make_unique<CompletionQueueThread>(cq.get(), "test-cq");
    health.Start(reactions.get());
    stub = Health::NewStub(server->InProcessChannel(grpc::ChannelArguments()));
  }
  ~Harness() {
    server->Shutdown(std::chrono::system_clock::now() +
                     std::chrono::seconds(2));
    reactions->Stop();
  }
  grpc::Status Check(const std::string& service, HealthCheckResponse* reply) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    HealthCheckRequest request;
    request.set_service(service);
    return stub->Check(&context, request, reply);
  }
  HealthService health;
  std::unique_ptr<grpc::ServerCompletionQueue> cq;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<CompletionQueueThread> reactions;
  std::unique_ptr<Health::Stub> stub;
};

TEST_CASE("Check reports the server and its services as serving", "[health]") {
  Harness h;
  HealthCheckResponse reply;
  REQUIRE(h.Check("", &reply).ok());
  CHECK(reply.status() == HealthCheckResponse::SERVING);
  REQUIRE(h.Check("pkg.Service", &reply).ok());
  CHECK(reply.status() == HealthCheckResponse::SERVING);
}

TEST_CASE("Check of an unknown service is NOT_FOUND", "[health]") {
  Harness h;
  HealthCheckResponse reply;
  grpc::Status status = h.Check("no.Such", &reply);
  CHECK(status.error_code() == grpc::StatusCode::NOT_FOUND);
  CHECK(status.error_message().find("no.Such") != std::string::npos);
}

TEST_CASE("Check after Shutdown reports NOT_SERVING", "[health]") {
  Harness h;
  h.health.Shutdown();
  HealthCheckResponse reply;
  REQUIRE(h.Check("pkg.Service", &reply).ok());
  CHECK(reply.status() == HealthCheckResponse::NOT_SERVING);
}

TEST_CASE("Watch sends the status, then the change at Shutdown, then ends",
          "[health]") {
  Harness h;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  HealthCheckRequest request;
  request.set_service("pkg.Service");
  auto reader = h.stub->Watch(&context, request);
  HealthCheckResponse reply;
  REQUIRE(reader->Read(&reply));
  CHECK(reply.status() == HealthCheckResponse::SERVING);
  h.health.Shutdown();
  REQUIRE(reader->Read(&reply));
  CHECK(reply.status() == HealthCheckResponse::NOT_SERVING);
  CHECK_FALSE(reader->Read(&reply));
  CHECK(reader->Finish().ok());
}

TEST_CASE("Watch of an unknown service reports SERVICE_UNKNOWN", "[health]") {
  Harness h;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  HealthCheckRequest request;
  request.set_service("no.Such");
  auto reader = h.stub->Watch(&context, request);
  HealthCheckResponse reply;
  REQUIRE(reader->Read(&reply));
  CHECK(reply.status() == HealthCheckResponse::SERVICE_UNKNOWN);
  context.TryCancel();
  while (reader->Read(&reply)) {
  }
  CHECK(reader->Finish().error_code() == grpc::StatusCode::CANCELLED);
}

TEST_CASE("A watcher that goes away leaves the service serving others",
          "[health]") {
  Harness h;
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext context;
    HealthCheckRequest request;
    auto reader = h.stub->Watch(&context, request);
    HealthCheckResponse reply;
    REQUIRE(reader->Read(&reply));
    context.TryCancel();
    while (reader->Read(&reply)) {
    }
  }
  HealthCheckResponse reply;
  REQUIRE(h.Check("", &reply).ok());
  CHECK(reply.status() == HealthCheckResponse::SERVING);
}

}  // namespace
}  // namespace agentix::sandbox
