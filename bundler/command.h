// Runs a build tool (pip, dpkg, patchelf, ...) to completion and collects its
// output. The bundler is single-threaded, so a blocking wait is fine here.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/child_process.h"

namespace agentix::bundler {

struct CommandResult {
  base::ExitStatus exit;
  std::string out;  // everything written to fd 1
  std::string err;  // everything written to fd 2
  bool ok() const { return exit.signal == 0 && exit.exit_code == 0; }
};

// Runs argv[0] (looked up on PATH when it has no '/') with the current
// environment plus `extra_env` ("K=V", overriding). Returns the result even
// when the command fails; errors only when it could not be started
// (kNotFound naming the program).
absl::StatusOr<CommandResult> RunCommand(
    const std::vector<std::string>& argv,
    const std::vector<std::string>& extra_env = {});

// Like RunCommand, but a non-zero exit becomes kFailedPrecondition whose
// message names the command and carries the tail of its stderr.
absl::StatusOr<CommandResult> RunCommandOrError(
    const std::vector<std::string>& argv,
    const std::vector<std::string>& extra_env = {});

// Absolute path of `program` found on PATH, or kNotFound.
absl::StatusOr<std::string> FindOnPath(const std::string& program);

}  // namespace agentix::bundler
