#include "bundler/module_hashes.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bundler/archive.h"

namespace agentix::bundler {
namespace {

namespace fs = std::filesystem;

bool IsIdentifier(absl::string_view part) {
  if (part.empty() || absl::ascii_isdigit(part.front())) return false;
  for (char c : part) {
    if (!absl::ascii_isalnum(c) && c != '_') return false;
  }
  return true;
}

// "pkg/sub/mod.py" -> "pkg.sub.mod"; "" when it is no importable module.
std::string ModuleName(absl::string_view path) {
  if (!absl::ConsumeSuffix(&path, ".py")) return "";
  std::vector<absl::string_view> parts = absl::StrSplit(path, '/');
  if (parts.size() > 1 && parts.back() == "__init__") parts.pop_back();
  for (absl::string_view part : parts) {
    if (!IsIdentifier(part)) return "";
  }
  return absl::StrJoin(parts, ".");
}

}  // namespace

std::string NormalizeDistName(const std::string& name) {
  std::string out;
  for (char c : name) {
    const bool separator = c == '-' || c == '_' || c == '.';
    if (separator) {
      if (out.empty() || out.back() != '_') out.push_back('_');
    } else {
      out.push_back(absl::ascii_tolower(c));
    }
  }
  return out;
}

absl::StatusOr<std::map<std::string, std::string>> ModuleHashes(
    const std::string& site_packages, const std::vector<std::string>& dists) {
  std::map<std::string, std::string> hashes;
  for (const std::string& dist : dists) {
    const std::string wanted = NormalizeDistName(dist);
    fs::path record;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(site_packages, ec)) {
      const std::string file = entry.path().filename().string();
      if (!absl::EndsWith(file, ".dist-info")) continue;
      const std::string name = file.substr(0, file.find('-'));
      if (NormalizeDistName(name) == wanted) record = entry.path() / "RECORD";
    }
    if (ec) {
      return absl::NotFoundError(absl::StrCat("cannot list ", site_packages,
                                              ": ", ec.message()));
    }
    std::ifstream in(record);
    if (record.empty() || !in) {
      return absl::NotFoundError(absl::StrCat(
          "no RECORD of distribution ", dist, " in ", site_packages));
    }
    std::string line;
    while (std::getline(in, line)) {
      // RECORD is CSV; our paths hold no commas or quotes (identifiers).
      const std::string path = line.substr(0, line.find(','));
      if (path.empty() || absl::StartsWith(path, "/") ||
          absl::StrContains(path, "..") ||
          absl::StrContains(path, "__pycache__")) {
        continue;
      }
      const std::string module = ModuleName(path);
      if (module.empty()) continue;
      absl::StatusOr<std::string> digest =
          Sha256File((fs::path(site_packages) / path).string());
      if (!digest.ok()) return digest.status();
      hashes[module] = absl::StrCat("sha256:", *digest);
    }
  }
  return hashes;
}

}  // namespace agentix::bundler
