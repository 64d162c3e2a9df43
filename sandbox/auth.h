// Transport security and authentication of agentix-sandboxd: TLS / mutual
// TLS with gRPC's own credentials and a per-sandbox bearer token checked on
// every RPC (the runtime services, health and reflection alike) before any
// handler runs.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include <grpcpp/security/server_credentials.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "auth/server_auth.h"

namespace agentix::sandbox {

// The metadata key and scheme hosts send the token with:
// "authorization: Bearer <token>".
inline constexpr char kAuthorizationKey[] = "authorization";
inline constexpr char kBearerPrefix[] = "Bearer ";
// Environment variable read when no --token-file is given.
inline constexpr char kTokenEnvVar[] = "AGENTIX_TOKEN";

// Method-path prefixes the gate tells apart in activation mode.
inline constexpr char kAdminServicePrefix[] = "/agentix.runtime.v1.SandboxAdmin/";
inline constexpr char kHealthServicePrefix[] = "/grpc.health.v1.Health/";
inline constexpr char kNotActivatedMessage[] = "sandbox not activated";

// Who may call what; consulted by the server's auth processor for every RPC
// before any handler runs (so a refusal costs no handler and changes
// nothing). Two modes:
// - Fixed(token): every RPC needs `token` ("" = no check), as without
//   --admin-token-file.
// - Armable(admin_token), for warm pools (--admin-token-file): SandboxAdmin
//   needs the admin token; grpc.health.v1 the admin token (or, once armed,
//   the runtime token); every other RPC is refused FAILED_PRECONDITION
//   "sandbox not activated" until Arm(token), and from then on needs exactly
//   that token. The admin token is never a runtime token and vice versa.
// Check() is lock-free and thread-safe; the runtime token is written once,
// before `armed_` is published.
class TokenGate {
 public:
  static std::shared_ptr<TokenGate> Fixed(std::string token);
  static std::shared_ptr<TokenGate> Armable(std::string admin_token);

  struct Verdict {
    absl::StatusCode code;  // kOk: the RPC may run
    const char* message;    // static text, for the refused RPC's status
  };
  // `path` is the RPC's ":path" ("/pkg.Service/Method"; "" if absent counts
  // as a runtime RPC); `authorization` the header's value, null if absent.
  Verdict Check(absl::string_view path,
                const absl::string_view* authorization) const;

  // Arms an Armable gate with the runtime token, once: OK if already armed
  // with the same token; FailedPrecondition if armed with another or the
  // gate is Fixed; InvalidArgument for a blank token, one that is not
  // printable ASCII without spaces (it could not travel in the header), or
  // the admin token itself.
  absl::Status Arm(absl::string_view token);
  // Arm's InvalidArgument checks alone (nothing changes).
  absl::Status CheckCandidate(absl::string_view token) const;
  bool armable() const { return armable_; }
  bool armed() const { return armed_.load(std::memory_order_acquire); }
  // Whether `token` is the one Arm() accepted (false while unarmed).
  bool IsRuntimeToken(absl::string_view token) const;

 private:
  TokenGate(bool armable, std::string token)
      : armable_(armable), token_(std::move(token)) {}

  const bool armable_;
  // Fixed: the runtime token; Armable: the admin token.
  const std::string token_;
  absl::Mutex arm_mu_;  // serializes Arm()
  std::atomic<bool> armed_{false};
  // Armable only; written once under arm_mu_ before armed_ turns true.
  std::string runtime_token_;
};

// Validation Arm() applies to a runtime token: OK or InvalidArgument.
absl::Status CheckRuntimeToken(absl::string_view token);

struct ServerSecurityOptions {
  // Required bearer token; empty disables the check (every call is then
  // accepted, and still marks its connection as having made an RPC).
  // Ignored when `gate` is set.
  std::string token;
  // Decides every RPC instead of `token` (activation mode: TokenGate::Armable,
  // kept by the caller to arm it).
  std::shared_ptr<TokenGate> gate;
  // PEM contents; empty cert and key mean plaintext. A client CA makes the
  // server require and verify client certificates (mutual TLS).
  std::string tls_cert_pem;
  std::string tls_key_pem;
  std::string tls_client_ca_pem;
};

// The token to require: the contents of `token_file` (surrounding
// whitespace stripped) if given, else `env_value` (may be null, stripped),
// else "" (no token check). Never fails open: FailedPrecondition if the
// file is readable or writable by group or others; NotFound for a missing
// file; InvalidArgument for an empty or blank file or `env_value`.
absl::StatusOr<std::string> LoadToken(const std::string& token_file,
                                      const char* env_value);

// Shared with providerd (//auth): the token file rules, PEM files and the
// constant-time bearer comparison.
using auth::BearerTokenMatches;
using auth::LoadTokenFile;
using auth::ReadPemFile;

// Credentials for every listening port of the daemon.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerSecurityOptions& options);

}  // namespace agentix::sandbox
