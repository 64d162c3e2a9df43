// Runs testing/k8s/fake_apiserver.py for a test: a child process on
// 127.0.0.1 that ends when this object (its stdin) goes away.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "providers/backends/kubernetes/kube_config.h"

namespace agentix::providers::kubernetes::testing {

class FakeApiServer {
 public:
  static constexpr char kToken[] = "test-token-0123456789";

  // `extra_args` go to the script (e.g. "--tls-cert", path); `script` is
  // its path (default: relative to a test's runfiles root).
  static absl::StatusOr<std::unique_ptr<FakeApiServer>> Start(
      std::vector<std::string> extra_args = {},
      std::string script = "testing/k8s/fake_apiserver.py");
  ~FakeApiServer();

  int port() const { return port_; }
  // A config for this server: plain HTTP, the right token, namespace "ns".
  KubeConfig Config() const;
  // POST /_fake/<op> with `body`; the answer's JSON.
  nlohmann::json Control(const std::string& op, const nlohmann::json& body = nlohmann::json::object());
  void ClearRequests();
  // The request log (method, path, query, write).
  nlohmann::json Requests();
  // How many writes (POST/PUT/PATCH/DELETE) to paths containing `needle`.
  int Writes(const std::string& method = "", const std::string& needle = "");

 private:
  FakeApiServer() = default;
  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  int port_ = 0;
};

}  // namespace agentix::providers::kubernetes::testing
