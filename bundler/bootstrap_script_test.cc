#include "bundler/bootstrap_script.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include "bundler/command.h"
#include "bundler/file_tree.h"
#include "bundler/test_util.h"
#include "testing/status_matchers.h"

namespace agentix::bundler {
namespace {

namespace fs = std::filesystem;

// A fake runtime root whose agentix-sandboxd prints its arguments, one per
// line, so the script's contract is checked by running it under busybox sh.
std::string FakeRuntime() {
  const std::string root = testing::FreshDir("bootstrap_runtime");
  fs::create_directories(root + "/bin");
  fs::create_symlink("/bin/busybox", root + "/bin/sh");
  REQUIRE_OK(WriteFile(root + "/bin/agentix-sandboxd",
                       "#!/bin/busybox sh\nfor a in \"$@\"; do echo \"$a\"; "
                       "done\necho \"PATH=$PATH\"\n"
                       "echo \"AGENTIX_ADDED_PATH=$AGENTIX_ADDED_PATH\"\n",
                       /*executable=*/true));
  REQUIRE_OK(WriteFile(root + "/bootstrap.sh", BootstrapScript(root),
                       /*executable=*/true));
  return root;
}

std::string Run(const std::string& root, std::vector<std::string> env,
                std::vector<std::string> args = {}) {
  std::vector<std::string> argv = {"/usr/bin/env", "-i"};
  argv.insert(argv.end(), env.begin(), env.end());
  argv.push_back(root + "/bootstrap.sh");
  argv.insert(argv.end(), args.begin(), args.end());
  REQUIRE_OK_AND_ASSIGN(CommandResult result, RunCommandOrError(argv));
  return result.out;
}

TEST_CASE("bootstrap.sh listens on AGENTIX_LISTEN", "[bundler]") {
  const std::string root = FakeRuntime();
  const std::string out =
      Run(root, {"AGENTIX_LISTEN=unix://" + root + "/sock/a.sock"},
          {"--max-retained-results", "7"});
  CHECK(out.find("--listen\nunix://" + root + "/sock/a.sock\n") !=
        std::string::npos);
  CHECK(fs::is_directory(root + "/sock"));  // socket dir created
  CHECK(out.find("--worker\n" + root + "/bin/agentix-worker\n") !=
        std::string::npos);
  CHECK(out.find("--venv\n" + root + "/venv\n") != std::string::npos);
  CHECK(out.find("--python-home\n" + root + "/python\n") != std::string::npos);
  CHECK(out.find("--max-retained-results\n7\n") != std::string::npos);
  CHECK(out.find("0.0.0.0") == std::string::npos);
  // busybox sh gives an unset PATH its default, which stays behind ours.
  CHECK(out.find("PATH=" + root + "/venv/bin:" + root + "/bin") !=
        std::string::npos);
}

TEST_CASE("bootstrap.sh falls back to AGENTIX_BIND_HOST/PORT", "[bundler]") {
  const std::string root = FakeRuntime();
  // Loopback unless all interfaces are asked for by name; a set but empty
  // host is the default too.
  for (const auto& env : {std::vector<std::string>{},
                          std::vector<std::string>{"AGENTIX_BIND_HOST="}}) {
    const std::string out = Run(root, env);
    CHECK(out.find("--listen\n127.0.0.1:8000\n") != std::string::npos);
    CHECK(out.find("0.0.0.0") == std::string::npos);
  }
  CHECK(Run(root, {"AGENTIX_BIND_HOST=0.0.0.0"})
            .find("--listen\n0.0.0.0:8000\n") != std::string::npos);
  const std::string out = Run(
      root, {"AGENTIX_BIND_HOST=10.1.2.3", "AGENTIX_BIND_PORT=9001",
             "AGENTIX_PYTHON_PATH=/work/a:/work/b", "PATH=/usr/bin"});
  CHECK(out.find("--listen\n10.1.2.3:9001\n") != std::string::npos);
  CHECK(out.find("--python-path\n/work/a:/work/b\n") != std::string::npos);
  CHECK(out.find(":" + root + "/bin:/usr/bin\n") != std::string::npos);
  // What was put in front of PATH is recorded, for image_env() to take off.
  CHECK(out.find("\nAGENTIX_ADDED_PATH=" + root + "/venv/bin:" + root +
                 "/bin\n") != std::string::npos);
}

}  // namespace
}  // namespace agentix::bundler
