// The local backend with the real agentix-sandboxd as the entry point (its
// worker starts on the first call, which this test never makes): the
// endpoint serves grpc.health.v1 with the admin token that came through
// the pipe and refuses a call without it; and the cold Launch-to-SERVING
// time on this machine.
#include <grpcpp/grpcpp.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <fstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
#include <dirent.h>
#include <sstream>
#include <thread>
#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "providers/backends/local/local_backend.h"
#include "testing/status_matchers.h"

namespace agentix::providers::local {
namespace {

namespace health = ::grpc::health::v1;

std::string MakeTemp(const std::string& base) {
  std::string path = base + "/lbXXXXXX";
  REQUIRE(mkdtemp(path.data()) != nullptr);
  return path;
}

// One Health/Check on a fresh channel (a refused connection would put a
// shared one into reconnect backoff).
grpc::Status Check(const std::string& target, const std::string& token,
                   health::HealthCheckResponse* response) {
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  auto stub = health::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  return stub->Check(&context, health::HealthCheckRequest(), response);
}

std::string BundleWithDaemon() {
  char daemon[PATH_MAX];
  REQUIRE(realpath("sandbox/agentix-sandboxd", daemon) != nullptr);
  const std::string bundle = MakeTemp(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp");
  REQUIRE(mkdir((bundle + "/nix").c_str(), 0755) == 0);
  REQUIRE(mkdir((bundle + "/nix/runtime").c_str(), 0755) == 0);
  const std::string script = bundle + "/nix/runtime/bootstrap.sh";
  std::ofstream(script) << "#!/bin/sh\nexec " << daemon << " --worker /bin/true \"$@\"\n";
  REQUIRE(chmod(script.c_str(), 0755) == 0);
  return bundle;
}

int OpenFds() {
  int n = 0;
  DIR* dir = opendir("/proc/self/fd");
  while (dirent* entry = readdir(dir)) n += entry->d_name[0] != '.';
  closedir(dir);
  return n;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Proportional set size (KiB) of the processes listed in `procs`.
long PssKb(const std::string& procs) {
  long total = 0;
  for (absl::string_view pid : absl::StrSplit(procs, '\n', absl::SkipEmpty())) {
    for (absl::string_view line : absl::StrSplit(Slurp(absl::StrCat("/proc/", pid, "/smaps_rollup")), '\n')) {
      if (absl::ConsumePrefix(&line, "Pss:")) {
        long kb = 0;
        if (absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::StripSuffix(absl::StripAsciiWhitespace(line), "kB")), &kb)) total += kb;
      }
    }
  }
  return total;
}

TEST_CASE("ten concurrent launches: all serve, 3 fds each in providerd, idle memory per sandbox") {
  const std::string bundle = BundleWithDaemon();
  const std::string state = MakeTemp("/tmp");
  LocalBackendOptions options;
  options.state_dir = state + "/s";
  options.cgroup_parent = absl::StrCat("agentix-test-", getpid());
  options.token_flag = "--token-file";
  REQUIRE_OK_AND_ASSIGN(auto backend, NewLocalBackend(options));
  {
    // gRPC keeps a few fds of its own once used: count after that.
    health::HealthCheckResponse ignored;
    (void)Check("unix://" + state + "/absent.sock", "", &ignored);
  }
  const int before = OpenFds();
  constexpr int kCount = 10;
  std::vector<absl::StatusOr<BackendRef>> refs(kCount, absl::UnknownError(""));
  std::vector<std::thread> threads;
  for (int i = 0; i < kCount; ++i) {
    threads.emplace_back([&, i] {
      LaunchSpec spec;
      spec.sandbox_id = absl::StrCat("c", i);
      spec.uid = "u";
      spec.instance = "test";
      spec.admin_token = absl::StrCat("t", i);
      spec.spec.mutable_bundle()->set_path(bundle);
      refs[i] = backend->Launch(spec, absl::Now() + absl::Seconds(20));
    });
  }
  for (auto& thread : threads) thread.join();
  for (int i = 0; i < kCount; ++i) {
    REQUIRE_OK(refs[i].status());
    health::HealthCheckResponse response;
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      auto endpoint = backend->ResolveEndpoint(*refs[i]);
      if (endpoint.ok() && Check(endpoint->target(), absl::StrCat("t", i), &response).ok()) break;
      absl::SleepFor(absl::Milliseconds(5));
    }
    CHECK(response.status() == health::HealthCheckResponse::SERVING);
  }
  const int per_sandbox_fds = (OpenFds() - before) / kCount;
  long pss_kb = 0;
  for (int i = 0; i < kCount; ++i) {
    pss_kb += PssKb(Slurp(absl::StrCat("/sys/fs/cgroup/pids/", options.cgroup_parent, "/c", i, "/cgroup.procs")));
  }
  WARN("providerd fds per sandbox: " << per_sandbox_fds << "; idle PSS per sandbox (bwrap, init, daemon): "
                                      << pss_kb / kCount << " KiB");
  CHECK(per_sandbox_fds <= 8);
  CHECK(pss_kb / kCount > 0);
// A sanitizer-built daemon is bigger (ASan's shadow memory, UBSan's checks):
// the bound is for the build users run.
#if !defined(__SANITIZE_ADDRESS__) && !defined(AGENTIX_UBSAN_BUILD)
  CHECK(pss_kb / kCount < 10 * 1024);  // >= 100 idle sandboxes per GiB
#endif
  threads.clear();
  for (int i = 0; i < kCount; ++i) {
    threads.emplace_back([&, i] { CHECK(backend->Destroy(*refs[i], absl::Seconds(2)).ok()); });
  }
  for (auto& thread : threads) thread.join();
  CHECK(OpenFds() <= before);  // gRPC may have dropped some of its own meanwhile
  REQUIRE_OK_AND_ASSIGN(auto owned, backend->ListOwned("test"));
  CHECK(owned.empty());
  backend.reset();
  CHECK(rmdir((state + "/s").c_str()) == 0);  // empty: every sandbox directory is gone
  rmdir(state.c_str());
}

TEST_CASE("the real daemon serves health on the endpoint with the piped admin token") {
  const std::string bundle = BundleWithDaemon();
  const std::string state = MakeTemp("/tmp");
  LocalBackendOptions options;
  options.state_dir = state + "/s";
  options.cgroup_parent = absl::StrCat("agentix-test-", getpid());
  options.token_flag = "--token-file";  // --admin-token-file comes with issue 19's daemon part
  REQUIRE_OK_AND_ASSIGN(auto backend, NewLocalBackend(options));

  std::vector<double> ready_ms, destroy_ms;
  for (int i = 0; i < 7; ++i) {
    LaunchSpec spec;
    spec.sandbox_id = absl::StrCat("d", i);
    spec.uid = "u";
    spec.instance = "test";
    spec.admin_token = absl::StrCat("admin-token-", i);
    spec.spec.mutable_bundle()->set_path(bundle);
    const absl::Time start = absl::Now();
    REQUIRE_OK_AND_ASSIGN(BackendRef ref, backend->Launch(spec, absl::Now() + absl::Seconds(10)));
    std::string target;
    health::HealthCheckResponse response;
    while (absl::Now() - start < absl::Seconds(20)) {
      auto endpoint = backend->ResolveEndpoint(ref);
      if (endpoint.ok()) {
        target = endpoint->target();
        if (Check(target, spec.admin_token, &response).ok()) break;
      } else {
        REQUIRE(endpoint.status().code() == absl::StatusCode::kUnavailable);
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
    ready_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    INFO(backend->LogTail(ref, 4096));
    REQUIRE(response.status() == health::HealthCheckResponse::SERVING);
    // Fail closed: the daemon got the token, so a call without it is refused.
    CHECK(Check(target, "", &response).error_code() == grpc::StatusCode::UNAUTHENTICATED);
    CHECK(Check(target, "wrong", &response).error_code() == grpc::StatusCode::UNAUTHENTICATED);
    const absl::Time destroy = absl::Now();
    REQUIRE_OK(backend->Destroy(ref, absl::Seconds(2)));
    destroy_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - destroy));
  }
  std::sort(destroy_ms.begin(), destroy_ms.end());
  WARN("Destroy (SIGTERM path), ms: p50 " << destroy_ms[destroy_ms.size() / 2] << ", max "
                                          << destroy_ms.back());
  // The daemon exits on SIGTERM: Destroy does not wait out the 2 s grace.
  CHECK(destroy_ms.back() < 1500);
  std::sort(ready_ms.begin(), ready_ms.end());
  WARN("cold Launch -> health SERVING, ms: min " << ready_ms.front() << ", p50 "
                                                  << ready_ms[ready_ms.size() / 2] << ", max "
                                                  << ready_ms.back());
  // The target is 150 ms on this 2-core VM; the bound here leaves room for
  // a loaded machine while still failing on a launch that waits for the
  // daemon or polls slowly.
  CHECK(ready_ms[ready_ms.size() / 2] < 1000);
  backend.reset();
  rmdir((state + "/s").c_str());
  rmdir(state.c_str());
}

}  // namespace
}  // namespace agentix::providers::local
