// The agentix-providerd binary itself: its ready line and --ready-fd, the
// socket's mode, the token on health and reflection (which grpc++ 1.51
// serves as grpc.reflection.v1alpha), one instance per socket, SIGTERM, and
// flag errors. (Sandboxes need bubblewrap and a bundle: testing/e2e.)
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/child_process.h"
#include "base/unique_fd.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "testing/status_matchers.h"

namespace agentix::providers {
namespace {

constexpr char kBinary[] = "providers/agentix-providerd";

struct Pipe {
  base::UniqueFd read, write;
  Pipe() {
    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    read.Reset(fds[0]);
    write.Reset(fds[1]);
  }
};

// Reads until `want` bytes or EOF, at most `limit`.
std::string ReadFor(int fd, size_t want, absl::Duration limit) {
  std::string out;
  const absl::Time end = absl::Now() + limit;
  char buf[512];
  while (out.size() < want) {
    const int64_t ms = absl::ToInt64Milliseconds(end - absl::Now());
    pollfd p{fd, POLLIN, 0};
    if (ms <= 0 || ::poll(&p, 1, static_cast<int>(ms)) <= 0) break;
    const ssize_t n = ::read(fd, buf, std::min(sizeof(buf), want - out.size()));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

struct Running {
  std::string dir;
  base::ChildProcess child;
  Pipe out, err;

  base::ChildProcess Spawn(std::vector<std::string> args, Pipe* ready = nullptr) {
    base::SpawnOptions options;
    options.path = kBinary;
    options.argv = {kBinary};
    options.argv.insert(options.argv.end(), args.begin(), args.end());
    options.env = {"PATH=/usr/bin:/bin"};
    options.fd_map = {{out.write.get(), 1}, {err.write.get(), 2}};
    if (ready != nullptr) options.fd_map.push_back({ready->write.get(), 3});
    auto spawned = base::ChildProcess::Spawn(options);
    REQUIRE(spawned.ok());
    return std::move(*spawned);
  }
};

std::string MakeDir() {
  char tmp[] = "/tmp/agx-b-XXXXXX";
  REQUIRE(::mkdtemp(tmp) != nullptr);
  return tmp;
}

std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token) {
  auto context = std::make_unique<grpc::ClientContext>();
  if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return context;
}

// ServerReflectionInfo(list_services: "*") over v1alpha, as raw bytes: the
// reflection protos are not installed for C++. The answer names services.
grpc::Status ListServices(const std::shared_ptr<grpc::Channel>& channel,
                          const std::string& token, std::string* answer) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  auto context = Ctx(token);
  auto call = stub.PrepareCall(
      context.get(), "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
      &cq);
  auto next = [&cq] {
    void* tag;
    bool ok = false;
    REQUIRE(cq.AsyncNext(&tag, &ok, std::chrono::system_clock::now() +
                                        std::chrono::seconds(10)) ==
            grpc::CompletionQueue::GOT_EVENT);
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  next();
  const std::string request = "\x3a\x01*";  // field 7 (list_services) = "*"
  grpc::Slice slice(request);
  grpc::ByteBuffer buffer(&slice, 1);
  call->Write(buffer, reinterpret_cast<void*>(2));
  next();
  call->WritesDone(reinterpret_cast<void*>(3));
  next();
  grpc::ByteBuffer response;
  call->Read(&response, reinterpret_cast<void*>(4));
  if (next()) {
    std::vector<grpc::Slice> slices;
    REQUIRE(response.Dump(&slices).ok());
    for (const auto& s : slices) {
      answer->append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  next();
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

TEST_CASE("agentix-providerd serves, says so, guards every RPC, stops cleanly",
          "[providerd][binary]") {
  const std::string dir = MakeDir();
  const std::string socket = dir + "/pd.sock";
  const std::string token_file = dir + "/token";
  std::ofstream(token_file) << "bin-token\n";
  REQUIRE(::chmod(token_file.c_str(), 0600) == 0);
  Running r;
  Pipe ready;
  r.child = r.Spawn({"--listen", "unix://" + socket, "--state-dir", dir + "/s",
                     "--token-file", token_file, "--ready-fd", "3"},
                    &ready);
  ready.write.Reset();
  r.out.write.Reset();
  r.err.write.Reset();
  CHECK(ReadFor(ready.read.get(), 1, absl::Seconds(20)) == "1");
  const std::string line = absl::StrCat("agentix-providerd serving on unix://", socket, "\n");
  CHECK(ReadFor(r.out.read.get(), line.size(), absl::Seconds(5)) == line);
  struct stat st;
  REQUIRE(::stat(socket.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);

  auto channel = grpc::CreateChannel("unix://" + socket, grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckRequest check;
  check.set_service("agentix.provider.v1.ProviderService");
  grpc::health::v1::HealthCheckResponse answer;
  CHECK(health->Check(Ctx("").get(), check, &answer).error_code() ==
        grpc::StatusCode::UNAUTHENTICATED);
  REQUIRE(health->Check(Ctx("bin-token").get(), check, &answer).ok());
  CHECK(answer.status() == grpc::health::v1::HealthCheckResponse::SERVING);
  std::string services;
  CHECK(ListServices(channel, "", &services).error_code() ==
        grpc::StatusCode::UNAUTHENTICATED);
  REQUIRE(ListServices(channel, "bin-token", &services).ok());
  CHECK(services.find("agentix.provider.v1.ProviderService") != std::string::npos);
  CHECK(services.find("grpc.health.v1.Health") != std::string::npos);

  // A second one on the same socket is refused; the first keeps serving.
  Running second;
  second.child = second.Spawn({"--listen", "unix://" + socket, "--state-dir", dir + "/t"});
  second.err.write.Reset();
  second.out.write.Reset();
  REQUIRE_OK_AND_ASSIGN(base::ExitStatus refused, second.child.AwaitExit(absl::Seconds(20)));
  CHECK(refused.exit_code == 2);
  CHECK(ReadFor(second.err.read.get(), 4096, absl::Seconds(2)).find("another agentix-providerd") !=
        std::string::npos);
  REQUIRE(health->Check(Ctx("bin-token").get(), check, &answer).ok());

  ::kill(r.child.pid(), SIGTERM);
  REQUIRE_OK_AND_ASSIGN(base::ExitStatus stopped, r.child.AwaitExit(absl::Seconds(20)));
  CHECK(stopped.exit_code == 0);
  CHECK_FALSE(std::filesystem::exists(socket));
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

TEST_CASE("agentix-providerd refuses bad flags with status 2 and the flag's name",
          "[providerd][binary]") {
  const std::string dir = MakeDir();
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--state-dir", "/tmp/a-state-directory-far-too-long"}, "--state-dir"},
      {{"--state-dir", dir + "/s", "--local-tmp-size", "1q"}, "--local-tmp-size"},
      {{"--state-dir", dir + "/s", "--default-ttl-s", "0"}, "--default-ttl-s"},
      {{"--state-dir", dir + "/s", "--default-ttl-s", "100", "--max-lifetime-s", "10"},
       "--default-ttl-s"},
      {{"--state-dir", dir + "/s", "--token-file", dir + "/missing"}, "--token-file"},
      {{"--state-dir", dir + "/s", "--tls-cert", dir + "/missing"}, "--tls-cert"},
      {{"--state-dir", dir + "/s", "--listen", "unix://relative.sock"}, "--listen"},
  };
  for (const auto& [args, flag] : cases) {
    INFO(args.back());
    Running r;
    std::vector<std::string> argv = args;
    if (flag != "--listen") argv.push_back("--listen=unix://" + dir + "/x.sock");
    r.child = r.Spawn(argv);
    r.out.write.Reset();
    r.err.write.Reset();
    REQUIRE_OK_AND_ASSIGN(base::ExitStatus status, r.child.AwaitExit(absl::Seconds(20)));
    CHECK(status.exit_code == 2);
    CHECK(ReadFor(r.err.read.get(), 8192, absl::Seconds(2)).find(flag) != std::string::npos);
  }
  CHECK_FALSE(std::filesystem::exists(dir + "/x.sock"));
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace agentix::providers
