#include "providers/backends/engine/engine_http.h"

#include <curl/curl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace agentix::providers::engine {
namespace {

// Bodies of short requests are JSON documents of a few KiB; a larger one is
// a misbehaving engine, not something to buffer.
constexpr size_t kMaxBodyBytes = size_t{16} << 20;
constexpr size_t kMaxErrorBytes = 64 << 10;

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_NOTHING); });
}

// Close-on-exec sockets: providerd spawns processes (the local backend), and
// they must not inherit a connection to the engine.
curl_socket_t OpenSocket(void* clientp, curlsocktype, struct curl_sockaddr* address) {
  auto* canceller = static_cast<StreamCanceller*>(clientp);
  if (canceller != nullptr && canceller->cancelled()) return CURL_SOCKET_BAD;
  int fd = ::socket(address->family, address->socktype | SOCK_CLOEXEC,
                    address->protocol);
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
  const EngineHttp::DataFn* on_data;
  std::string* error_body;
  long status = 0;
  bool stopped_by_sink = false;
};

size_t StreamBody(char* data, size_t size, size_t n, void* userp) {
  auto* state = static_cast<StreamState*>(userp);
  if (state->status == 0) {
    curl_easy_getinfo(state->curl, CURLINFO_RESPONSE_CODE, &state->status);
  }
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

void CommonOptions(CURL* curl, const std::string& socket_path, const std::string& url,
                   StreamCanceller* canceller) {
  curl_easy_setopt(curl, CURLOPT_UNIX_SOCKET_PATH, socket_path.c_str());
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_OPENSOCKETFUNCTION, OpenSocket);
  curl_easy_setopt(curl, CURLOPT_OPENSOCKETDATA, canceller);
  curl_easy_setopt(curl, CURLOPT_CLOSESOCKETFUNCTION, CloseSocket);
  curl_easy_setopt(curl, CURLOPT_CLOSESOCKETDATA, canceller);
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http");
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

EngineHttp::EngineHttp(std::string socket_path, std::string api_prefix)
    : socket_path_(std::move(socket_path)), api_prefix_(std::move(api_prefix)) {
  GlobalInit();
}

EngineHttp::~EngineHttp() {
  absl::MutexLock lock(&mu_);
  for (void* handle : idle_) curl_easy_cleanup(static_cast<CURL*>(handle));
}

void* EngineHttp::TakeHandle() const {
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

void EngineHttp::ReturnHandle(void* handle) const {
  // curl_easy_reset keeps the handle's live connection for the next request.
  curl_easy_reset(static_cast<CURL*>(handle));
  absl::MutexLock lock(&mu_);
  idle_.push_back(handle);
}

absl::Status EngineHttp::TransportError(void* handle, int curl_code, const char* detail) const {
  std::string what = detail != nullptr && *detail
                         ? std::string(detail)
                         : curl_easy_strerror(static_cast<CURLcode>(curl_code));
  long os_errno = 0;
  if (curl_code == CURLE_COULDNT_CONNECT &&
      curl_easy_getinfo(static_cast<CURL*>(handle), CURLINFO_OS_ERRNO, &os_errno) == CURLE_OK &&
      os_errno != 0) {
    // curl words it as TCP ("localhost port 80"); say what the socket said.
    what = absl::StrCat("connect: ", std::strerror(static_cast<int>(os_errno)));
  }
  if (curl_code == CURLE_OPERATION_TIMEDOUT) {
    return absl::DeadlineExceededError(absl::StrCat(
        "container engine at unix://", socket_path_, " did not answer in time: ", what));
  }
  return absl::UnavailableError(
      absl::StrCat("container engine at unix://", socket_path_, " is not reachable: ", what));
}

absl::StatusOr<HttpResponse> EngineHttp::Request(absl::string_view method,
                                                 absl::string_view path,
                                                 absl::string_view body,
                                                 absl::Duration timeout) const {
  CURL* curl = static_cast<CURL*>(TakeHandle());
  if (curl == nullptr) return absl::ResourceExhaustedError("curl_easy_init failed");
  std::string url = absl::StrCat("http://localhost", api_prefix_, path);
  CommonOptions(curl, socket_path_, url, nullptr);
  std::string method_str(method);
  std::string body_str(body);
  struct curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, "Expect:");
  if (method == "POST") {
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body_str.c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body_str.size()));
    if (!body_str.empty()) headers = curl_slist_append(headers, "Content-Type: application/json");
  } else if (method != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method_str.c_str());
  }
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
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
  absl::Status transport = code == CURLE_OK ? absl::OkStatus() : TransportError(curl, code, error);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, nullptr);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, nullptr);
  curl_slist_free_all(headers);
  absl::Status status;
  if (sink.overflow) {
    status = absl::ResourceExhaustedError(
        absl::StrCat(method, " ", path, ": the engine's answer exceeds ", kMaxBodyBytes, " bytes"));
  } else if (!transport.ok()) {
    status = transport;
  }
  if (status.ok()) {
    ReturnHandle(curl);
  } else {
    curl_easy_cleanup(curl);  // a broken connection is not worth keeping
    return status;
  }
  return response;
}

absl::Status EngineHttp::Stream(absl::string_view path, const DataFn& on_data,
                                StreamCanceller* canceller, long* status_out,
                                std::string* error_body) const {
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return absl::ResourceExhaustedError("curl_easy_init failed");
  std::string url = absl::StrCat("http://localhost", api_prefix_, path);
  CommonOptions(curl, socket_path_, url, canceller);
  StreamState state{curl, &on_data, error_body};
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, StreamBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &state);
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, StreamProgress);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, canceller);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
  char error[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  CURLcode code = curl_easy_perform(curl);
  if (state.status == 0) curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &state.status);
  absl::Status transport = code == CURLE_OK ? absl::OkStatus() : TransportError(curl, code, error);
  curl_easy_cleanup(curl);
  *status_out = state.status;
  if (state.stopped_by_sink || (canceller != nullptr && canceller->cancelled())) {
    return absl::OkStatus();
  }
  return transport;
}

std::string EngineMessage(absl::string_view body) {
  auto parsed = nlohmann::json::parse(body.begin(), body.end(), nullptr, false);
  if (parsed.is_object()) {
    auto it = parsed.find("message");
    if (it != parsed.end() && it->is_string()) return it->get<std::string>();
  }
  std::string text(body.substr(0, 1024));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text;
}

}  // namespace agentix::providers::engine
