// Where the Kubernetes API server is and how to authenticate to it, read the
// way every Kubernetes client reads it: a kubeconfig file (its
// current-context, or a named one) or the in-cluster service account
// (/var/run/secrets/kubernetes.io/serviceaccount + KUBERNETES_SERVICE_HOST/PORT).
#pragma once

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace agentix::providers::kubernetes {

struct KubeConfig {
  std::string server;          // "https://10.0.0.1:443" (no trailing slash)
  std::string ca_pem;          // cluster CA bundle (PEM); empty: system CAs
  bool insecure_skip_tls_verify = false;
  std::string token;           // bearer token
  std::string token_file;      // re-read on 401 (projected tokens rotate)
  std::string client_cert_pem; // client certificate auth
  std::string client_key_pem;
  std::string ns;              // the context's (or service account's) namespace
  std::string source;          // "kubeconfig /path (context x)" / "in-cluster"
};

// Parses a kubeconfig (YAML or JSON). `context` empty: current-context.
// Relative file paths resolve against the kubeconfig's directory, as kubectl
// does. exec / auth-provider credential plugins are FAILED_PRECONDITION.
absl::StatusOr<KubeConfig> LoadKubeconfig(const std::string& path,
                                          const std::string& context = "");

// The Pod's service account. `root` is the directory holding token, ca.crt
// and namespace; `getenv` looks up KUBERNETES_SERVICE_HOST/PORT.
using EnvFn = std::function<std::string(const char*)>;
absl::StatusOr<KubeConfig> LoadInCluster(
    const std::string& root = "/var/run/secrets/kubernetes.io/serviceaccount",
    const EnvFn& getenv = nullptr);

// Base64 (standard alphabet, padding optional) for *-data fields.
absl::StatusOr<std::string> DecodeBase64Field(absl::string_view field,
                                              absl::string_view value);

}  // namespace agentix::providers::kubernetes
