#include "providers/backends/engine/engine_http.h"

#include "absl/strings/str_cat.h"

namespace agentix::providers::engine {
namespace {

curl_http::CurlClientOptions ClientOptions(const std::string& socket_path,
                                           const std::string& api_prefix) {
  curl_http::CurlClientOptions options;
  options.base_url = absl::StrCat("http://localhost", api_prefix);
  options.unix_socket = socket_path;
  options.protocols = "http";
  options.peer = absl::StrCat("container engine at unix://", socket_path);
  // Bodies of short requests are JSON documents of a few KiB; a larger one
  // is a misbehaving engine, not something to buffer.
  options.max_body_bytes = size_t{16} << 20;
  return options;
}

}  // namespace

EngineHttp::EngineHttp(std::string socket_path, std::string api_prefix)
    : socket_path_(std::move(socket_path)), client_(ClientOptions(socket_path_, api_prefix)) {}

EngineHttp::~EngineHttp() = default;

absl::StatusOr<HttpResponse> EngineHttp::Request(absl::string_view method,
                                                 absl::string_view path,
                                                 absl::string_view body,
                                                 absl::Duration timeout) const {
  return client_.Request(method, path, body, body.empty() ? "" : "application/json", timeout);
}

absl::Status EngineHttp::Stream(absl::string_view path, const DataFn& on_data,
                                StreamCanceller* canceller, long* status_out,
                                std::string* error_body) const {
  return client_.Stream(path, on_data, canceller, status_out, error_body);
}

}  // namespace agentix::providers::engine
