#include "providers/backends/kubernetes/kube_http.h"

#include <curl/curl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace agentix::providers::kubernetes {
namespace {

// A LIST of a namespace's Pods of one providerd is a few MiB at most.
constexpr size_t kMaxBodyBytes = size_t{64} << 20;
constexpr size_t kMaxErrorBytes = 64 << 10;

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// Close-on-exec sockets: the local backend spawns processes that must not
// inherit a connection to the API server.
curl_socket_t OpenSocket(void* clientp, curlsocktype, struct curl_sockaddr* address) {
  auto* canceller = static_cast<StreamCanceller*>(clientp);
  if (canceller != nullptr && canceller->cancelled()) return CURL_SOCKET_BAD;
  int fd = ::socket(address->family, address->socktype | SOCK_CLOEXEC, address->protocol);
  if (fd >= 0 && canceller != nullptr) canceller->SetSocket(fd);
  return fd < 0 ? CURL_SOCKET_BAD : fd;
}

int CloseSocket(void* clientp, curl_socket_t fd) {
  auto* canceller = static_cast<StreamCanceller*>(clientp);
  if (canceller != nullptr) canceller->ClearSocket(fd);
  return ::close(fd);
}

struct BodySink {
  std::string* body;
  bool overflow = false;
};

size_t AppendBody(char* data, size_t size, size_t n, void* userp) {
  auto* sink = static_cast<BodySink*>(userp);
  if (sink->body->size() + size * n > kMaxBodyBytes) {
    sink->overflow = true;
    return 0;
  }
  sink->body->append(data, size * n);
  return size * n;
}

struct StreamState {
  CURL* curl;
  const KubeHttp::DataFn* on_data;
  std::string* error_body;
  long status = 0;
  bool stopped_by_sink = false;
};

size_t StreamBody(char* data, size_t size, size_t n, void* userp) {
  auto* state = static_cast<StreamState*>(userp);
  if (state->status == 0) curl_easy_getinfo(state->curl, CURLINFO_RESPONSE_CODE, &state->status);
  size_t bytes = size * n;
  if (state->status < 200 || state->status >= 300) {
    size_t room = kMaxErrorBytes - std::min(kMaxErrorBytes, state->error_body->size());
    state->error_body->append(data, std::min(room, bytes));
    return bytes;
  }
  if (!(*state->on_data)(absl::string_view(data, bytes))) {
    state->stopped_by_sink = true;
    return 0;
  }
  return bytes;
}

int StreamProgress(void* clientp, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* canceller = static_cast<StreamCanceller*>(clientp);
  return canceller != nullptr && canceller->cancelled() ? 1 : 0;
}

}  // namespace

KubeHttp::KubeHttp(KubeConfig config) : config_(std::move(config)) {
  GlobalInit();
  token_ = config_.token;
}

KubeHttp::~KubeHttp() {
  absl::MutexLock lock(&mu_);
  for (void* handle : idle_) curl_easy_cleanup(static_cast<CURL*>(handle));
}

void* KubeHttp::TakeHandle() const {
  {
    absl::MutexLock lock(&mu_);
    if (!idle_.empty()) {
      void* handle = idle_.back();
      idle_.pop_back();
      return handle;
    }
  }
  return curl_easy_init();
}

void KubeHttp::ReturnHandle(void* handle) const {
  curl_easy_reset(static_cast<CURL*>(handle));  // keeps the live connection
  absl::MutexLock lock(&mu_);
  idle_.push_back(handle);
}

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

void KubeHttp::Setup(void* handle, const std::string& url, StreamCanceller* canceller,
                     void** headers) const {
  CURL* curl = static_cast<CURL*>(handle);
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_OPENSOCKETFUNCTION, OpenSocket);
  curl_easy_setopt(curl, CURLOPT_OPENSOCKETDATA, canceller);
  curl_easy_setopt(curl, CURLOPT_CLOSESOCKETFUNCTION, CloseSocket);
  curl_easy_setopt(curl, CURLOPT_CLOSESOCKETDATA, canceller);
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
  // No proxy from the environment: the API server is reached directly.
  curl_easy_setopt(curl, CURLOPT_NOPROXY, "*");
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
  struct curl_slist* list = static_cast<struct curl_slist*>(*headers);
  list = curl_slist_append(list, "Expect:");
  list = curl_slist_append(list, "Accept: application/json");
  std::string token = Token();
  if (!token.empty()) {
    list = curl_slist_append(list, absl::StrCat("Authorization: Bearer ", token).c_str());
  }
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, list);
  *headers = list;
}

absl::Status KubeHttp::TransportError(int curl_code, const char* detail) const {
  std::string what = detail != nullptr && *detail
                         ? std::string(detail)
                         : curl_easy_strerror(static_cast<CURLcode>(curl_code));
  if (curl_code == CURLE_OPERATION_TIMEDOUT) {
    return absl::DeadlineExceededError(
        absl::StrCat("Kubernetes API server ", config_.server, " did not answer in time: ", what));
  }
  return absl::UnavailableError(
      absl::StrCat("Kubernetes API server ", config_.server, " is not reachable: ", what));
}

absl::StatusOr<HttpResponse> KubeHttp::Request(absl::string_view method, absl::string_view path,
                                               absl::string_view body,
                                               absl::string_view content_type,
                                               absl::Duration timeout) const {
  for (int attempt = 0;; ++attempt) {
    CURL* curl = static_cast<CURL*>(TakeHandle());
    if (curl == nullptr) return absl::ResourceExhaustedError("curl_easy_init failed");
    std::string url = absl::StrCat(config_.server, path);
    void* headers = nullptr;
    if (!body.empty() || method == "POST" || method == "PATCH") {
      headers = curl_slist_append(
          nullptr, absl::StrCat("Content-Type: ",
                                content_type.empty() ? "application/json" : content_type)
                       .c_str());
    }
    Setup(curl, url, nullptr, &headers);
    std::string method_str(method);
    std::string body_str(body);
    if (method == "POST") {
      curl_easy_setopt(curl, CURLOPT_POST, 1L);
    } else if (method != "GET") {
      curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method_str.c_str());
    }
    if (method != "GET") {
      curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body_str.c_str());
      curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body_str.size()));
    }
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS,
                     std::max<long>(1, absl::ToInt64Milliseconds(timeout)));
    HttpResponse response;
    BodySink sink{&response.body};
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, AppendBody);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &sink);
    char error[CURL_ERROR_SIZE] = {0};
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
    CURLcode code = curl_easy_perform(curl);
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.status);
    absl::Status status;
    if (sink.overflow) {
      status = absl::ResourceExhaustedError(absl::StrCat(
          method, " ", path, ": the API server's answer exceeds ", kMaxBodyBytes, " bytes"));
    } else if (code != CURLE_OK) {
      status = TransportError(code, error);
    }
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, nullptr);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, nullptr);
    curl_slist_free_all(static_cast<struct curl_slist*>(headers));
    if (!status.ok()) {
      curl_easy_cleanup(curl);  // a broken connection is not worth keeping
      return status;
    }
    ReturnHandle(curl);
    if (response.status == 401 && attempt == 0 && ReloadToken()) continue;
    return response;
  }
}

absl::Status KubeHttp::Stream(absl::string_view path, const DataFn& on_data,
                              StreamCanceller* canceller, long* status_out,
                              std::string* error_body) const {
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return absl::ResourceExhaustedError("curl_easy_init failed");
  std::string url = absl::StrCat(config_.server, path);
  void* headers = nullptr;
  Setup(curl, url, canceller, &headers);
  StreamState state{curl, &on_data, error_body};
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, StreamBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &state);
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, StreamProgress);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, canceller);
  char error[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  CURLcode code = curl_easy_perform(curl);
  if (state.status == 0) curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &state.status);
  absl::Status transport = code == CURLE_OK ? absl::OkStatus() : TransportError(code, error);
  curl_easy_cleanup(curl);
  curl_slist_free_all(static_cast<struct curl_slist*>(headers));
  *status_out = state.status;
  if (state.stopped_by_sink || (canceller != nullptr && canceller->cancelled())) {
    return absl::OkStatus();
  }
  if (state.status == 401) ReloadToken();
  return transport;
}

std::string KubeMessage(absl::string_view body) {
  auto parsed = nlohmann::json::parse(body.begin(), body.end(), nullptr, false);
  if (parsed.is_object()) {
    auto it = parsed.find("message");
    if (it != parsed.end() && it->is_string()) return it->get<std::string>();
  }
  std::string text(body.substr(0, 1024));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text;
}

absl::Status KubeError(const HttpResponse& response, absl::string_view what) {
  std::string message = KubeMessage(response.body);
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
