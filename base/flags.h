// Command-line spelling shared by our binaries: users and the daemon write
// flags with dashes (--python-path), absl flag names are identifiers
// (python_path). This rewrites the former into the latter before parsing.
#pragma once

#include <string>
#include <vector>

namespace agentix::base {

// Returns argv with every "--a-b[=v]" / "-a-b[=v]" rewritten to "--a_b[=v]"
// (values untouched), stopping at a bare "--". `storage` owns the strings;
// the returned vector is null-terminated and valid while `storage` lives.
std::vector<char*> NormalizeFlagNames(int argc, char** argv,
                                      std::vector<std::string>& storage);

}  // namespace agentix::base
