// EngineHttp: HTTP/1.1 to a container engine's API (Docker Engine API, which
// podman's compat service also speaks) over its Unix socket, with libcurl.
// Short requests reuse pooled curl handles (and so their keep-alive
// connections); streams (events, logs) get their own handle and can be
// cancelled from another thread.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace agentix::providers::engine {

struct HttpResponse {
  long status = 0;
  std::string body;
};

// Ends a running Stream from another thread: shuts its socket down, so a
// stream blocked on an idle engine returns at once.
class StreamCanceller {
 public:
  void Cancel();
  bool cancelled() const { return cancelled_.load(); }

  // Used by EngineHttp while the stream's socket is open.
  void SetSocket(int fd);
  void ClearSocket(int fd);

 private:
  std::atomic<bool> cancelled_{false};
  absl::Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
};

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
  void* TakeHandle() const;
  void ReturnHandle(void* handle) const;
  absl::Status TransportError(void* handle, int curl_code, const char* detail) const;

  const std::string socket_path_;
  const std::string api_prefix_;
  mutable absl::Mutex mu_;
  mutable std::vector<void*> idle_ ABSL_GUARDED_BY(mu_);  // CURL*
};

// The engine's own error message from a JSON error body ({"message": ...}),
// or the body itself when it is not one.
std::string EngineMessage(absl::string_view body);

}  // namespace agentix::providers::engine
