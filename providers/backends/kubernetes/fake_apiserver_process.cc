#include "providers/backends/kubernetes/fake_apiserver_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "providers/backends/kubernetes/kube_http.h"

namespace agentix::providers::kubernetes::testing {

absl::StatusOr<std::unique_ptr<FakeApiServer>> FakeApiServer::Start(
    std::vector<std::string> extra_args, std::string script) {
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
    return absl::InternalError("pipe");
  }
  std::vector<std::string> args = {"/usr/bin/python3", script,
                                   "--token", kToken};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError("fork");
  if (pid == 0) {
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  std::unique_ptr<FakeApiServer> server(new FakeApiServer());
  server->pid_ = pid;
  server->stdin_fd_ = in[1];
  std::string line;
  char c;
  while (::read(out[0], &c, 1) == 1 && c != '\n') line.push_back(c);
  ::close(out[0]);
  auto parsed = nlohmann::json::parse(line, nullptr, false);
  if (!parsed.is_object() || !parsed.contains("port")) {
    return absl::InternalError(absl::StrCat("fake API server did not start: '", line, "'"));
  }
  server->port_ = parsed["port"].get<int>();
  return server;
}

FakeApiServer::~FakeApiServer() {
  if (stdin_fd_ >= 0) ::close(stdin_fd_);
  if (pid_ > 0) {
    int status;
    for (int i = 0; i < 50; ++i) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) return;
      ::usleep(20000);
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
  }
}

KubeConfig FakeApiServer::Config() const {
  KubeConfig config;
  config.server = absl::StrCat("http://127.0.0.1:", port_);
  config.token = kToken;
  config.ns = "ns";
  config.source = "fake API server";
  return config;
}

nlohmann::json FakeApiServer::Control(const std::string& op, const nlohmann::json& body) {
  KubeHttp http(Config());
  auto response = http.Request("POST", absl::StrCat("/_fake/", op), body.dump(), "",
                               absl::Seconds(10));
  if (!response.ok()) return nlohmann::json{{"error", response.status().ToString()}};
  return nlohmann::json::parse(response->body, nullptr, false);
}

void FakeApiServer::ClearRequests() {
  KubeHttp http(Config());
  (void)http.Request("DELETE", "/_fake/requests", "", "", absl::Seconds(10));
}

nlohmann::json FakeApiServer::Requests() {
  KubeHttp http(Config());
  auto response = http.Request("GET", "/_fake/requests", "", "", absl::Seconds(10));
  if (!response.ok()) return nlohmann::json::array();
  return nlohmann::json::parse(response->body, nullptr, false);
}

int FakeApiServer::Writes(const std::string& method, const std::string& needle) {
  int n = 0;
  for (const auto& r : Requests()) {
    if (!r.value("write", false)) continue;
    if (!method.empty() && r.value("method", "") != method) continue;
    if (!needle.empty() && !absl::StrContains(r.value("path", ""), needle)) continue;
    n++;
  }
  return n;
}

}  // namespace agentix::providers::kubernetes::testing
