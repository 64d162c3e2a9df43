// kubeconfig and in-cluster service-account configuration, read as every
// Kubernetes client reads them; and TLS to an API server with the CA they
// name (the fake API server over HTTPS with a certificate made here).
#include "providers/backends/kubernetes/kube_config.h"

#include <stdlib.h>

#include <fstream>
#include <map>
#include <string>

#include <catch2/catch.hpp>

#include "absl/strings/escaping.h"
#include "providers/backends/kubernetes/fake_apiserver_process.h"
#include "providers/backends/kubernetes/kube_http.h"
#include "testing/status_matchers.h"

namespace agentix::providers::kubernetes {
namespace {

struct TempDir {
  TempDir() {
    std::string tmpl = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") +
                       "/kubecfg-XXXXXX";
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  std::string Write(const std::string& name, const std::string& text) const {
    std::string file = path + "/" + name;
    std::ofstream(file) << text;
    return file;
  }
  std::string path;
};

constexpr char kCa[] = "-----BEGIN CERTIFICATE-----\nMIIfake\n-----END CERTIFICATE-----\n";

TEST_CASE("kubeconfig: current-context picks cluster, user and namespace") {
  TempDir dir;
  dir.Write("ca.crt", kCa);
  dir.Write("token", "  file-token\n");
  std::string path = dir.Write("config", R"(apiVersion: v1
kind: Config
current-context: dev
clusters:
- name: prod
  cluster:
    server: https://prod.example:6443
- name: dev-cluster
  cluster:
    server: https://10.0.0.1:6443/
    certificate-authority: ca.crt
contexts:
- name: prod
  context: {cluster: prod, user: admin}
- name: dev
  context:
    cluster: dev-cluster
    user: dev-user
    namespace: sandboxes
users:
- name: admin
  user:
    token: admin-token
- name: dev-user
  user:
    tokenFile: token
)");
  REQUIRE_OK_AND_ASSIGN(KubeConfig c, LoadKubeconfig(path));
  CHECK(c.server == "https://10.0.0.1:6443");
  CHECK(c.ca_pem == kCa);  // relative to the kubeconfig's directory
  CHECK(c.token == "file-token");
  CHECK(c.token_file == dir.path + "/token");
  CHECK(c.ns == "sandboxes");
  CHECK_FALSE(c.insecure_skip_tls_verify);

  REQUIRE_OK_AND_ASSIGN(KubeConfig prod, LoadKubeconfig(path, "prod"));
  CHECK(prod.server == "https://prod.example:6443");
  CHECK(prod.token == "admin-token");
  CHECK(prod.ns == "default");
  CHECK(prod.ca_pem.empty());
}

TEST_CASE("kubeconfig: *-data fields are base64 and win over files; JSON works too") {
  TempDir dir;
  std::string cert = "-----BEGIN CERTIFICATE-----\nclient\n-----END CERTIFICATE-----\n";
  std::string key = "-----BEGIN PRIVATE KEY-----\nkey\n-----END PRIVATE KEY-----\n";
  std::string path = dir.Write(
      "config.json",
      std::string(R"({"current-context": "c", "clusters": [{"name": "k", "cluster": {"server": "https://k:443", "certificate-authority": "/nonexistent", "certificate-authority-data": ")") +
          absl::Base64Escape(kCa) +
          R"(", "insecure-skip-tls-verify": true}}], "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}], "users": [{"name": "u", "user": {"client-certificate-data": ")" +
          absl::Base64Escape(cert) + R"(", "client-key-data": ")" + absl::Base64Escape(key) +
          R"("}}]})");
  REQUIRE_OK_AND_ASSIGN(KubeConfig c, LoadKubeconfig(path));
  CHECK(c.ca_pem == kCa);
  CHECK(c.client_cert_pem == cert);
  CHECK(c.client_key_pem == key);
  CHECK(c.insecure_skip_tls_verify);
  CHECK(c.token.empty());
}

TEST_CASE("kubeconfig: what cannot be used is a definite error naming the problem") {
  TempDir dir;
  std::map<std::string, std::pair<std::string, std::string>> cases = {
      {"no current-context",
       {"clusters: []\n", "no current-context"}},
      {"missing context",
       {"current-context: x\ncontexts: []\n", "no context 'x'"}},
      {"missing cluster",
       {"current-context: x\ncontexts:\n- name: x\n  context: {cluster: nope}\n",
        "names cluster 'nope'"}},
      {"exec plugin",
       {"current-context: x\nclusters:\n- name: k\n  cluster: {server: 'https://k'}\n"
        "contexts:\n- name: x\n  context: {cluster: k, user: u}\n"
        "users:\n- name: u\n  user:\n    exec: {command: aws}\n",
        "credential plugin"}},
      {"bad base64",
       {"current-context: x\nclusters:\n- name: k\n  cluster: {server: 'https://k', "
        "certificate-authority-data: '!!!'}\ncontexts:\n- name: x\n  context: {cluster: k}\n",
        "not valid base64"}},
      {"not yaml", {"current-context: [unclosed\n", "not valid YAML"}},
      {"no server",
       {"current-context: x\nclusters:\n- name: k\n  cluster: {}\n"
        "contexts:\n- name: x\n  context: {cluster: k}\n",
        "no http(s) server"}},
  };
  for (const auto& [name, c] : cases) {
    INFO(name);
    auto loaded = LoadKubeconfig(dir.Write("config", c.first));
    REQUIRE_FALSE(loaded.ok());
    CHECK(std::string(loaded.status().message()).find(c.second) != std::string::npos);
  }
  auto missing = LoadKubeconfig(dir.path + "/absent");
  CHECK(missing.status().code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("in-cluster: the service account's token, CA and namespace, the service env") {
  TempDir dir;
  dir.Write("token", "sa-token\n");
  dir.Write("ca.crt", kCa);
  dir.Write("namespace", "agents\n");
  std::map<std::string, std::string> env = {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
                                            {"KUBERNETES_SERVICE_PORT", "443"}};
  auto getenv_fn = [&](const char* name) { return env[name]; };
  REQUIRE_OK_AND_ASSIGN(KubeConfig c, LoadInCluster(dir.path, getenv_fn));
  CHECK(c.server == "https://10.96.0.1:443");
  CHECK(c.token == "sa-token");
  CHECK(c.token_file == dir.path + "/token");
  CHECK(c.ca_pem == kCa);
  CHECK(c.ns == "agents");
  env["KUBERNETES_SERVICE_HOST"] = "fd00::1";
  REQUIRE_OK_AND_ASSIGN(c, LoadInCluster(dir.path, getenv_fn));
  CHECK(c.server == "https://[fd00::1]:443");
  env.clear();
  auto outside = LoadInCluster(dir.path, getenv_fn);
  CHECK(outside.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(outside.status().message()).find("KUBERNETES_SERVICE_HOST") !=
        std::string::npos);
}

TEST_CASE("TLS: the API server is trusted through the kubeconfig's CA only") {
  TempDir dir;
  std::string cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=fake-apiserver "
                    "-addext subjectAltName=IP:127.0.0.1 -keyout " + dir.path + "/key.pem -out " +
                    dir.path + "/cert.pem 2>/dev/null";
  REQUIRE(system(cmd.c_str()) == 0);
  auto server = testing::FakeApiServer::Start(
      {"--tls-cert", dir.path + "/cert.pem", "--tls-key", dir.path + "/key.pem"});
  REQUIRE(server.ok());
  std::ifstream in(dir.path + "/cert.pem");
  std::string ca((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string path = dir.Write(
      "config",
      "current-context: x\nclusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:" +
          std::to_string((*server)->port()) + "\n    certificate-authority-data: " +
          absl::Base64Escape(ca) + "\ncontexts:\n- name: x\n  context: {cluster: k, user: u}\n" +
          "users:\n- name: u\n  user: {token: " + testing::FakeApiServer::kToken + "}\n");
  REQUIRE_OK_AND_ASSIGN(KubeConfig config, LoadKubeconfig(path));
  KubeHttp http(config);
  REQUIRE_OK_AND_ASSIGN(HttpResponse ok, http.Request("GET", "/version", "", "", absl::Seconds(5)));
  CHECK(ok.status == 200);
  // Without the CA (system roots only) the same server is not trusted.
  config.ca_pem.clear();
  KubeHttp untrusted(config);
  auto refused = untrusted.Request("GET", "/version", "", "", absl::Seconds(5));
  CHECK(refused.status().code() == absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace agentix::providers::kubernetes
