#include "worker/python/path_config.h"

#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "testing/status_matchers.h"

namespace agentix::worker {
namespace {

namespace fs = std::filesystem;

// A fresh directory under TEST_TMPDIR, removed at scope exit.
class TempDir {
 public:
  TempDir() {
    const char* base = getenv("TEST_TMPDIR");
    std::string pattern =
        std::string(base != nullptr ? base : "/tmp") + "/path_config.XXXXXX";
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void Touch(const fs::path& path, const std::string& text = "") {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

// A fake prefix with lib/python3.11/os.py.
void MakeHome(const fs::path& home) { Touch(home / "lib/python3.11/os.py"); }

void MakeVenv(const fs::path& venv, const std::string& version,
              bool system_site) {
  fs::create_directories(venv / "lib/python3.11/site-packages");
  Touch(venv / "pyvenv.cfg",
        "home = /usr/bin\n"
        "include-system-site-packages = " +
            std::string(system_site ? "true" : "false") +
            "\nversion = " + version + "\n");
}

TEST_CASE("ParsePyvenvCfg reads the keys site.py uses", "[path_config]") {
  PyvenvConfig cfg = ParsePyvenvCfg(
      "home = /usr/bin\n"
      "Include-System-Site-Packages =  True \n"
      "version = 3.11.2\n"
      "garbage line\n"
      "executable = /usr/bin/python3.11\n");
  REQUIRE(cfg.home == "/usr/bin");
  REQUIRE(cfg.include_system_site_packages);
  REQUIRE(cfg.version == "3.11.2");
  REQUIRE_FALSE(ParsePyvenvCfg("include-system-site-packages = false\n")
                    .include_system_site_packages);
  // uv / virtualenv spell it version_info.
  REQUIRE(ParsePyvenvCfg("version_info = 3.11.7.final.0").version ==
          "3.11.7.final.0");
}

TEST_CASE("SplitPythonPath drops empty entries", "[path_config]") {
  REQUIRE(SplitPythonPath("") == std::vector<std::string>{});
  REQUIRE(SplitPythonPath("/a::/b:") == std::vector<std::string>{"/a", "/b"});
}

TEST_CASE("Without a venv: import roots first, then the stdlib",
          "[path_config]") {
  TempDir tmp;
  MakeHome(fs::path(tmp.path()) / "py");
  PathOptions options;
  options.python_path = {tmp.path() + "/code", tmp.path() + "/more/"};
  REQUIRE_OK_AND_ASSIGN(PythonPaths paths,
                        ComputePythonPaths(options, tmp.path() + "/py", "3.11"));
  REQUIRE(paths.home == tmp.path() + "/py");
  REQUIRE(paths.executable == tmp.path() + "/py/bin/python3");
  REQUIRE(paths.module_search_paths ==
          std::vector<std::string>{tmp.path() + "/code", tmp.path() + "/more",
                                   tmp.path() + "/py/lib/python3.11",
                                   tmp.path() + "/py/lib/python3.11/lib-dynload"});
  REQUIRE(paths.venv.empty());
}

TEST_CASE("--python-home overrides the default home", "[path_config]") {
  TempDir tmp;
  MakeHome(fs::path(tmp.path()) / "bundle/python");
  PathOptions options;
  options.python_home = tmp.path() + "/bundle/python";
  REQUIRE_OK_AND_ASSIGN(PythonPaths paths,
                        ComputePythonPaths(options, "/nonexistent", "3.11"));
  REQUIRE(paths.home == tmp.path() + "/bundle/python");
}

TEST_CASE("A home without a stdlib is refused", "[path_config]") {
  PathOptions options;
  options.python_home = "/nonexistent/python";
  auto paths = ComputePythonPaths(options, "/usr", "3.11");
  REQUIRE(paths.status().code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(std::string(paths.status().message())
              .find("/nonexistent/python") != std::string::npos);
}

TEST_CASE("A venv sets the executable and site-packages", "[path_config]") {
  TempDir tmp;
  const fs::path root(tmp.path());
  MakeHome(root / "py");
  MakeVenv(root / "venv", "3.11.2", /*system_site=*/true);
  PathOptions options;
  options.venv = tmp.path() + "/venv";
  REQUIRE_OK_AND_ASSIGN(PythonPaths paths,
                        ComputePythonPaths(options, tmp.path() + "/py", "3.11"));
  REQUIRE(paths.venv == tmp.path() + "/venv");
  REQUIRE(paths.executable == tmp.path() + "/venv/bin/python3");
  REQUIRE(paths.venv_site_packages ==
          tmp.path() + "/venv/lib/python3.11/site-packages");
  REQUIRE(paths.system_site_packages);
  // site.py appends site-packages; it is not in the explicit list.
  REQUIRE(paths.module_search_paths.size() == 2);
}

TEST_CASE("Relative venv and python-path become absolute", "[path_config]") {
  TempDir tmp;
  const fs::path root(tmp.path());
  MakeHome(root / "py");
  MakeVenv(root / "venv", "3.11.7", false);
  char old_cwd[4096];
  REQUIRE(getcwd(old_cwd, sizeof(old_cwd)) != nullptr);
  REQUIRE(chdir(tmp.path().c_str()) == 0);
  PathOptions options;
  options.venv = "venv";
  options.python_path = {"src"};
  auto paths = ComputePythonPaths(options, tmp.path() + "/py", "3.11");
  REQUIRE(chdir(old_cwd) == 0);
  REQUIRE_OK(paths);
  REQUIRE(paths->venv == tmp.path() + "/venv");
  REQUIRE(paths->module_search_paths[0] == tmp.path() + "/src");
  REQUIRE_FALSE(paths->system_site_packages);
}

TEST_CASE("Broken venvs are refused with a clear message", "[path_config]") {
  TempDir tmp;
  const fs::path root(tmp.path());
  MakeHome(root / "py");
  PathOptions options;

  SECTION("missing directory") {
    options.venv = tmp.path() + "/missing";
    auto paths = ComputePythonPaths(options, tmp.path() + "/py", "3.11");
    REQUIRE(paths.status().code() == absl::StatusCode::kFailedPrecondition);
    REQUIRE(std::string(paths.status().message()).find("pyvenv.cfg") !=
            std::string::npos);
  }
  SECTION("another Python version") {
    MakeVenv(root / "venv", "3.12.1", false);
    options.venv = tmp.path() + "/venv";
    auto paths = ComputePythonPaths(options, tmp.path() + "/py", "3.11");
    REQUIRE(paths.status().code() == absl::StatusCode::kFailedPrecondition);
    REQUIRE(std::string(paths.status().message()).find("3.12.1") !=
            std::string::npos);
  }
  SECTION("no site-packages") {
    Touch(root / "venv2/pyvenv.cfg", "version = 3.11.2\n");
    options.venv = tmp.path() + "/venv2";
    auto paths = ComputePythonPaths(options, tmp.path() + "/py", "3.11");
    REQUIRE(paths.status().code() == absl::StatusCode::kFailedPrecondition);
    REQUIRE(std::string(paths.status().message()).find("site-packages") !=
            std::string::npos);
  }
}

TEST_CASE("FindPythonHome walks up from libpython", "[path_config]") {
  TempDir tmp;
  const fs::path root(tmp.path());
  SECTION("Debian layout: <prefix>/lib/<triplet>/libpython") {
    MakeHome(root / "usr");
    Touch(root / "usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0");
    REQUIRE(FindPythonHome(
                tmp.path() + "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0",
                "3.11", "/fallback") == fs::canonical(root / "usr").string());
  }
  SECTION("bundle layout: <home>/lib/libpython, reached via a symlink") {
    MakeHome(root / "bundle/python");
    Touch(root / "bundle/python/lib/libpython3.11.so.1.0");
    fs::create_directory_symlink(root / "bundle/python/lib", root / "linked");
    REQUIRE(FindPythonHome(tmp.path() + "/linked/libpython3.11.so.1.0", "3.11",
                           "/fallback") ==
            fs::canonical(root / "bundle/python").string());
  }
  SECTION("nothing found") {
    Touch(root / "bin/agentix-worker");
    REQUIRE(FindPythonHome(tmp.path() + "/bin/agentix-worker", "3.11",
                           "/fallback") == "/fallback");
    REQUIRE(FindPythonHome("", "3.11", "/fallback") == "/fallback");
    REQUIRE(FindPythonHome("/no/such/lib.so", "3.11", "/fallback") ==
            "/fallback");
  }
}

TEST_CASE("This machine: Debian's libpython gives /usr", "[path_config]") {
  REQUIRE(FindPythonHome("/lib/x86_64-linux-gnu/libpython3.11.so.1.0", "3.11",
                         "/fallback") == "/usr");
}

}  // namespace
}  // namespace agentix::worker
