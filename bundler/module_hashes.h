// The project's own modules and a hash of each, for the manifest: the host
// compares them with its copy of a callable's module at the first call and
// warns when the bundle is stale (docs/BUNDLE.md, "Module hashes").
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace agentix::bundler {

// "hello-agentix", "Hello_Agentix" and "hello.agentix" are one distribution
// (PEP 503): lower case, runs of "-", "_", "." become "_".
std::string NormalizeDistName(const std::string& name);

// The ".py" files a distribution's RECORD lists (paths relative to
// site-packages, none outside it), as module name -> "sha256:<hex of the
// file's bytes>". "pkg/__init__.py" is module "pkg", "pkg/mod.py" is
// "pkg.mod"; files in *.dist-info, __pycache__ or with a non-identifier
// part are skipped. `dists` are the distributions' names (any spelling); a
// name with no *.dist-info in `site_packages` is NOT_FOUND.
absl::StatusOr<std::map<std::string, std::string>> ModuleHashes(
    const std::string& site_packages, const std::vector<std::string>& dists);

}  // namespace agentix::bundler
