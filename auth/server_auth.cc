#include "auth/server_auth.h"

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace agentix::auth {
namespace {

absl::string_view SliceView(const grpc_slice& slice) {
  return absl::string_view(
      reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(slice)),
      GRPC_SLICE_LENGTH(slice));
}

struct CheckState {
  std::string token;
  std::string denied_message;
  void (*on_authenticated)();
  std::string handler_checked_prefix;
};

// The core processor: runs in gRPC's server auth filter for every incoming
// call, before the call reaches any service. Non-blocking, so gRPC runs it
// inline on the transport thread that read the call's headers, which is what
// lets the daemon mark that connection authenticated (connection_guard.h).
// Without a token every call passes (and is reported as authenticated).
void CheckBearerToken(void* raw_state, grpc_auth_context* /*context*/,
                      const grpc_metadata* md, size_t num_md,
                      grpc_process_auth_metadata_done_cb done,
                      void* user_data) {
  const CheckState& state = *static_cast<const CheckState*>(raw_state);
  const std::string& token = state.token;
  bool ok = token.empty();
  bool seen_authorization = false;
  for (size_t i = 0; !ok && i < num_md; ++i) {
    const absl::string_view key = SliceView(md[i].key);
    if (key == kAuthorizationKey && !seen_authorization) {
      seen_authorization = true;
      ok = BearerTokenMatches(token, SliceView(md[i].value));
    } else if (key == ":path" && !state.handler_checked_prefix.empty() &&
               absl::StartsWith(SliceView(md[i].value),
                                state.handler_checked_prefix)) {
      ok = true;  // the service's handlers check the token themselves
    }
  }
  if (ok) {
    if (state.on_authenticated != nullptr) state.on_authenticated();
    done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_OK, nullptr);
  } else {
    done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED,
         state.denied_message.c_str());
  }
}

void DestroyState(void* state) { delete static_cast<CheckState*>(state); }

// grpc::ServerCredentials over a core credentials object, which is what
// lets the token processor run on plaintext ports too: the C++
// InsecureServerCredentials() refuses auth metadata processors.
class CoreServerCredentials final : public grpc::ServerCredentials {
 public:
  explicit CoreServerCredentials(grpc_server_credentials* core)
      : core_(core) {}
  ~CoreServerCredentials() override { grpc_server_credentials_release(core_); }

  void SetAuthMetadataProcessor(
      const std::shared_ptr<grpc::AuthMetadataProcessor>& /*processor*/)
      override {
    // The token check is installed at construction; nothing else uses this.
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    return grpc_server_add_http2_port(server, addr.c_str(), core_);
  }

  grpc_server_credentials* const core_;
};

}  // namespace

bool BearerTokenMatches(absl::string_view token, absl::string_view presented) {
  const std::string expected = absl::StrCat(kBearerPrefix, token);
  // Every byte of `presented` is compared (against a fixed byte past the
  // end of `expected`), so the time depends only on its length.
  unsigned char diff = presented.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < presented.size(); ++i) {
    const unsigned char want =
        i < expected.size() ? static_cast<unsigned char>(expected[i]) : 0;
    diff |= static_cast<unsigned char>(presented[i]) ^ want;
  }
  return !token.empty() && diff == 0;
}

absl::StatusOr<std::string> LoadToken(const std::string& token_file,
                                      const char* env_value,
                                      absl::string_view env_name) {
  if (token_file.empty()) {
    if (env_value == nullptr) return std::string();
    std::string token(absl::StripAsciiWhitespace(env_value));
    if (token.empty()) {
      // Set but blank is a mistake, not a request to run without a check.
      return absl::InvalidArgumentError(absl::StrCat(
          "$", env_name, " is set but empty or blank; set a token, or "
          "unset it to run without a token check"));
    }
    return token;
  }
  return LoadTokenFile(token_file, "--token-file");
}

absl::StatusOr<std::string> LoadTokenFile(const std::string& path,
                                          absl::string_view flag) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(flag, " ", path, ": cannot stat it"));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        flag, " ", path, " is accessible by group or others (mode ",
        absl::StrFormat("%04o", st.st_mode & 07777), "); run chmod 600 on it"));
  }
  // Read to EOF: a pipe such as /proc/self/fd/N works.
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in && !in.eof()) {
    return absl::NotFoundError(absl::StrCat(flag, " ", path, ": cannot read it"));
  }
  std::string token(absl::StripAsciiWhitespace(text.str()));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, " is empty"));
  }
  return token;
}

absl::StatusOr<std::string> ReadPemFile(const std::string& path,
                                        absl::string_view flag) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(flag, " ", path, ": cannot open it"));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (text.str().find("-----BEGIN") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": not a PEM file"));
  }
  return text.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>>
MakeServerCredentialsWithProcessor(const std::string& tls_cert_pem,
                                   const std::string& tls_key_pem,
                                   const std::string& tls_client_ca_pem,
                                   grpc_auth_metadata_processor processor) {
  auto refuse = [&](absl::string_view message) {
    processor.destroy(processor.state);
    return absl::InvalidArgumentError(message);
  };
  const bool tls = !tls_cert_pem.empty() || !tls_key_pem.empty();
  if (tls && (tls_cert_pem.empty() || tls_key_pem.empty())) {
    return refuse("TLS needs both --tls-cert and --tls-key");
  }
  if (!tls && !tls_client_ca_pem.empty()) {
    return refuse("--tls-client-ca needs --tls-cert and --tls-key");
  }
  grpc_server_credentials* core = nullptr;
  if (tls) {
    grpc_ssl_pem_key_cert_pair pair = {tls_key_pem.c_str(), tls_cert_pem.c_str()};
    const bool mutual = !tls_client_ca_pem.empty();
    core = grpc_ssl_server_credentials_create_ex(
        mutual ? tls_client_ca_pem.c_str() : nullptr, &pair, 1,
        mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
               : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        nullptr);
  } else {
    core = grpc_insecure_server_credentials_create();
  }
  if (core == nullptr) return refuse("gRPC refused the TLS certificate or key");
  grpc_server_credentials_set_auth_metadata_processor(core, processor);
  return std::make_shared<CoreServerCredentials>(core);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerSecurityOptions& options) {
  // Installed without a token too: it reports calls to on_authenticated.
  grpc_auth_metadata_processor processor;
  processor.process = CheckBearerToken;
  processor.destroy = DestroyState;
  processor.state = new CheckState{options.token, options.denied_message,
                                   options.on_authenticated,
                                   options.handler_checked_prefix};
  return MakeServerCredentialsWithProcessor(options.tls_cert_pem, options.tls_key_pem,
                                            options.tls_client_ca_pem, processor);
}

}  // namespace agentix::auth
