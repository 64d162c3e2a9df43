#include "providers/backends/curl_http/curl_http.h"

#include <curl/curl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace agentix::providers::curl_http {
namespace {

constexpr size_t kMaxErrorBytes = 64 << 10;

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

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
  size_t max_bytes;
  bool overflow = false;
};

size_t AppendBody(char* data, size_t size, size_t n, void* userp) {
  auto* sink = static_cast<BodySink*>(userp);
  if (sink->body->size() + size * n > sink->max_bytes) {
    sink->overflow = true;
    return 0;
  }
  sink->body->append(data, size * n);
  return size * n;
}

struct StreamState {
  CURL* curl;
  const CurlClient::DataFn* on_data;
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

void StreamCanceller::Cancel() {
  cancelled_.store(true);
  absl::MutexLock lock(&mu_);
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

void StreamCanceller::SetSocket(int fd) {
  absl::MutexLock lock(&mu_);
  fd_ = fd;
  if (cancelled_.load()) ::shutdown(fd_, SHUT_RDWR);
}

void StreamCanceller::ClearSocket(int fd) {
  absl::MutexLock lock(&mu_);
  if (fd_ == fd) fd_ = -1;
}

CurlClient::CurlClient(CurlClientOptions options) : options_(std::move(options)) { GlobalInit(); }

CurlClient::~CurlClient() {
  absl::MutexLock lock(&mu_);
  for (void* handle : idle_) curl_easy_cleanup(static_cast<CURL*>(handle));
}

void* CurlClient::TakeHandle() const {
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

void CurlClient::ReturnHandle(void* handle) const {
  // curl_easy_reset keeps the handle's live connection for the next request.
  curl_easy_reset(static_cast<CURL*>(handle));
  absl::MutexLock lock(&mu_);
  idle_.push_back(handle);
}

void* CurlClient::Setup(void* handle, absl::string_view path, StreamCanceller* canceller,
                        absl::string_view content_type) const {
  CURL* curl = static_cast<CURL*>(handle);
  const std::string url = absl::StrCat(options_.base_url, path);
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());  // copied by curl
  if (!options_.unix_socket.empty()) {
    curl_easy_setopt(curl, CURLOPT_UNIX_SOCKET_PATH, options_.unix_socket.c_str());
  }
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_OPENSOCKETFUNCTION, OpenSocket);
  curl_easy_setopt(curl, CURLOPT_OPENSOCKETDATA, canceller);
  curl_easy_setopt(curl, CURLOPT_CLOSESOCKETFUNCTION, CloseSocket);
  curl_easy_setopt(curl, CURLOPT_CLOSESOCKETDATA, canceller);
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, options_.protocols.c_str());
  curl_easy_setopt(curl, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
  // The server is reached directly, never through $http_proxy & co.
  curl_easy_setopt(curl, CURLOPT_NOPROXY, "*");
  std::vector<std::string> headers = {"Expect:"};
  if (!content_type.empty()) headers.push_back(absl::StrCat("Content-Type: ", content_type));
  if (options_.configure) options_.configure(curl, &headers);
  struct curl_slist* list = nullptr;
  for (const std::string& header : headers) list = curl_slist_append(list, header.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, list);
  return list;
}

absl::Status CurlClient::TransportError(void* handle, int curl_code, const char* detail) const {
  std::string what = detail != nullptr && *detail
                         ? std::string(detail)
                         : curl_easy_strerror(static_cast<CURLcode>(curl_code));
  long os_errno = 0;
  if (curl_code == CURLE_COULDNT_CONNECT &&
      curl_easy_getinfo(static_cast<CURL*>(handle), CURLINFO_OS_ERRNO, &os_errno) == CURLE_OK &&
      os_errno != 0) {
    // curl words a Unix socket as TCP ("localhost port 80"); say what the
    // connect said.
    what = absl::StrCat("connect: ", std::strerror(static_cast<int>(os_errno)));
  }
  if (curl_code == CURLE_OPERATION_TIMEDOUT) {
    return absl::DeadlineExceededError(
        absl::StrCat(options_.peer, " did not answer in time: ", what));
  }
  return absl::UnavailableError(absl::StrCat(options_.peer, " is not reachable: ", what));
}

absl::StatusOr<HttpResponse> CurlClient::Request(absl::string_view method, absl::string_view path,
                                                 absl::string_view body,
                                                 absl::string_view content_type,
                                                 absl::Duration timeout) const {
  CURL* curl = static_cast<CURL*>(TakeHandle());
  if (curl == nullptr) return absl::ResourceExhaustedError("curl_easy_init failed");
  auto* headers = static_cast<struct curl_slist*>(Setup(curl, path, nullptr, content_type));
  const std::string method_str(method);
  const std::string body_str(body);
  if (method == "POST") {
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
  } else if (method != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method_str.c_str());
  }
  if (method == "POST" || !body_str.empty()) {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body_str.c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body_str.size()));
  }
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, std::max<long>(1, absl::ToInt64Milliseconds(timeout)));
  HttpResponse response;
  BodySink sink{&response.body, options_.max_body_bytes};
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, AppendBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &sink);
  char error[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  CURLcode code = curl_easy_perform(curl);
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.status);
  absl::Status status;
  if (sink.overflow) {
    status = absl::ResourceExhaustedError(absl::StrCat(
        method, " ", path, ": the answer of ", options_.peer, " exceeds ", options_.max_body_bytes,
        " bytes"));
  } else if (code != CURLE_OK) {
    status = TransportError(curl, code, error);
  }
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, nullptr);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, nullptr);
  curl_slist_free_all(headers);
  if (!status.ok()) {
    curl_easy_cleanup(curl);  // a broken connection is not worth keeping
    return status;
  }
  ReturnHandle(curl);
  return response;
}

absl::Status CurlClient::Stream(absl::string_view path, const DataFn& on_data,
                                StreamCanceller* canceller, long* status_out,
                                std::string* error_body) const {
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return absl::ResourceExhaustedError("curl_easy_init failed");
  auto* headers = static_cast<struct curl_slist*>(Setup(curl, path, canceller, ""));
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
  absl::Status transport = code == CURLE_OK ? absl::OkStatus() : TransportError(curl, code, error);
  curl_easy_cleanup(curl);
  curl_slist_free_all(headers);
  *status_out = state.status;
  if (state.stopped_by_sink || (canceller != nullptr && canceller->cancelled())) {
    return absl::OkStatus();
  }
  return transport;
}

std::string JsonErrorMessage(absl::string_view body) {
  auto parsed = nlohmann::json::parse(body.begin(), body.end(), nullptr, false);
  if (parsed.is_object()) {
    auto it = parsed.find("message");
    if (it != parsed.end() && it->is_string()) return it->get<std::string>();
  }
  std::string text(body.substr(0, 1024));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text;
}

}  // namespace agentix::providers::curl_http
