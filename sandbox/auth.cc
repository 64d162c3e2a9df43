#include "sandbox/auth.h"

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "base/status_macros.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "sandbox/connection_guard.h"

namespace agentix::sandbox {
namespace {

absl::string_view SliceView(const grpc_slice& slice) {
  return absl::string_view(
      reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(slice)),
      GRPC_SLICE_LENGTH(slice));
}

// The core processor: runs in gRPC's server auth filter for every incoming
// call, before the call reaches any service. Non-blocking, so gRPC runs it
// inline on the transport thread that read the call's headers, which is what
// lets it mark that connection authenticated (connection_guard.h). Without a
// token every call passes and marks its connection; a call refused for any
// reason (a wrong token, or a sandbox not activated yet) does not mark it.
void CheckBearerToken(void* state, grpc_auth_context* /*context*/,
                      const grpc_metadata* md, size_t num_md,
                      grpc_process_auth_metadata_done_cb done,
                      void* user_data) {
  const TokenGate& gate = **static_cast<std::shared_ptr<TokenGate>*>(state);
  absl::string_view path;
  absl::string_view authorization;
  bool has_authorization = false;
  for (size_t i = 0; i < num_md; ++i) {
    const absl::string_view key = SliceView(md[i].key);
    if (key == kAuthorizationKey) {
      if (!has_authorization) authorization = SliceView(md[i].value);
      has_authorization = true;
    } else if (key == ":path") {
      path = SliceView(md[i].value);
    }
  }
  const TokenGate::Verdict verdict =
      gate.Check(path, has_authorization ? &authorization : nullptr);
  if (verdict.code == absl::StatusCode::kOk) {
    MarkCurrentConnectionAuthenticated();
    done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_OK, nullptr);
  } else {
    done(user_data, nullptr, 0, nullptr, 0,
         static_cast<grpc_status_code>(verdict.code), verdict.message);
  }
}

void DestroyGate(void* state) {
  delete static_cast<std::shared_ptr<TokenGate>*>(state);
}

constexpr char kWrongTokenMessage[] =
    "missing or wrong bearer token: send 'authorization: Bearer <token>' "
    "(RuntimeClient(url, token=...))";
constexpr char kWrongAdminTokenMessage[] =
    "missing or wrong bearer token: SandboxAdmin needs the admin token "
    "(--admin-token-file)";
constexpr char kWrongHealthTokenMessage[] =
    "missing or wrong bearer token: health needs the admin token or, once "
    "the sandbox is activated, its token";

}  // namespace

absl::StatusOr<std::string> LoadToken(const std::string& token_file,
                                      const char* env_value) {
  return auth::LoadToken(token_file, env_value, kTokenEnvVar);
}

std::shared_ptr<TokenGate> TokenGate::Fixed(std::string token) {
  return std::shared_ptr<TokenGate>(new TokenGate(false, std::move(token)));
}

std::shared_ptr<TokenGate> TokenGate::Armable(std::string admin_token) {
  return std::shared_ptr<TokenGate>(new TokenGate(true, std::move(admin_token)));
}

TokenGate::Verdict TokenGate::Check(
    absl::string_view path, const absl::string_view* authorization) const {
  constexpr Verdict kOk{absl::StatusCode::kOk, nullptr};
  const absl::string_view presented =
      authorization != nullptr ? *authorization : absl::string_view();
  if (!armable_) {
    if (token_.empty() || BearerTokenMatches(token_, presented)) return kOk;
    return {absl::StatusCode::kUnauthenticated, kWrongTokenMessage};
  }
  const bool admin = BearerTokenMatches(token_, presented);
  if (absl::StartsWith(path, kAdminServicePrefix)) {
    if (admin) return kOk;
    return {absl::StatusCode::kUnauthenticated, kWrongAdminTokenMessage};
  }
  const bool armed = armed_.load(std::memory_order_acquire);
  const bool runtime = armed && BearerTokenMatches(runtime_token_, presented);
  if (absl::StartsWith(path, kHealthServicePrefix)) {
    if (admin || runtime) return kOk;
    return {absl::StatusCode::kUnauthenticated, kWrongHealthTokenMessage};
  }
  // Every other RPC (runtime services, reflection) is the runtime's.
  if (!armed) return {absl::StatusCode::kFailedPrecondition, kNotActivatedMessage};
  if (runtime) return kOk;
  return {absl::StatusCode::kUnauthenticated, kWrongTokenMessage};
}

absl::Status CheckRuntimeToken(absl::string_view token) {
  if (absl::StripAsciiWhitespace(token).empty()) {
    return absl::InvalidArgumentError("the token is empty or blank");
  }
  for (const char c : token) {
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(
          "the token must be printable ASCII without spaces (it travels as "
          "'authorization: Bearer <token>')");
    }
  }
  return absl::OkStatus();
}

absl::Status TokenGate::Arm(absl::string_view token) {
  if (!armable_) {
    return absl::FailedPreconditionError(
        "this daemon was not started with --admin-token-file; it cannot be "
        "activated");
  }
  AGX_RETURN_IF_ERROR(CheckCandidate(token));
  absl::MutexLock lock(&arm_mu_);
  if (armed_.load(std::memory_order_relaxed)) {
    if (IsRuntimeToken(token)) return absl::OkStatus();
    return absl::FailedPreconditionError(
        "the sandbox is already activated with another token");
  }
  runtime_token_ = std::string(token);
  armed_.store(true, std::memory_order_release);
  return absl::OkStatus();
}

absl::Status TokenGate::CheckCandidate(absl::string_view token) const {
  AGX_RETURN_IF_ERROR(CheckRuntimeToken(token));
  if (armable_ &&
      BearerTokenMatches(token_, absl::StrCat(kBearerPrefix, token))) {
    return absl::InvalidArgumentError(
        "the runtime token must differ from the admin token");
  }
  return absl::OkStatus();
}

bool TokenGate::IsRuntimeToken(absl::string_view token) const {
  return armed() &&
         BearerTokenMatches(runtime_token_, absl::StrCat(kBearerPrefix, token));
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerSecurityOptions& options) {
  // Installed without a token too: it marks connections that made an RPC.
  grpc_auth_metadata_processor processor;
  processor.process = CheckBearerToken;
  processor.destroy = DestroyGate;
  processor.state = new std::shared_ptr<TokenGate>(
      options.gate ? options.gate : TokenGate::Fixed(options.token));
  return auth::MakeServerCredentialsWithProcessor(
      options.tls_cert_pem, options.tls_key_pem, options.tls_client_ca_pem, processor);
}

}  // namespace agentix::sandbox
