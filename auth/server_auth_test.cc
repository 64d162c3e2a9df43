#include "auth/server_auth.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <string>

namespace agentix::auth {
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

TEST_CASE("Bearer token comparison", "[auth]") {
  CHECK(BearerTokenMatches("s3cret", "Bearer s3cret"));
  CHECK_FALSE(BearerTokenMatches("s3cret", "Bearer s3cres"));
  CHECK_FALSE(BearerTokenMatches("s3cret", "Bearer s3cret2"));
  CHECK_FALSE(BearerTokenMatches("s3cret", "Bearer s3cre"));
  CHECK_FALSE(BearerTokenMatches("s3cret", "bearer s3cret"));
  CHECK_FALSE(BearerTokenMatches("s3cret", "s3cret"));
  CHECK_FALSE(BearerTokenMatches("s3cret", ""));
  CHECK_FALSE(BearerTokenMatches("", "Bearer "));  // no token never matches
}

TEST_CASE("Token file: owner-only, stripped, not empty", "[auth]") {
  std::string good = TempFile("  tok-123\n", 0600);
  auto token = LoadToken(good, "ignored-env");
  REQUIRE(token.ok());
  CHECK(*token == "tok-123");

  std::string shared = TempFile("tok", 0644);
  auto refused = LoadToken(shared, nullptr);
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(refused.status().message().find("chmod 600") != std::string::npos);
  CHECK(refused.status().message().find("0644") != std::string::npos);

  std::string empty = TempFile("\n", 0600);
  CHECK(LoadToken(empty, nullptr).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(LoadToken("/nonexistent/token", nullptr).status().code() ==
        absl::StatusCode::kNotFound);
  for (const auto& path : {good, shared, empty}) ::unlink(path.c_str());
}

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

}  // namespace
}  // namespace agentix::auth
