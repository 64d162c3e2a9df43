// A minimal HTTP/1.1 listener for Prometheus scrapes: `GET /metrics` answers
// what `render` returns; any other path is 404, any other method 405. One
// thread polls the listening socket and every connection; a request head
// larger than kMaxRequestBytes gets 431, a connection idle for
// `idle_timeout` or beyond `max_connections` is closed. Every response says
// "Connection: close" and the connection is closed once it is written.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/unique_fd.h"

namespace agentix::providers {

struct MetricsHttpOptions {
  // "HOST:PORT", "[V6]:PORT" or ":PORT" (every interface); port 0 picks one.
  std::string address;
  size_t max_connections = 32;
  absl::Duration idle_timeout = absl::Seconds(10);
};

class MetricsHttpServer {
 public:
  static constexpr size_t kMaxRequestBytes = 8192;

  // Binds and starts the thread. `render` runs on that thread, once per
  // scrape; it must not block for long. InvalidArgument for a malformed
  // address; Unavailable when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      MetricsHttpOptions options, std::function<std::string()> render);
  // Stops the thread and closes every connection.
  ~MetricsHttpServer();

  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }

 private:
  MetricsHttpServer(MetricsHttpOptions options,
                    std::function<std::string()> render, base::UniqueFd listen,
                    base::UniqueFd wake, int port);
  void Loop();

  const MetricsHttpOptions options_;
  const std::function<std::string()> render_;
  base::UniqueFd listen_;
  base::UniqueFd wake_;  // eventfd: written to stop the loop
  const int port_;
  std::thread thread_;
};

}  // namespace agentix::providers
