#include "bundler/pyproject.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include <toml++/toml.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace agentix::bundler {
namespace {

namespace fs = std::filesystem;

absl::Status WrongType(const std::string& origin, absl::string_view key,
                       absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat(origin, ": ", key, " must be ", expected));
}

// Reads an optional array of strings at `node`.
absl::Status StringArray(toml::node_view<const toml::node> node,
                         const std::string& origin, absl::string_view key,
                         std::vector<std::string>& out) {
  if (!node) return absl::OkStatus();
  const toml::array* array = node.as_array();
  if (array == nullptr) return WrongType(origin, key, "an array of strings");
  for (const toml::node& element : *array) {
    std::optional<std::string> value = element.value<std::string>();
    if (!value) return WrongType(origin, key, "an array of strings");
    out.push_back(*value);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ProjectSpec> ParsePyproject(absl::string_view text,
                                           const std::string& project_dir,
                                           const std::string& origin) {
  toml::table root;
  // toml++ as Debian builds it reports syntax errors by exception; keep it
  // from crossing this boundary.
  try {
    root = toml::parse(std::string_view(text.data(), text.size()),
                       std::string_view(origin));
  } catch (const toml::parse_error& error) {
    const auto& begin = error.source().begin;
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ":", begin.line, ":", begin.column,
                     ": invalid TOML: ", std::string(error.description())));
  }

  ProjectSpec spec;
  const toml::node_view<const toml::node> project =
      std::as_const(root)["project"];
  if (!project.is_table()) {
    return absl::InvalidArgumentError(absl::StrCat(
        origin, " has no [project] table; the bundler needs at least "
                "[project] name = \"...\""));
  }
  std::optional<std::string> name = project["name"].value<std::string>();
  if (!name || name->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": [project] has no name"));
  }
  spec.name = *name;
  if (project["version"]) {
    std::optional<std::string> version =
        project["version"].value<std::string>();
    if (!version) return WrongType(origin, "[project].version", "a string");
    spec.version = *version;
  }
  absl::Status status = StringArray(project["dependencies"], origin,
                                    "[project].dependencies",
                                    spec.dependencies);
  if (!status.ok()) return status;

  const toml::node_view<const toml::node> agentix =
      std::as_const(root)["tool"]["agentix"];
  status = StringArray(agentix["system-packages"], origin,
                       "[tool.agentix].system-packages", spec.system_packages);
  if (!status.ok()) return status;

  if (const toml::table* sources =
          std::as_const(root)["tool"]["uv"]["sources"].as_table()) {
    for (const auto& [key, value] : *sources) {
      const toml::table* source = value.as_table();
      if (source == nullptr || !source->contains("path")) continue;
      std::optional<std::string> path = (*source)["path"].value<std::string>();
      if (!path) {
        return WrongType(origin,
                         absl::StrCat("[tool.uv.sources].",
                                      std::string(key.str()), ".path"),
                         "a string");
      }
      fs::path resolved = fs::path(*path).is_absolute()
                              ? fs::path(*path)
                              : fs::path(project_dir) / *path;
      spec.path_dependencies.push_back(resolved.lexically_normal().string());
    }
  }
  return spec;
}

absl::StatusOr<ProjectSpec> LoadPyproject(const std::string& project_dir) {
  const std::string path = (fs::path(project_dir) / "pyproject.toml").string();
  std::error_code ec;
  if (!fs::is_directory(project_dir, ec)) {
    return absl::NotFoundError(absl::StrCat(
        "project directory ", project_dir,
        " does not exist; pass the directory that holds pyproject.toml"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(
        "no pyproject.toml in ", project_dir, " (looked for ", path,
        "); the bundler builds one Python project: create a pyproject.toml "
        "with a [project] table (name, version, dependencies) or pass the "
        "directory that has one"));
  }
  std::string text(std::istreambuf_iterator<char>(in), {});
  return ParsePyproject(text, project_dir, path);
}

std::string DefaultBundleName(const ProjectSpec& spec) {
  absl::string_view name = spec.name;
  if (absl::StartsWith(name, "agentix-") && name.size() > 8) {
    name.remove_prefix(8);
  }
  return std::string(name);
}

}  // namespace agentix::bundler
