// KubeHttp: HTTPS + JSON to the Kubernetes API server with libcurl. Bearer
// token or client-certificate auth, the cluster CA from the kubeconfig or the
// service account; short requests reuse pooled handles (keep-alive), streams
// (watch, log follow) get their own handle and can be cancelled.
#pragma once

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "providers/backends/curl_http/curl_http.h"
#include "providers/backends/kubernetes/kube_config.h"

namespace agentix::providers::kubernetes {

using curl_http::HttpResponse;
using curl_http::StreamCanceller;

class KubeHttp {
 public:
  explicit KubeHttp(KubeConfig config);
  ~KubeHttp();
  KubeHttp(const KubeHttp&) = delete;
  KubeHttp& operator=(const KubeHttp&) = delete;

  const KubeConfig& config() const { return config_; }

  // One request; `path` includes the query. Transport failures are
  // UNAVAILABLE, the timeout DEADLINE_EXCEEDED; any HTTP status is returned
  // as is. A 401 re-reads a token file once and retries (rotated tokens).
  absl::StatusOr<HttpResponse> Request(absl::string_view method, absl::string_view path,
                                       absl::string_view body, absl::string_view content_type,
                                       absl::Duration timeout) const;

  // GET `path`, handing the body to `on_data` as it arrives (see
  // curl_http::CurlClient::Stream for the contract).
  using DataFn = std::function<bool(absl::string_view)>;
  absl::Status Stream(absl::string_view path, const DataFn& on_data, StreamCanceller* canceller,
                      long* status_out, std::string* error_body) const;

 private:
  static curl_http::CurlClientOptions ClientOptions(const KubeHttp* http, const KubeConfig& config);
  void Configure(void* curl, std::vector<std::string>* headers) const;
  std::string Token() const;
  bool ReloadToken() const;

  const KubeConfig config_;
  mutable absl::Mutex mu_;
  mutable std::string token_ ABSL_GUARDED_BY(mu_);
  // After config_ and token_: its configure hook reads both.
  const curl_http::CurlClient client_;
};

// A non-2xx answer as a definite status carrying the API server's message:
// 400/422 INVALID_ARGUMENT, 401 UNAUTHENTICATED, 403 PERMISSION_DENIED,
// 404 NOT_FOUND, 409 ALREADY_EXISTS (AlreadyExists) / ABORTED (Conflict),
// 410 OUT_OF_RANGE, 429/5xx UNAVAILABLE.
absl::Status KubeError(const HttpResponse& response, absl::string_view what);

}  // namespace agentix::providers::kubernetes
