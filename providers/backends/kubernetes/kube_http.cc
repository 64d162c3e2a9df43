#include "providers/backends/kubernetes/kube_http.h"

#include <curl/curl.h>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace agentix::providers::kubernetes {

curl_http::CurlClientOptions KubeHttp::ClientOptions(const KubeHttp* http,
                                                     const KubeConfig& config) {
  curl_http::CurlClientOptions options;
  options.base_url = config.server;
  options.protocols = "http,https";
  options.peer = absl::StrCat("Kubernetes API server ", config.server);
  // A LIST of a namespace's Pods of one providerd is a few MiB at most.
  options.max_body_bytes = size_t{64} << 20;
  options.configure = [http](void* handle, std::vector<std::string>* headers) {
    http->Configure(handle, headers);
  };
  return options;
}

KubeHttp::KubeHttp(KubeConfig config)
    : config_(std::move(config)), token_(config_.token), client_(ClientOptions(this, config_)) {}

KubeHttp::~KubeHttp() = default;

std::string KubeHttp::Token() const {
  absl::MutexLock lock(&mu_);
  return token_;
}

bool KubeHttp::ReloadToken() const {
  if (config_.token_file.empty()) return false;
  std::ifstream in(config_.token_file);
  if (!in) return false;
  std::stringstream text;
  text << in.rdbuf();
  std::string token(absl::StripAsciiWhitespace(text.str()));
  absl::MutexLock lock(&mu_);
  if (token.empty() || token == token_) return false;
  token_ = token;
  return true;
}

// TLS as the kubeconfig / service account says, and the bearer token.
void KubeHttp::Configure(void* handle, std::vector<std::string>* headers) const {
  CURL* curl = static_cast<CURL*>(handle);
  if (!config_.ca_pem.empty()) {
    struct curl_blob ca{const_cast<char*>(config_.ca_pem.data()), config_.ca_pem.size(),
                        CURL_BLOB_COPY};
    curl_easy_setopt(curl, CURLOPT_CAINFO_BLOB, &ca);
    curl_easy_setopt(curl, CURLOPT_CAPATH, nullptr);  // the cluster CA only
  }
  if (config_.insecure_skip_tls_verify) {
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  if (!config_.client_cert_pem.empty()) {
    struct curl_blob cert{const_cast<char*>(config_.client_cert_pem.data()),
                          config_.client_cert_pem.size(), CURL_BLOB_COPY};
    struct curl_blob key{const_cast<char*>(config_.client_key_pem.data()),
                         config_.client_key_pem.size(), CURL_BLOB_COPY};
    curl_easy_setopt(curl, CURLOPT_SSLCERTTYPE, "PEM");
    curl_easy_setopt(curl, CURLOPT_SSLCERT_BLOB, &cert);
    curl_easy_setopt(curl, CURLOPT_SSLKEYTYPE, "PEM");
    curl_easy_setopt(curl, CURLOPT_SSLKEY_BLOB, &key);
  }
  headers->push_back("Accept: application/json");
  std::string token = Token();
  if (!token.empty()) headers->push_back(absl::StrCat("Authorization: Bearer ", token));
}

absl::StatusOr<HttpResponse> KubeHttp::Request(absl::string_view method, absl::string_view path,
                                               absl::string_view body,
                                               absl::string_view content_type,
                                               absl::Duration timeout) const {
  const bool has_body = !body.empty() || method == "POST" || method == "PATCH";
  absl::string_view type =
      has_body ? (content_type.empty() ? absl::string_view("application/json") : content_type)
               : absl::string_view();
  for (int attempt = 0;; ++attempt) {
    absl::StatusOr<HttpResponse> response = client_.Request(method, path, body, type, timeout);
    // A rotated (projected) token: read the file again, once per request.
    if (response.ok() && response->status == 401 && attempt == 0 && ReloadToken()) continue;
    return response;
  }
}

absl::Status KubeHttp::Stream(absl::string_view path, const DataFn& on_data,
                              StreamCanceller* canceller, long* status_out,
                              std::string* error_body) const {
  absl::Status status = client_.Stream(path, on_data, canceller, status_out, error_body);
  if (*status_out == 401) ReloadToken();
  return status;
}

absl::Status KubeError(const HttpResponse& response, absl::string_view what) {
  std::string message = curl_http::JsonErrorMessage(response.body);
  std::string reason;
  auto parsed = nlohmann::json::parse(response.body, nullptr, false);
  if (parsed.is_object() && parsed.contains("reason") && parsed["reason"].is_string()) {
    reason = parsed["reason"].get<std::string>();
  }
  std::string text = absl::StrCat(what, ": the Kubernetes API server answered ",
                                  response.status, reason.empty() ? "" : " ", reason, ": ",
                                  message);
  switch (response.status) {
    case 400:
    case 422:
      return absl::InvalidArgumentError(text);
    case 401:
      return absl::UnauthenticatedError(text);
    case 403:
      return absl::PermissionDeniedError(text);
    case 404:
      return absl::NotFoundError(text);
    case 409:
      return reason == "AlreadyExists" ? absl::AlreadyExistsError(text) : absl::AbortedError(text);
    case 410:
      return absl::OutOfRangeError(text);
    case 429:
      return absl::UnavailableError(text);
    default:
      if (response.status >= 500) return absl::UnavailableError(text);
      return absl::UnknownError(text);
  }
}

}  // namespace agentix::providers::kubernetes
