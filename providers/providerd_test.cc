// agentix-providerd in process: the real SandboxController over the fake
// backend and agent (providers/core/testing), served by ProviderServiceImpl
// on a real gRPC server on a unix socket, called through the generated
// stub as any client would.
#include "providers/providerd.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpcpp/generic/generic_stub.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "agentix/provider/v1/provider.grpc.pb.h"
#include "auth/server_auth.h"
#include "base/unique_fd.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "providers/core/errors.h"
#include "providers/core/testing/fake_agent.h"
#include "providers/core/testing/fake_backend.h"
#include "providers/service/provider_service.h"
#include "testing/status_matchers.h"

namespace agentix::providers {
namespace {

using grpc::StatusCode;
namespace health = ::grpc::health::v1;

constexpr char kToken[] = "s3cret-token";

struct HarnessOptions {
  std::string token = kToken;
  ProviderServiceOptions service;
  absl::Duration max_lifetime = absl::Hours(1);
  bool metrics = false;
  bool destroy_on_exit = true;
};

class Harness {
 public:
  explicit Harness(HarnessOptions options = {}) {
    char dir[] = "/tmp/agx-t-XXXXXX";  // short: it is the state dir too
    REQUIRE(::mkdtemp(dir) != nullptr);
    dir_ = dir;
    socket_ = dir_ + "/pd.sock";
    Start(options);
  }
  ~Harness() {
    providerd_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  void Start(const HarnessOptions& options) {
    ProviderdConfig config;
    config.listen = {absl::StrCat("unix://", socket_)};
    config.state_dir = dir_ + "/st";
    config.controller.instance = "test";
    config.controller.max_lifetime = options.max_lifetime;
    config.controller.default_ttl = absl::Minutes(5);
    config.controller.default_ready_timeout = absl::Seconds(10);
    config.service = options.service;
    config.destroy_on_exit = options.destroy_on_exit;
    if (options.metrics) config.metrics_listen = "127.0.0.1:0";
    auto world = world_;
    config.make_backends = [world, this](const std::string&)
        -> absl::StatusOr<std::vector<std::unique_ptr<Backend>>> {
      std::vector<std::unique_ptr<Backend>> backends;
      auto backend = std::make_unique<testing::FakeBackend>(world);
      backend_ = backend.get();
      backends.push_back(std::move(backend));
      return backends;
    };
    auto agent = agent_;
    config.make_agent = [agent] {
      return std::make_unique<testing::FakeAgent>(agent);
    };
    auth::ServerSecurityOptions security;
    security.token = options.token;
    REQUIRE_OK_AND_ASSIGN(providerd_,
                          Providerd::Start(std::move(config), security));
    REQUIRE(providerd_->addresses() ==
            std::vector<std::string>{absl::StrCat("unix://", socket_)});
    channel_ = grpc::CreateChannel(providerd_->addresses()[0],
                                   grpc::InsecureChannelCredentials());
    stub_ = pb::ProviderService::NewStub(channel_);
  }

  // A context with the token (or `token`), bounded in time.
  std::unique_ptr<grpc::ClientContext> Ctx(
      const std::string& token = kToken,
      absl::Duration deadline = absl::Seconds(10)) {
    auto context = std::make_unique<grpc::ClientContext>();
    if (!token.empty()) {
      context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
    }
    context->set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    return context;
  }

  pb::CreateSandboxResponse Create(const std::string& request_id,
                                   const std::string& label = "a") {
    pb::CreateSandboxRequest request = Request(request_id, label);
    pb::CreateSandboxResponse response;
    auto context = Ctx();
    grpc::Status status = stub_->CreateSandbox(context.get(), request, &response);
    INFO(status.error_message());
    REQUIRE(status.ok());
    return response;
  }

  static pb::CreateSandboxRequest Request(const std::string& request_id,
                                          const std::string& label = "a") {
    pb::CreateSandboxRequest request;
    request.set_request_id(request_id);
    request.mutable_spec()->set_image("host");
    request.mutable_spec()->mutable_bundle()->set_path("/opt/bundle");
    (*request.mutable_labels())["team"] = label;
    return request;
  }

  std::string dir_;
  std::string socket_;
  std::shared_ptr<testing::FakeWorld> world_ =
      std::make_shared<testing::FakeWorld>();
  std::shared_ptr<testing::FakeAgentState> agent_ =
      std::make_shared<testing::FakeAgentState>();
  testing::FakeBackend* backend_ = nullptr;
  std::unique_ptr<Providerd> providerd_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::ProviderService::Stub> stub_;
};

std::string Trailer(const grpc::ClientContext& context, const std::string& key) {
  const auto& md = context.GetServerTrailingMetadata();
  auto it = md.find(key);
  return it == md.end() ? std::string()
                        : std::string(it->second.data(), it->second.size());
}

TEST_CASE("create, get, list, delete through the gRPC service", "[providerd]") {
  Harness h;
  pb::CreateSandboxResponse created = h.Create("req-1", "a");
  const pb::Sandbox& sandbox = created.sandbox();
  CHECK(sandbox.status().phase() == pb::SandboxStatus::READY);
  CHECK_FALSE(sandbox.id().empty());
  CHECK_FALSE(created.credentials().access_token().empty());
  CHECK_FALSE(created.replayed());
  CHECK(h.world_->live() == 1);

  // A replay returns the same sandbox and token.
  pb::CreateSandboxResponse again = h.Create("req-1", "a");
  CHECK(again.replayed());
  CHECK(again.sandbox().id() == sandbox.id());
  CHECK(again.credentials().access_token() == created.credentials().access_token());
  CHECK(h.world_->live() == 1);

  h.Create("req-2", "b");
  {
    pb::GetSandboxRequest request;
    request.set_id(sandbox.id());
    pb::Sandbox got;
    auto context = h.Ctx();
    REQUIRE(h.stub_->GetSandbox(context.get(), request, &got).ok());
    CHECK(got.id() == sandbox.id());
    CHECK(got.labels().at("team") == "a");
    pb::Credentials credentials;
    auto context2 = h.Ctx();
    REQUIRE(h.stub_->GetSandboxCredentials(context2.get(), request, &credentials)
                .ok());
    CHECK(credentials.access_token() == created.credentials().access_token());
  }
  {
    pb::ListSandboxesRequest request;
    request.set_label_selector("team=a");
    pb::ListSandboxesResponse listed;
    auto context = h.Ctx();
    REQUIRE(h.stub_->ListSandboxes(context.get(), request, &listed).ok());
    REQUIRE(listed.sandboxes_size() == 1);
    CHECK(listed.sandboxes(0).id() == sandbox.id());
    CHECK(listed.resource_version() > 0);
    CHECK_FALSE(listed.epoch().empty());
  }
  {
    pb::DeleteSandboxRequest request;
    request.set_id(sandbox.id());
    request.set_wait(true);
    pb::DeleteSandboxResponse deleted;
    auto context = h.Ctx();
    grpc::Status status = h.stub_->DeleteSandbox(context.get(), request, &deleted);
    INFO(status.error_message());
    REQUIRE(status.ok());
    CHECK(deleted.sandbox().status().phase() == pb::SandboxStatus::TERMINATED);
    CHECK(deleted.sandbox().status().exit().reason() == pb::Exit::DELETED);
    CHECK(h.world_->live() == 1);
  }
  {
    pb::GetCapabilitiesRequest request;
    pb::Capabilities caps;
    auto context = h.Ctx();
    REQUIRE(h.stub_->GetCapabilities(context.get(), request, &caps).ok());
    REQUIRE(caps.backends_size() == 1);
    CHECK(caps.backends(0).name() == "local");
    CHECK(caps.instance() == "test");
  }
}

TEST_CASE("errors carry their code and reason in the trailing metadata",
          "[providerd]") {
  HarnessOptions options;
  options.max_lifetime = absl::Minutes(10);
  Harness h(options);
  SECTION("unknown sandbox") {
    pb::GetSandboxRequest request;
    request.set_id("no-such-sandbox");
    pb::Sandbox got;
    auto context = h.Ctx();
    grpc::Status status = h.stub_->GetSandbox(context.get(), request, &got);
    CHECK(status.error_code() == StatusCode::NOT_FOUND);
    CHECK(Trailer(*context, kReasonMetadataKey) == kReasonSandboxNotFound);
    pb::DeleteSandboxRequest del;
    del.set_id("no-such-sandbox");
    pb::DeleteSandboxResponse deleted;
    auto context2 = h.Ctx();
    CHECK(h.stub_->DeleteSandbox(context2.get(), del, &deleted).error_code() ==
          StatusCode::NOT_FOUND);
    CHECK(Trailer(*context2, kReasonMetadataKey) == kReasonSandboxNotFound);
  }
  SECTION("unknown pool") {
    pb::GetWarmPoolRequest request;
    request.set_name("no-such-pool");
    pb::WarmPool pool;
    auto context = h.Ctx();
    CHECK(h.stub_->GetWarmPool(context.get(), request, &pool).error_code() ==
          StatusCode::NOT_FOUND);
    CHECK(Trailer(*context, kReasonMetadataKey) == kReasonPoolNotFound);
  }
  SECTION("bad label selector") {
    pb::ListSandboxesRequest request;
    request.set_label_selector("team in (a");
    pb::ListSandboxesResponse listed;
    auto context = h.Ctx();
    CHECK(h.stub_->ListSandboxes(context.get(), request, &listed).error_code() ==
          StatusCode::INVALID_ARGUMENT);
    CHECK(Trailer(*context, kReasonMetadataKey) == kReasonInvalidSelector);
  }
  SECTION("request id reused with another payload") {
    h.Create("req-x", "a");
    pb::CreateSandboxRequest other = Harness::Request("req-x", "other");
    pb::CreateSandboxResponse response;
    auto context = h.Ctx();
    CHECK(h.stub_->CreateSandbox(context.get(), other, &response).error_code() ==
          StatusCode::INVALID_ARGUMENT);
    CHECK(Trailer(*context, kReasonMetadataKey) == kReasonRequestIdReused);
    CHECK(h.world_->live() == 1);
  }
  SECTION("ttl above the maximum lifetime") {
    pb::CreateSandboxRequest request = Harness::Request("req-ttl");
    request.mutable_spec()->mutable_ttl()->set_seconds(3600);
    pb::CreateSandboxResponse response;
    auto context = h.Ctx();
    CHECK(h.stub_->CreateSandbox(context.get(), request, &response).error_code() ==
          StatusCode::INVALID_ARGUMENT);
    CHECK(Trailer(*context, kReasonMetadataKey) == kReasonTtlTooLong);
    CHECK(h.world_->live() == 0);
  }
  SECTION("unauthenticated callers reach nothing, health included") {
    for (const std::string token : {"", "wrong-token"}) {
      pb::ListSandboxesRequest request;
      pb::ListSandboxesResponse listed;
      auto context = h.Ctx(token);
      grpc::Status status = h.stub_->ListSandboxes(context.get(), request, &listed);
      CHECK(status.error_code() == StatusCode::UNAUTHENTICATED);
      CHECK(Trailer(*context, kReasonMetadataKey) == kReasonUnauthenticated);
      CHECK(listed.sandboxes_size() == 0);
      auto health_stub = health::Health::NewStub(h.channel_);
      health::HealthCheckRequest check;
      health::HealthCheckResponse answer;
      auto context2 = h.Ctx(token);
      CHECK(health_stub->Check(context2.get(), check, &answer).error_code() ==
            StatusCode::UNAUTHENTICATED);
      pb::CreateSandboxResponse response;
      auto context3 = h.Ctx(token);
      CHECK(h.stub_->CreateSandbox(context3.get(), Harness::Request("req-u"),
                                   &response)
                .error_code() == StatusCode::UNAUTHENTICATED);
    }
    CHECK(h.world_->launches() == 0);
  }
}

TEST_CASE("every ProviderService method refuses a caller without the token",
          "[providerd]") {
  Harness h;
  const google::protobuf::ServiceDescriptor* service =
      pb::Sandbox::descriptor()->file()->FindServiceByName("ProviderService");
  REQUIRE(service != nullptr);
  REQUIRE(service->method_count() == 15);
  grpc::GenericStub generic(h.channel_);
  for (int i = 0; i < service->method_count(); ++i) {
    const std::string method =
        absl::StrCat("/", service->full_name(), "/", service->method(i)->name());
    INFO(method);
    for (const std::string token : {"", "wrong"}) {
      auto context = h.Ctx(token);
      grpc::Slice empty("");  // an empty message parses as any request
      grpc::ByteBuffer request(&empty, 1);
      grpc::ByteBuffer response;
      absl::Notification done;
      grpc::Status status;
      generic.UnaryCall(context.get(), method, grpc::StubOptions(), &request,
                        &response, [&](grpc::Status s) {
                          status = std::move(s);
                          done.Notify();
                        });
      REQUIRE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
      CHECK(status.error_code() == StatusCode::UNAUTHENTICATED);
      CHECK(Trailer(*context, kReasonMetadataKey) == kReasonUnauthenticated);
    }
  }
  CHECK(h.world_->launches() == 0);
}

TEST_CASE("health reports the service SERVING", "[providerd]") {
  Harness h;
  auto health_stub = health::Health::NewStub(h.channel_);
  for (const char* service : {"", "agentix.provider.v1.ProviderService"}) {
    health::HealthCheckRequest check;
    check.set_service(service);
    health::HealthCheckResponse answer;
    auto context = h.Ctx();
    REQUIRE(health_stub->Check(context.get(), check, &answer).ok());
    CHECK(answer.status() == health::HealthCheckResponse::SERVING);
  }
}

TEST_CASE("x-idempotency-key stands in for an empty request_id",
          "[providerd]") {
  Harness h;
  auto create = [&](const std::string& key) {
    pb::CreateSandboxRequest request = Harness::Request("");
    auto context = h.Ctx();
    if (!key.empty()) context->AddMetadata(kIdempotencyKeyMetadataKey, key);
    pb::CreateSandboxResponse response;
    grpc::Status status = h.stub_->CreateSandbox(context.get(), request, &response);
    return std::make_pair(status, response);
  };
  auto [first_status, first] = create("key-1");
  REQUIRE(first_status.ok());
  CHECK_FALSE(first.replayed());
  CHECK(first.sandbox().request_id() == "key-1");
  auto [second_status, second] = create("key-1");
  REQUIRE(second_status.ok());
  CHECK(second.replayed());
  CHECK(second.sandbox().id() == first.sandbox().id());
  CHECK(h.world_->live() == 1);
  // Neither: refused, nothing made.
  auto [none_status, none] = create("");
  CHECK(none_status.error_code() == StatusCode::INVALID_ARGUMENT);
  CHECK(h.world_->live() == 1);
}

TEST_CASE("a create whose caller gave up goes on, and a retry collects it",
          "[providerd]") {
  Harness h;
  testing::FakeConfig slow;
  slow.ready_after = absl::Milliseconds(700);
  h.world_->set_config(slow);
  pb::CreateSandboxResponse response;
  auto context = h.Ctx(kToken, absl::Milliseconds(150));
  CHECK(h.stub_->CreateSandbox(context.get(), Harness::Request("req-slow"),
                               &response)
            .error_code() == StatusCode::DEADLINE_EXCEEDED);
  // The controller's callback arrives after the call was cancelled.
  absl::SleepFor(absl::Seconds(1));
  pb::CreateSandboxResponse retried = h.Create("req-slow");
  CHECK(retried.replayed());
  CHECK(retried.sandbox().status().phase() == pb::SandboxStatus::READY);
  CHECK(h.world_->launches() == 1);
}

TEST_CASE("watch streams changes; cancel ends it; the server keeps serving",
          "[providerd]") {
  Harness h;
  pb::ListSandboxesRequest list;
  pb::ListSandboxesResponse listed;
  {
    auto context = h.Ctx();
    REQUIRE(h.stub_->ListSandboxes(context.get(), list, &listed).ok());
  }
  for (int round = 0; round < 3; ++round) {
    pb::WatchSandboxesRequest request;
    request.set_resource_version(listed.resource_version());
    request.set_epoch(listed.epoch());
    auto context = h.Ctx();
    auto reader = h.stub_->WatchSandboxes(context.get(), request);
    pb::CreateSandboxResponse created = h.Create(absl::StrCat("req-w", round));
    pb::SandboxEvent event;
    bool saw_ready = false;
    int64_t last_rv = listed.resource_version();
    while (!saw_ready && reader->Read(&event)) {
      CHECK(event.resource_version() > last_rv);
      last_rv = event.resource_version();
      if (event.sandbox().id() == created.sandbox().id() &&
          event.sandbox().status().phase() == pb::SandboxStatus::READY) {
        saw_ready = true;
      }
      CHECK(event.sandbox().id() == created.sandbox().id());
    }
    CHECK(saw_ready);
    listed.set_resource_version(last_rv);
    context->TryCancel();
    while (reader->Read(&event)) {
    }
    CHECK(reader->Finish().error_code() == StatusCode::CANCELLED);
  }
  // Watching from another epoch: OUT_OF_RANGE, relist.
  pb::WatchSandboxesRequest stale;
  stale.set_resource_version(1);
  stale.set_epoch("not-the-epoch");
  auto context = h.Ctx();
  auto reader = h.stub_->WatchSandboxes(context.get(), stale);
  pb::SandboxEvent event;
  CHECK_FALSE(reader->Read(&event));
  CHECK(reader->Finish().error_code() == StatusCode::OUT_OF_RANGE);
  CHECK(Trailer(*context, kReasonMetadataKey) == kReasonWatchExpired);
}

TEST_CASE("logs stream from an offset and end", "[providerd]") {
  Harness h;
  pb::CreateSandboxResponse created = h.Create("req-log");
  pb::StreamSandboxLogsRequest request;
  request.set_id(created.sandbox().id());
  request.set_offset(4);
  auto context = h.Ctx();
  auto reader = h.stub_->StreamSandboxLogs(context.get(), request);
  std::string text;
  pb::LogChunk chunk;
  int64_t expected_offset = 4;
  while (reader->Read(&chunk)) {
    CHECK(chunk.offset() == expected_offset);
    expected_offset += static_cast<int64_t>(chunk.data().size());
    text += chunk.data();
  }
  REQUIRE(reader->Finish().ok());
  CHECK(text == absl::StrCat("strap of ", created.sandbox().id(), " starting\n"));
  CHECK(h.providerd_->controller() != nullptr);
  // Unknown sandbox: NOT_FOUND with its reason.
  request.set_id("nope");
  auto context2 = h.Ctx();
  auto reader2 = h.stub_->StreamSandboxLogs(context2.get(), request);
  while (reader2->Read(&chunk)) {
  }
  CHECK(reader2->Finish().error_code() == StatusCode::NOT_FOUND);
  CHECK(Trailer(*context2, kReasonMetadataKey) == kReasonSandboxNotFound);
}

std::string HttpGet(int port, const std::string& path) {
  base::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr),
                    sizeof(addr)) == 0);
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.1\r\n\r\n");
  ::send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  while (true) {
    pollfd p{fd.get(), POLLIN, 0};
    REQUIRE(::poll(&p, 1, 5000) > 0);
    const ssize_t n = ::recv(fd.get(), buf, sizeof(buf), 0);
    if (n <= 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

TEST_CASE("metrics listener reports sandboxes by phase", "[providerd]") {
  HarnessOptions options;
  options.metrics = true;
  Harness h(options);
  h.Create("req-m");
  const std::string text = HttpGet(h.providerd_->metrics_port(), "/metrics");
  CHECK(text.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(text.find("agentix_providerd_sandboxes{backend=\"local\",phase=\"READY\"} 1\n") !=
        std::string::npos);
  CHECK(text.find("agentix_providerd_create_seconds_count 1\n") !=
        std::string::npos);
  CHECK(HttpGet(h.providerd_->metrics_port(), "/").rfind("HTTP/1.1 404", 0) == 0);
}

TEST_CASE("one providerd per state dir and socket; stop destroys sandboxes",
          "[providerd]") {
  Harness h;
  h.Create("req-s1");
  h.Create("req-s2");
  CHECK(h.world_->live() == 2);
  // A second providerd on the same state directory is refused.
  ProviderdConfig config;
  config.listen = {absl::StrCat("unix://", h.dir_, "/other.sock")};
  config.state_dir = h.dir_ + "/st";
  config.make_backends = [](const std::string&) {
    return absl::StatusOr<std::vector<std::unique_ptr<Backend>>>(
        std::vector<std::unique_ptr<Backend>>());
  };
  auto refused = Providerd::Start(config, {});
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::filesystem::exists(h.socket_));
  // The running one still serves.
  h.Create("req-s3");
  h.providerd_->Stop();
  CHECK(h.world_->live() == 0);
  CHECK_FALSE(std::filesystem::exists(h.socket_));
}

TEST_CASE("byte sizes and defaults", "[providerd]") {
  CHECK(*ParseByteSize("1024") == 1024);
  CHECK(*ParseByteSize("64k") == 64 << 10);
  CHECK(*ParseByteSize("16M") == 16 << 20);
  CHECK(*ParseByteSize("2g") == int64_t{2} << 30);
  CHECK(*ParseByteSize("2GiB") == int64_t{2} << 30);
  CHECK(*ParseByteSize("0") == 0);
  for (const char* bad : {"", "g", "-1", "1.5g", "12q", "99999999999t"}) {
    INFO(bad);
    CHECK(ParseByteSize(bad).status().code() ==
          absl::StatusCode::kInvalidArgument);
  }
  CHECK(DefaultStateDir().size() <= kMaxStateDirBytes);
  CHECK(absl::EndsWith(DefaultSocketPath(), "/providerd.sock"));
}

}  // namespace
}  // namespace agentix::providers
