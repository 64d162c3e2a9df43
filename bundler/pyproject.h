// What the bundler needs from a project's pyproject.toml: its name and
// version, its Python dependencies (PEP 508 strings, left for pip to
// interpret), local path sources, and the Debian packages whose binaries go
// into the bundle ([tool.agentix] system-packages).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace agentix::bundler {

struct ProjectSpec {
  std::string name;     // [project].name
  std::string version;  // [project].version, or empty
  std::vector<std::string> dependencies;     // [project].dependencies
  std::vector<std::string> system_packages;  // [tool.agentix].system-packages
  // Absolute directories of local path dependencies, from
  // [tool.uv.sources] `name = { path = "..." }` (relative to the project).
  std::vector<std::string> path_dependencies;
};

// Parses pyproject text. `project_dir` resolves relative source paths and
// `origin` names the file in error messages. Errors (kInvalidArgument): TOML
// syntax (with line and column), no [project].name, a field of the wrong
// type.
absl::StatusOr<ProjectSpec> ParsePyproject(absl::string_view text,
                                           const std::string& project_dir,
                                           const std::string& origin);

// Reads `<project_dir>/pyproject.toml`. kNotFound when there is none, with a
// message that says what the bundler expects.
absl::StatusOr<ProjectSpec> LoadPyproject(const std::string& project_dir);

// "agentix-foo" -> "foo" (the original's naming rule), otherwise unchanged.
std::string DefaultBundleName(const ProjectSpec& spec);

}  // namespace agentix::bundler
