#include "sandbox/auth.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <string>

namespace agentix::sandbox {
namespace {

std::string TempFile(const std::string& contents, mode_t mode) {
  char path[] = "/tmp/agentix-auth-test-XXXXXX";
  int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::close(fd);
  std::ofstream(path) << contents;
  REQUIRE(::chmod(path, mode) == 0);
  return path;
}

// The token-file rules and the bearer comparison are //auth's, tested in
// auth/server_auth_test.cc; these cases cover what the daemon adds.

TEST_CASE("Without a file the environment value is used", "[auth]") {
  CHECK(*LoadToken("", " env-token\n") == "env-token");
  CHECK(LoadToken("", nullptr)->empty());
}

TEST_CASE("A set but blank environment token is refused, not open", "[auth]") {
  for (const char* blank : {"", " ", "\t\n "}) {
    auto token = LoadToken("", blank);
    CHECK(token.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(token.status().message().find("AGENTIX_TOKEN") != std::string::npos);
  }
}

TEST_CASE("TLS options must come in complete sets", "[auth]") {
  ServerSecurityOptions only_cert;
  only_cert.tls_cert_pem = "-----BEGIN CERTIFICATE-----";
  CHECK(MakeServerCredentials(only_cert).status().code() ==
        absl::StatusCode::kInvalidArgument);
  ServerSecurityOptions only_ca;
  only_ca.tls_client_ca_pem = "-----BEGIN CERTIFICATE-----";
  CHECK(MakeServerCredentials(only_ca).status().code() ==
        absl::StatusCode::kInvalidArgument);
  ServerSecurityOptions plaintext_with_token;
  plaintext_with_token.token = "t";
  CHECK(MakeServerCredentials(plaintext_with_token).ok());
  CHECK(ReadPemFile("/nonexistent.pem", "--tls-cert").status().code() ==
        absl::StatusCode::kNotFound);
}

TEST_CASE("Admin token file: read to EOF from a pipe, named in errors",
          "[auth]") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const std::string text = " admin-tok\n";
  REQUIRE(::write(fds[1], text.data(), text.size()) ==
          static_cast<ssize_t>(text.size()));
  ::close(fds[1]);
  const std::string path = "/proc/self/fd/" + std::to_string(fds[0]);
  auto token = LoadTokenFile(path, "--admin-token-file");
  ::close(fds[0]);
  REQUIRE(token.ok());
  CHECK(*token == "admin-tok");
  auto missing = LoadTokenFile("/nonexistent/admin", "--admin-token-file");
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(missing.status().message().find("--admin-token-file") !=
        std::string::npos);
  std::string shared = TempFile("tok", 0640);
  CHECK(LoadTokenFile(shared, "--admin-token-file").status().code() ==
        absl::StatusCode::kFailedPrecondition);
  ::unlink(shared.c_str());
}

constexpr char kCalls[] = "/agentix.runtime.v1.RuntimeService/Calls";
constexpr char kActivate[] = "/agentix.runtime.v1.SandboxAdmin/Activate";
constexpr char kHealth[] = "/grpc.health.v1.Health/Check";
constexpr char kReflection[] =
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";

absl::StatusCode Decide(const TokenGate& gate, absl::string_view path,
                        const char* authorization) {
  if (authorization == nullptr) return gate.Check(path, nullptr).code;
  const absl::string_view value(authorization);
  return gate.Check(path, &value).code;
}

TEST_CASE("Fixed gate: one token for every RPC, or none", "[auth]") {
  auto gate = TokenGate::Fixed("tok");
  for (const char* path : {kCalls, kHealth, kActivate, ""}) {
    CHECK(Decide(*gate, path, "Bearer tok") == absl::StatusCode::kOk);
    CHECK(Decide(*gate, path, "Bearer nope") ==
          absl::StatusCode::kUnauthenticated);
    CHECK(Decide(*gate, path, nullptr) == absl::StatusCode::kUnauthenticated);
  }
  auto open = TokenGate::Fixed("");
  CHECK(Decide(*open, kCalls, nullptr) == absl::StatusCode::kOk);
  CHECK_FALSE(gate->armable());
  CHECK(gate->Arm("other").code() == absl::StatusCode::kFailedPrecondition);
  // Still the old token only.
  CHECK(Decide(*gate, kCalls, "Bearer other") ==
        absl::StatusCode::kUnauthenticated);
}

TEST_CASE("Armable gate before Activate: admin and health only", "[auth]") {
  auto gate = TokenGate::Armable("admin");
  CHECK_FALSE(gate->armed());
  CHECK(Decide(*gate, kActivate, "Bearer admin") == absl::StatusCode::kOk);
  CHECK(Decide(*gate, kActivate, nullptr) ==
        absl::StatusCode::kUnauthenticated);
  CHECK(Decide(*gate, kActivate, "Bearer run") ==
        absl::StatusCode::kUnauthenticated);
  CHECK(Decide(*gate, kHealth, "Bearer admin") == absl::StatusCode::kOk);
  CHECK(Decide(*gate, kHealth, nullptr) == absl::StatusCode::kUnauthenticated);
  // Runtime RPCs and reflection: not activated, whatever the token.
  for (const char* path : {kCalls, kReflection, ""}) {
    for (const char* auth : {"Bearer admin", "Bearer run", (const char*)nullptr}) {
      const TokenGate::Verdict verdict =
          auth == nullptr ? gate->Check(path, nullptr) : [&] {
            const absl::string_view value(auth);
            return gate->Check(path, &value);
          }();
      CHECK(verdict.code == absl::StatusCode::kFailedPrecondition);
      CHECK(std::string(verdict.message) == kNotActivatedMessage);
    }
  }
}

TEST_CASE("Armable gate after Activate: the runtime token, exactly",
          "[auth]") {
  auto gate = TokenGate::Armable("admin");
  REQUIRE(gate->Arm("run").ok());
  CHECK(gate->armed());
  CHECK(Decide(*gate, kCalls, "Bearer run") == absl::StatusCode::kOk);
  CHECK(Decide(*gate, kReflection, "Bearer run") == absl::StatusCode::kOk);
  CHECK(Decide(*gate, kCalls, "Bearer admin") ==
        absl::StatusCode::kUnauthenticated);
  CHECK(Decide(*gate, kCalls, "Bearer runx") ==
        absl::StatusCode::kUnauthenticated);
  CHECK(Decide(*gate, kCalls, nullptr) == absl::StatusCode::kUnauthenticated);
  // The runtime token cannot administer the sandbox.
  CHECK(Decide(*gate, kActivate, "Bearer run") ==
        absl::StatusCode::kUnauthenticated);
  CHECK(Decide(*gate, kActivate, "Bearer admin") == absl::StatusCode::kOk);
  // Health answers either.
  CHECK(Decide(*gate, kHealth, "Bearer run") == absl::StatusCode::kOk);
  CHECK(Decide(*gate, kHealth, "Bearer admin") == absl::StatusCode::kOk);
  CHECK(Decide(*gate, kHealth, "Bearer x") ==
        absl::StatusCode::kUnauthenticated);
}

TEST_CASE("Arm: once, idempotent, validated", "[auth]") {
  auto gate = TokenGate::Armable("admin");
  CHECK(gate->Arm("").code() == absl::StatusCode::kInvalidArgument);
  CHECK(gate->Arm(" \t").code() == absl::StatusCode::kInvalidArgument);
  CHECK(gate->Arm("has space").code() == absl::StatusCode::kInvalidArgument);
  CHECK(gate->Arm("admin").code() == absl::StatusCode::kInvalidArgument);
  CHECK_FALSE(gate->armed());  // refusals changed nothing
  REQUIRE(gate->Arm("run").ok());
  CHECK(gate->Arm("run").ok());
  CHECK(gate->Arm("other").code() == absl::StatusCode::kFailedPrecondition);
  CHECK(gate->IsRuntimeToken("run"));
  CHECK_FALSE(gate->IsRuntimeToken("other"));
  CHECK(Decide(*gate, kCalls, "Bearer other") ==
        absl::StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace agentix::sandbox
