#include "sandbox/health_service.h"

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>

#include "sandbox/test_server.h"

namespace agentix::sandbox {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

struct Harness {
  Harness()
      : health({"pkg.Service"}), server([this](grpc::ServerBuilder& builder) {
          health.AddTo(builder);
        }) {
    health.Start(server.reactions());
    stub = Health::NewStub(server.Channel());
  }
  grpc::Status Check(const std::string& service, HealthCheckResponse* reply) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    HealthCheckRequest request;
    request.set_service(service);
    return stub->Check(&context, request, reply);
  }
  // Opens a Watch of `service` and reads its first reply into `reply`.
  std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> Watch(
      grpc::ClientContext* context, const std::string& service,
      HealthCheckResponse* reply) {
    context->set_deadline(std::chrono::system_clock::now() +
                          std::chrono::seconds(10));
    HealthCheckRequest request;
    request.set_service(service);
    auto reader = stub->Watch(context, request);
    REQUIRE(reader->Read(reply));
    return reader;
  }
  HealthService health;
  TestServer server;
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
  HealthCheckResponse reply;
  auto reader = h.Watch(&context, "pkg.Service", &reply);
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
  HealthCheckResponse reply;
  auto reader = h.Watch(&context, "no.Such", &reply);
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
    HealthCheckResponse reply;
    auto reader = h.Watch(&context, "", &reply);
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
