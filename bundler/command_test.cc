#include "bundler/command.h"

#include "testing/status_matchers.h"

namespace agentix::bundler {
namespace {

TEST_CASE("RunCommand keeps stdout and stderr apart", "[bundler]") {
  REQUIRE_OK_AND_ASSIGN(
      CommandResult result,
      RunCommand({"sh", "-c", "echo out; echo err >&2; exit 3"}));
  CHECK(result.out == "out\n");
  CHECK(result.err == "err\n");
  CHECK(result.exit.exit_code == 3);
  CHECK_FALSE(result.ok());
}

TEST_CASE("RunCommand drains large output on both streams", "[bundler]") {
  // More than a pipe buffer on each stream: a reader that waits on one
  // stream first would deadlock.
  REQUIRE_OK_AND_ASSIGN(
      CommandResult result,
      RunCommand({"sh", "-c",
                  "head -c 300000 /dev/zero >&2; head -c 300000 /dev/zero"}));
  CHECK(result.out.size() == 300000);
  CHECK(result.err.size() == 300000);
}

TEST_CASE("RunCommand adds and overrides environment entries", "[bundler]") {
  REQUIRE_OK_AND_ASSIGN(
      CommandResult result,
      RunCommand({"sh", "-c", "echo \"$AGX_A-$HOME\""},
                 {"AGX_A=1", "HOME=/nowhere"}));
  CHECK(result.out == "1-/nowhere\n");
}

TEST_CASE("RunCommandOrError names the command and carries stderr",
          "[bundler]") {
  absl::StatusOr<CommandResult> failed =
      RunCommandOrError({"sh", "-c", "echo broken >&2; exit 1"});
  REQUIRE(failed.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(failed.status().message().find("`sh -c echo broken >&2; exit 1` "
                                       "failed (exit code 1)") !=
        absl::string_view::npos);
  CHECK(failed.status().message().find("broken") != absl::string_view::npos);
  CHECK(RunCommand({"agentix-no-such-tool"}).status().code() ==
        absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace agentix::bundler
