// EngineHttp: HTTP/1.1 to a container engine's API (Docker Engine API, which
// podman's compat service also speaks) over its Unix socket: a
// curl_http::CurlClient (pooled keep-alive handles, cancellable streams).
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "providers/backends/curl_http/curl_http.h"

namespace agentix::providers::engine {

using curl_http::HttpResponse;
using curl_http::StreamCanceller;

class EngineHttp {
 public:
  // `api_prefix` goes in front of every path ("/v1.41": the floor version).
  EngineHttp(std::string socket_path, std::string api_prefix);
  ~EngineHttp();
  EngineHttp(const EngineHttp&) = delete;
  EngineHttp& operator=(const EngineHttp&) = delete;

  const std::string& socket_path() const { return socket_path_; }

  // One request. `body`, when not empty, is sent as application/json.
  // Transport failures (no socket, refused, reset) are UNAVAILABLE; the
  // timeout is DEADLINE_EXCEEDED; any HTTP status is returned as is.
  absl::StatusOr<HttpResponse> Request(absl::string_view method,
                                       absl::string_view path,
                                       absl::string_view body,
                                       absl::Duration timeout) const;

  // GET `path` and hand the body to `on_data` as it arrives, until the
  // engine ends it, `on_data` returns false, or `canceller` cancels (all
  // three are OK). A non-2xx status is returned in `status_out` with the
  // body (the engine's error) in `error_body`, and on_data is not called.
  using DataFn = std::function<bool(absl::string_view)>;
  absl::Status Stream(absl::string_view path, const DataFn& on_data,
                      StreamCanceller* canceller, long* status_out,
                      std::string* error_body) const;

 private:
  const std::string socket_path_;
  const curl_http::CurlClient client_;
};

}  // namespace agentix::providers::engine
