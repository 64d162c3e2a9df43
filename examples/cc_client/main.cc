// Calls examples/hello's functions from C++ (host/cc/README.md).
//
//   bazel build //examples/cc_client //sandbox:agentix-sandboxd //worker:agentix-worker
//   bazel-bin/sandbox/agentix-sandboxd --listen unix:///tmp/agentix.sock
//       --worker bazel-bin/worker/agentix-worker --python-path examples/hello &   (one line)
//   bazel-bin/examples/cc_client/cc_client unix:///tmp/agentix.sock
//
// $AGENTIX_TOKEN, when set, is sent as the bearer token.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "agentix/client.h"

int main(int argc, char** argv) {
  agentix::ConnectOptions options;
  options.target = argc > 1 ? argv[1] : "unix:///tmp/agentix.sock";
  if (const char* token = std::getenv("AGENTIX_TOKEN")) options.token = token;
  absl::StatusOr<std::unique_ptr<agentix::Client>> client =
      agentix::Client::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }

  // A plain call with a typed result.
  absl::StatusOr<int64_t> sum = (*client)->Remote<int64_t>("hello_agentix.tools::add", 2, 3);
  if (!sum.ok()) {
    std::fprintf(stderr, "add failed: %s\n", sum.status().ToString().c_str());
    return 1;
  }
  std::printf("add(2, 3) = %ld\n", static_cast<long>(*sum));

  // The sandbox's logs, printed as they come (and before the result they precede).
  auto logs = (*client)->SubscribeLogs([](const agentix::LogRecord& record) {
    std::printf("[sandbox %s] %s\n", record.level_name.c_str(), record.message.c_str());
  });
  if (!logs.ok()) return 1;
  auto counts = (*client)->Remote<std::map<std::string, int64_t>>(
      "hello_agentix.tools::word_count", "the cat and the hat");
  if (!counts.ok()) return 1;
  for (const auto& [word, n] : *counts) std::printf("%s: %ld\n", word.c_str(), static_cast<long>(n));

  // A keyword argument and a deadline; a failure carries the sandbox's error.
  agentix::CallOptions deadline;
  deadline.timeout = absl::Milliseconds(50);
  auto slow = (*client)->RemoteWith<int64_t>(
      "hello_agentix.tools::slow_square", agentix::Arguments(7).Kw("delay", 1.0), deadline);
  std::printf("slow_square with a 50 ms deadline: %s\n", slow.status().ToString().c_str());
  auto failed = (*client)->Remote<int64_t>("hello_agentix.tools::add", 1, "x");
  if (auto error = agentix::GetRemoteError(failed.status())) {
    std::printf("add(1, 'x') raised %s: %s\n", error->type.c_str(), error->message.c_str());
  }
  return 0;
}
