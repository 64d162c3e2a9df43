#include "bundler/bootstrap_script.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include <unistd.h>

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

// With a bundled agentix-launch and AGENTIX_EARLY_WORKER=1 (the default of a
// bundle built with early_worker), bootstrap.sh execs the launcher with the
// worker's options and the daemon's command after "--" (the worker arguments
// that follow from the daemon's flags, --python-home included, the launcher
// reads from there: nothing of them before "--"); AGENTIX_EARLY_WORKER=0
// or a bundle built without early_worker execs the daemon itself.
TEST_CASE("bootstrap.sh starts the daemon through agentix-launch when asked",
          "[bundler]") {
  const std::string root = FakeRuntime();
  // The default script execs the daemon even with a launcher bundled.
  REQUIRE_OK(WriteFile(root + "/bin/agentix-launch",
                       "#!/bin/busybox sh\necho launch\nfor a in \"$@\"; do "
                       "echo \"$a\"; done\n",
                       /*executable=*/true));
  CHECK(Run(root, {}).find("launch") == std::string::npos);
  REQUIRE_OK(WriteFile(root + "/bootstrap.sh", BootstrapScript(root, "grpc", true),
                       /*executable=*/true));
  const std::string out =
      Run(root, {"AGENTIX_LISTEN=unix://" + root + "/a.sock",
                 "AGENTIX_PYTHON_PATH=/p1:/p2"},
          {"--max-retained-results", "7"});
  const std::string daemon = "--\n" + root + "/bin/agentix-sandboxd\n";
  REQUIRE(out.rfind("launch\n--worker\n" + root + "/bin/agentix-worker\n--venv\n" +
                        root + "/venv\n--python-path\n/p1:/p2\n" + daemon,
                    0) == 0);
  // The daemon's own arguments are unchanged behind "--".
  const std::string after = out.substr(out.find(daemon) + daemon.size());
  CHECK(after.find("--worker\n" + root + "/bin/agentix-worker\n") != std::string::npos);
  CHECK(after.find("--python-path\n/p1:/p2\n") != std::string::npos);
  CHECK(after.find("--python-home\n" + root + "/python\n") != std::string::npos);
  CHECK(after.find("--prestart-worker\n") != std::string::npos);
  CHECK(after.find("--max-retained-results\n7\n") != std::string::npos);

  const std::string direct = Run(root, {"AGENTIX_EARLY_WORKER=0"});
  CHECK(direct.find("launch") == std::string::npos);
  CHECK(direct.find("--prestart-worker\n") != std::string::npos);
  REQUIRE_OK(WriteFile(root + "/bootstrap.sh", BootstrapScript(root, "grpc", false),
                       /*executable=*/true));
  CHECK(Run(root, {}).find("launch") == std::string::npos);
  CHECK(Run(root, {"AGENTIX_EARLY_WORKER=1"}).rfind("launch\n", 0) == 0);
}

// The socket's directory comes from parameter expansion (no fork on the way
// to the daemon's exec): nested and several addresses, as dirname would.
TEST_CASE("bootstrap.sh makes each unix socket's directory, nested or not",
          "[bundler]") {
  const std::string root = FakeRuntime();
  const std::string out = Run(
      root, {"AGENTIX_LISTEN=unix://" + root + "/n1/n2/a.sock unix://" +
                 root + "/sock/b.sock 127.0.0.1:9"});
  CHECK(fs::is_directory(root + "/n1/n2"));
  CHECK_FALSE(fs::exists(root + "/n1/n2/a.sock"));
  CHECK(fs::is_directory(root + "/sock"));
  CHECK_FALSE(fs::exists(root + "/sock/b.sock"));
  CHECK(out.find("--listen\nunix://" + root + "/n1/n2/a.sock\n") !=
        std::string::npos);
  CHECK(out.find("--listen\n127.0.0.1:9\n") != std::string::npos);
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

// A fake venv python that records its arguments (the gateway's command line).
void AddFakeGateway(const std::string& root) {
  fs::create_directories(root + "/venv/bin");
  const std::string package = root + "/venv/lib/python3.11/site-packages/agentix/gateway";
  fs::create_directories(package);
  REQUIRE_OK(WriteFile(package + "/__main__.py", "", /*executable=*/false));
  REQUIRE_OK(WriteFile(root + "/venv/bin/python",
                       "#!/bin/busybox sh\nfor a in \"$@\"; do echo \"$a\"; "
                       "done > \"$GATEWAY_ARGS\"\n",
                       /*executable=*/true));
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST_CASE("bootstrap.sh starts the Socket.IO gateway on BIND_HOST/PORT",
          "[bundler]") {
  const std::string root = FakeRuntime();
  AddFakeGateway(root);
  const std::string args_file = root + "/gateway.args";
  const std::string out =
      Run(root, {"AGENTIX_WIRE=socketio", "AGENTIX_BIND_PORT=9005",
                 "TMPDIR=" + root, "GATEWAY_ARGS=" + args_file});
  // The daemon listens on a private Unix socket only (no TCP listener).
  CHECK(out.find("--listen\nunix://" + root + "/agentix-gateway-") !=
        std::string::npos);
  CHECK(out.find("127.0.0.1:9005") == std::string::npos);
  // The gateway (started in the background) gets that socket and the port.
  std::string gateway;
  for (int i = 0; i < 200 && gateway.find("--port\n9005\n") == std::string::npos;
       ++i) {
    gateway = ReadAll(args_file);
    usleep(10000);
  }
  CHECK(gateway.find("-I\n-S\n" + root +
                     "/venv/lib/python3.11/site-packages/agentix/gateway/__main__.py\n") !=
        std::string::npos);
  CHECK(gateway.find("--host\n127.0.0.1\n--port\n9005\n") != std::string::npos);
  CHECK(gateway.find("--daemon\nunix://" + root + "/agentix-gateway-") !=
        std::string::npos);
  CHECK(gateway.find("--parent-pid\n") != std::string::npos);
  // AGENTIX_LISTEN is still served, beside the gateway's socket.
  const std::string both = Run(
      root, {"AGENTIX_WIRE=socketio", "AGENTIX_LISTEN=unix://" + root + "/l.sock",
             "TMPDIR=" + root, "GATEWAY_ARGS=" + args_file});
  CHECK(both.find("--listen\nunix://" + root + "/l.sock\n") != std::string::npos);
}

TEST_CASE("bootstrap.sh's wire default is baked in and checked", "[bundler]") {
  const std::string root = testing::FreshDir("bootstrap_wire");
  fs::create_directories(root + "/bin");
  fs::create_symlink("/bin/busybox", root + "/bin/sh");
  REQUIRE_OK(WriteFile(root + "/bin/agentix-sandboxd",
                       "#!/bin/busybox sh\nfor a in \"$@\"; do echo \"$a\"; done\n",
                       /*executable=*/true));
  AddFakeGateway(root);
  REQUIRE_OK(WriteFile(root + "/bootstrap.sh", BootstrapScript(root, "socketio"),
                       /*executable=*/true));
  const std::string out =
      Run(root, {"TMPDIR=" + root, "GATEWAY_ARGS=" + root + "/gw.args"});
  CHECK(out.find("--listen\nunix://" + root + "/agentix-gateway-") !=
        std::string::npos);
  CHECK(Run(root, {"AGENTIX_WIRE=grpc"}).find("--listen\n127.0.0.1:8000\n") !=
        std::string::npos);
  REQUIRE_OK_AND_ASSIGN(
      CommandResult bad,
      RunCommand({"/usr/bin/env", "-i", "AGENTIX_WIRE=http3", root + "/bootstrap.sh"}));
  CHECK(bad.exit.returncode() == 2);
  CHECK(bad.err.find("AGENTIX_WIRE must be grpc or socketio, not 'http3'") !=
        std::string::npos);
  CHECK(bad.out.empty());  // the daemon was not started
  // The gateway's bytecode is run when the bundle has it.
  const std::string pycache =
      root + "/venv/lib/python3.11/site-packages/agentix/gateway/__pycache__";
  fs::create_directories(pycache);
  REQUIRE_OK(WriteFile(pycache + "/__main__.cpython-311.pyc", "", /*executable=*/false));
  const std::string args_file = root + "/gw2.args";
  Run(root, {"TMPDIR=" + root, "GATEWAY_ARGS=" + args_file});
  std::string gateway;
  for (int i = 0; i < 200 && gateway.find("--port\n") == std::string::npos; ++i) {
    gateway = ReadAll(args_file);
    usleep(10000);
  }
  CHECK(gateway.find("-I\n-S\n" + pycache + "/__main__.cpython-311.pyc\n") !=
        std::string::npos);
  // A bundle without the gateway refuses the legacy wire by name.
  fs::remove_all(root + "/venv/lib");
  REQUIRE_OK_AND_ASSIGN(CommandResult none,
                        RunCommand({"/usr/bin/env", "-i", root + "/bootstrap.sh"}));
  CHECK(none.exit.returncode() == 2);
  CHECK(none.err.find("the bundle has no agentix gateway") != std::string::npos);
  CHECK(none.out.empty());
}

}  // namespace
}  // namespace agentix::bundler
