// The docker/podman backend without an engine: what a user sees when the
// engine's socket is missing, refuses or hangs. The real engines are tested
// end to end in testing/e2e/test_engine_backend.py.
#include "providers/backends/engine/engine_backend.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "absl/time/clock.h"
#include "providers/core/errors.h"

namespace agentix::providers::engine {
namespace {

struct TempDir {
  TempDir() {
    char tmpl[] = "/tmp/agx-eng-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { (void)!std::system(("rm -rf " + path).c_str()); }
  std::string path;
};

// A Unix socket bound at `path`; listening only when asked.
int BoundSocket(const std::string& path, bool listen) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  if (listen) REQUIRE(::listen(fd, 8) == 0);
  return fd;
}

EngineOptions Options(const TempDir& dir) {
  EngineOptions options;
  options.name = "docker";
  options.socket_path = dir.path + "/engine.sock";
  options.run_root = dir.path + "/run";
  options.instance = "test";
  options.request_timeout = absl::Milliseconds(300);
  return options;
}

LaunchSpec Spec(const TempDir& dir) {
  REQUIRE(std::system(("mkdir -p " + dir.path + "/b/nix/runtime && touch " + dir.path +
                       "/b/nix/runtime/bootstrap.sh").c_str()) == 0);
  LaunchSpec spec;
  spec.sandbox_id = "sb-1";
  spec.uid = "u1";
  spec.instance = "test";
  spec.spec.set_image("localhost/img:1");
  spec.spec.mutable_bundle()->set_path(dir.path + "/b");
  return spec;
}

void CheckUnavailable(const absl::Status& status) {
  INFO(status.ToString());
  CHECK(status.code() == absl::StatusCode::kUnavailable);
  CHECK(ReasonOf(status) == kReasonEngineUnavailable);
  CHECK(RetryAfterOf(status).has_value());
  CHECK(status.message().find("docker") != absl::string_view::npos);
}

TEST_CASE("a missing engine socket is UNAVAILABLE and retryable, and Launch leaves nothing") {
  TempDir dir;
  auto backend = NewEngineBackend(Options(dir));
  absl::Status probe = backend->Probe().status();
  CheckUnavailable(probe);
  CHECK(probe.message().find("connect: No such file or directory") != absl::string_view::npos);
  LaunchSpec spec = Spec(dir);
  CheckUnavailable(backend->Validate(spec));
  CheckUnavailable(backend->Launch(spec, absl::Now() + absl::Seconds(5)).status());
  struct stat st;
  CHECK(::stat((dir.path + "/run/sb-1").c_str(), &st) != 0);
  CheckUnavailable(backend->ListOwned("test").status());
  CheckUnavailable(backend->Destroy(BackendRef{"abc"}, absl::Seconds(1)));
}

TEST_CASE("an engine socket nobody listens on (refused) is UNAVAILABLE") {
  TempDir dir;
  int fd = BoundSocket(dir.path + "/engine.sock", /*listen=*/false);
  auto backend = NewEngineBackend(Options(dir));
  absl::Status probe = backend->Probe().status();
  CheckUnavailable(probe);
  CHECK(probe.message().find("connect: Connection refused") != absl::string_view::npos);
  ::close(fd);
}

TEST_CASE("an engine that accepts and never answers times out, bounded") {
  TempDir dir;
  int fd = BoundSocket(dir.path + "/engine.sock", /*listen=*/true);
  auto backend = NewEngineBackend(Options(dir));
  absl::Time start = absl::Now();
  absl::Status status = backend->Probe().status();
  CHECK(status.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(absl::Now() - start < absl::Seconds(3));
  ::close(fd);
}

class CountingSink final : public EventSink {
 public:
  void OnObserved(const BackendRef&, const Observed&) override { ++calls; }
  int calls = 0;
};

TEST_CASE("Shutdown ends a Watch at once, on a hung engine and on a missing one") {
  for (bool engine_present : {true, false}) {
    TempDir dir;
    int fd = engine_present ? BoundSocket(dir.path + "/engine.sock", true) : -1;
    auto backend = NewEngineBackend(Options(dir));
    CountingSink sink;
    REQUIRE(backend->Watch(&sink).ok());
    CHECK(backend->Watch(&sink).code() == absl::StatusCode::kFailedPrecondition);
    absl::SleepFor(absl::Milliseconds(200));  // the watcher is connected (or retrying)
    absl::Time start = absl::Now();
    backend->Shutdown();
    CHECK(absl::Now() - start < absl::Milliseconds(500));
    CHECK(sink.calls == 0);
    if (fd >= 0) ::close(fd);
  }
}

}  // namespace
}  // namespace agentix::providers::engine
