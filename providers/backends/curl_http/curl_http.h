// CurlClient: HTTP/1.1 with libcurl for the provider backends that talk to
// a server over HTTP — a container engine on its Unix socket, the Kubernetes
// API server over HTTPS. Short requests reuse pooled easy handles (and so
// their keep-alive connections); streams (events, logs, watches) get their
// own handle and can be cancelled from another thread. Sockets are
// close-on-exec (providerd spawns processes), proxies from the environment
// are ignored, and bodies are bounded.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace agentix::providers::curl_http {

struct HttpResponse {
  long status = 0;
  std::string body;
};

// Ends a running Stream from another thread: shuts its socket down, so a
// stream blocked on an idle server returns at once.
class StreamCanceller {
 public:
  void Cancel();
  bool cancelled() const { return cancelled_.load(); }

  // Used by CurlClient while the stream's socket is open.
  void SetSocket(int fd);
  void ClearSocket(int fd);

 private:
  std::atomic<bool> cancelled_{false};
  absl::Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
};

struct CurlClientOptions {
  // Put in front of every path: "http://localhost/v1.41", "https://host:6443".
  std::string base_url;
  // Non-empty: connect to this Unix socket instead of the URL's host.
  std::string unix_socket;
  // CURLOPT_PROTOCOLS_STR: what the URL may use.
  std::string protocols = "http";
  // Names the server in transport errors ("container engine at unix://...").
  std::string peer;
  // A longer answer to a short request is RESOURCE_EXHAUSTED.
  size_t max_body_bytes = size_t{16} << 20;
  // Called on each transfer's handle (a CURL*) after the common options:
  // TLS settings; may add request headers ("Name: value").
  std::function<void(void* curl, std::vector<std::string>* headers)> configure;
};

class CurlClient {
 public:
  explicit CurlClient(CurlClientOptions options);
  ~CurlClient();
  CurlClient(const CurlClient&) = delete;
  CurlClient& operator=(const CurlClient&) = delete;

  const CurlClientOptions& options() const { return options_; }

  // One request; `path` includes the query. The body is sent for POST and
  // whenever it is not empty; `content_type`, when not empty, is its
  // Content-Type. Transport failures (no socket, refused, reset, TLS) are
  // UNAVAILABLE naming the peer, the timeout DEADLINE_EXCEEDED; any HTTP
  // status is returned as is.
  absl::StatusOr<HttpResponse> Request(absl::string_view method, absl::string_view path,
                                       absl::string_view body, absl::string_view content_type,
                                       absl::Duration timeout) const;

  // GET `path` and hand the body to `on_data` as it arrives, until the
  // server ends it, `on_data` returns false, or `canceller` cancels (all
  // three are OK). A non-2xx status is returned in `status_out` with the
  // body (the server's error, at most 64 KiB) in `error_body`, and on_data is
  // not called.
  using DataFn = std::function<bool(absl::string_view)>;
  absl::Status Stream(absl::string_view path, const DataFn& on_data, StreamCanceller* canceller,
                      long* status_out, std::string* error_body) const;

 private:
  void* TakeHandle() const;
  void ReturnHandle(void* handle) const;
  // Common options and headers; returns the curl_slist to free after the
  // transfer.
  void* Setup(void* handle, absl::string_view path, StreamCanceller* canceller,
              absl::string_view content_type) const;
  absl::Status TransportError(void* handle, int curl_code, const char* detail) const;

  const CurlClientOptions options_;
  mutable absl::Mutex mu_;
  mutable std::vector<void*> idle_ ABSL_GUARDED_BY(mu_);  // CURL*
};

// The "message" of a JSON error body ({"message": ...}, as the Docker
// Engine and Kubernetes APIs answer), or the body itself (its first 1 KiB,
// trailing newlines cut) when it is not one.
std::string JsonErrorMessage(absl::string_view body);

}  // namespace agentix::providers::curl_http
