#include "bundler/python_env.h"

#include <filesystem>

#include "bundler/test_util.h"
#include "testing/status_matchers.h"

namespace agentix::bundler {
namespace {

TEST_CASE("the stdlib filter drops tests, caches and site dirs", "[bundler]") {
  CHECK(ExcludedFromStdlib("test", true));
  CHECK(ExcludedFromStdlib("idlelib/idle_test", true));
  CHECK(ExcludedFromStdlib("json/__pycache__", true));
  CHECK(ExcludedFromStdlib("site-packages", true));
  CHECK(ExcludedFromStdlib("config-3.11-x86_64-linux-gnu", true));
  CHECK(ExcludedFromStdlib("EXTERNALLY-MANAGED", false));
  CHECK_FALSE(ExcludedFromStdlib("json", true));
  CHECK_FALSE(ExcludedFromStdlib("unittest", true));
  CHECK_FALSE(ExcludedFromStdlib("test.py", false));  // a file, not a suite
  CHECK_FALSE(ExcludedFromStdlib("lib-dynload", true));
}

TEST_CASE("StageStdlib copies the real stdlib with lib-dynload", "[bundler]") {
  const std::string dir = testing::FreshDir("stdlib");
  REQUIRE_OK_AND_ASSIGN(CopyStats stats,
                        StageStdlib("/usr/lib/python3.11", dir + "/py"));
  namespace fs = std::filesystem;
  CHECK(stats.files > 500);
  CHECK(fs::exists(dir + "/py/os.py"));
  CHECK(fs::is_directory(dir + "/py/lib-dynload"));
  CHECK_FALSE(fs::exists(dir + "/py/json/__pycache__"));
  CHECK_FALSE(fs::exists(dir + "/py/EXTERNALLY-MANAGED"));
  // Debian's sitecustomize.py is an absolute symlink into /etc: copied as
  // a file, or left out when the target is missing, never a link out.
  CHECK_FALSE(fs::is_symlink(dir + "/py/sitecustomize.py"));
  CHECK(StageStdlib(dir + "/nothing", dir + "/x").status().code() ==
        absl::StatusCode::kNotFound);
}

TEST_CASE("the requirement pip could not find is named", "[bundler]") {
  CHECK(MissingRequirementFromPipError(
            "ERROR: Could not find a version that satisfies the requirement "
            "leftpad>=1 (from versions: none)\nERROR: No matching "
            "distribution found for leftpad>=1\n") == "leftpad>=1");
  CHECK(MissingRequirementFromPipError("ERROR: something else\n").empty());
  CHECK(RequirementName("leftpad>=1") == "leftpad");
  CHECK(RequirementName(" msgpack[ext] ; python_version>'3'") == "msgpack");
  CHECK(RequirementName("pkg @ file:///x") == "pkg");
}

}  // namespace
}  // namespace agentix::bundler
