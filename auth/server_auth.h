// Transport security and authentication shared by agentix-sandboxd and
// agentix-providerd: TLS / mutual TLS with gRPC's own credentials and a
// bearer token checked on every RPC (the services, health and reflection
// alike) in gRPC's auth filter, before any handler runs.
#pragma once

#include <memory>
#include <string>

#include <grpc/grpc_security.h>
#include <grpcpp/security/server_credentials.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace agentix::auth {

// The metadata key and scheme hosts send the token with:
// "authorization: Bearer <token>".
inline constexpr char kAuthorizationKey[] = "authorization";
inline constexpr char kBearerPrefix[] = "Bearer ";
// The daemon's environment variable read when no --token-file is given.
inline constexpr char kTokenEnvVar[] = "AGENTIX_TOKEN";

struct ServerSecurityOptions {
  // Required bearer token; empty disables the check (every call is then
  // accepted, and still marks its connection as having made an RPC).
  std::string token;
  // PEM contents; empty cert and key mean plaintext. A client CA makes the
  // server require and verify client certificates (mutual TLS).
  std::string tls_cert_pem;
  std::string tls_key_pem;
  std::string tls_client_ca_pem;
  // Called on the transport thread for every call that passes the check;
  // must be cheap and non-blocking (the daemon's connection guard marks the
  // connection). Null: nothing.
  void (*on_authenticated)() = nullptr;
  // Methods whose ":path" starts with this (e.g. "/pkg.Service/") pass the
  // filter: their handlers check the token themselves, which lets them
  // answer UNAUTHENTICATED with trailing metadata (a reason), something the
  // filter cannot send. Every other method (health, reflection) is checked
  // here. Empty: every method is checked here.
  std::string handler_checked_prefix;
  // The UNAUTHENTICATED message callers see (how to send the token).
  std::string denied_message =
      "missing or wrong bearer token: send 'authorization: Bearer <token>'";
};

// The token to require: the contents of `token_file` (surrounding
// whitespace stripped) if given, else `env_value` (may be null, stripped),
// else "" (no token check); errors name `env_name`. Never fails open: FailedPrecondition if the
// file is readable or writable by group or others; NotFound for a missing
// file; InvalidArgument for an empty or blank file or `env_value`.
absl::StatusOr<std::string> LoadToken(const std::string& token_file,
                                      const char* env_value,
                                      absl::string_view env_name = kTokenEnvVar);

// The contents of a token file (surrounding whitespace stripped), read to
// EOF (a pipe such as /proc/self/fd/N works), with LoadToken's rules;
// errors name `flag`.
absl::StatusOr<std::string> LoadTokenFile(const std::string& path,
                                          absl::string_view flag);

// Reads a whole PEM file; errors name the flag.
absl::StatusOr<std::string> ReadPemFile(const std::string& path,
                                        absl::string_view flag);

// Whether `presented` (the authorization header value) carries `token`.
// Takes the same time for every presented value of a given length.
bool BearerTokenMatches(absl::string_view token, absl::string_view presented);

// Plaintext or TLS (mutual with a client CA) credentials, PEM contents as
// in ServerSecurityOptions, whose every call first passes `processor` (gRPC's
// auth filter; it then owns the processor's state, which is destroyed here
// on an error). For servers with their own token rules (the daemon's
// TokenGate); MakeServerCredentials is this with the plain bearer check.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>>
MakeServerCredentialsWithProcessor(const std::string& tls_cert_pem,
                                   const std::string& tls_key_pem,
                                   const std::string& tls_client_ca_pem,
                                   grpc_auth_metadata_processor processor);

// Credentials for every listening port of a server.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerSecurityOptions& options);

}  // namespace agentix::auth
