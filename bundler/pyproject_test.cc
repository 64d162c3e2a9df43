#include "bundler/pyproject.h"

#include "bundler/test_util.h"
#include "testing/status_matchers.h"

namespace agentix::bundler {
namespace {

constexpr char kFull[] = R"(
[project]
name = "agentix-demo"
version = "1.2.3"
dependencies = [
  "msgpack>=1.0",
  "helper",
]

[tool.agentix]
system-packages = ["git", "ripgrep"]

[tool.uv.sources]
helper = { path = "../helper" }
other = { git = "https://example.invalid/x.git" }
)";

TEST_CASE("ParsePyproject reads name, version, deps, system packages, paths",
          "[bundler]") {
  REQUIRE_OK_AND_ASSIGN(ProjectSpec spec,
                        ParsePyproject(kFull, "/src/demo", "demo.toml"));
  CHECK(spec.name == "agentix-demo");
  CHECK(spec.version == "1.2.3");
  CHECK(spec.dependencies == std::vector<std::string>{"msgpack>=1.0", "helper"});
  CHECK(spec.system_packages == std::vector<std::string>{"git", "ripgrep"});
  CHECK(spec.path_dependencies == std::vector<std::string>{"/src/helper"});
  CHECK(DefaultBundleName(spec) == "demo");
}

TEST_CASE("ParsePyproject: optional fields may be absent", "[bundler]") {
  REQUIRE_OK_AND_ASSIGN(ProjectSpec spec,
                        ParsePyproject("[project]\nname = \"p\"\n", "/x", "f"));
  CHECK(spec.version.empty());
  CHECK(spec.dependencies.empty());
  CHECK(spec.system_packages.empty());
  CHECK(DefaultBundleName(spec) == "p");
}

TEST_CASE("ParsePyproject errors say where and what", "[bundler]") {
  absl::StatusOr<ProjectSpec> syntax =
      ParsePyproject("[project]\nname = \"p\nversion = 1\n", "/x", "bad.toml");
  REQUIRE(syntax.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(syntax.status().message().find("bad.toml:2:") != absl::string_view::npos);

  absl::StatusOr<ProjectSpec> no_project =
      ParsePyproject("[tool.x]\na = 1\n", "/x", "f.toml");
  REQUIRE(no_project.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(no_project.status().message().find("no [project] table") !=
        absl::string_view::npos);

  absl::StatusOr<ProjectSpec> no_name =
      ParsePyproject("[project]\nversion = \"1\"\n", "/x", "f.toml");
  CHECK(no_name.status().message().find("has no name") != absl::string_view::npos);

  absl::StatusOr<ProjectSpec> wrong =
      ParsePyproject("[project]\nname = \"p\"\n[tool.agentix]\n"
                     "system-packages = \"git\"\n",
                     "/x", "f.toml");
  CHECK(wrong.status().message().find(
            "[tool.agentix].system-packages must be an array of strings") !=
        absl::string_view::npos);
}

TEST_CASE("LoadPyproject without a pyproject.toml names the path", "[bundler]") {
  const std::string dir = testing::FreshDir("no_pyproject");
  absl::StatusOr<ProjectSpec> spec = LoadPyproject(dir);
  REQUIRE(spec.status().code() == absl::StatusCode::kNotFound);
  CHECK(spec.status().message().find("no pyproject.toml in " + dir) !=
        absl::string_view::npos);
  CHECK(LoadPyproject(dir + "/missing").status().message().find(
            "does not exist") != absl::string_view::npos);
}

}  // namespace
}  // namespace agentix::bundler
