// Command-line spelling shared by our binaries: users and the daemon write
// flags with dashes (--python-path), absl flag names are identifiers
// (python_path). This rewrites the former into the latter before parsing.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace agentix::base {

// Returns argv with every "--a-b[=v]" / "-a-b[=v]" rewritten to "--a_b[=v]"
// (values untouched), stopping at a bare "--". `storage` owns the strings;
// the returned vector is null-terminated and valid while `storage` lives.
std::vector<char*> NormalizeFlagNames(int argc, char** argv,
                                      std::vector<std::string>& storage);

// Takes every occurrence of the repeatable `flag` (spelled with dashes, as
// "--listen": argv is not normalized yet) out of argv: "--flag VALUE" and
// "--flag=VALUE", in order, up to a bare "--" (the rest is not flags).
// Returns the values; argv keeps the other arguments in order, and argc
// their count, for absl (whose flags are not repeatable).
std::vector<std::string> ExtractRepeatedFlag(absl::string_view flag, int& argc,
                                             char** argv);

// Sets what `--help` and `--version` print, before absl::ParseCommandLine:
// `usage` first, then every flag defined in this repository's files with its
// help text (absl's default lists only flags of a file named like the binary,
// which ours are not, and prints "No flags matched."). `--version` prints
// `version_line`. Flag names are listed as absl spells them (python_path);
// both spellings are accepted.
void SetFlagsUsage(const std::string& usage, const std::string& version_line);

// True for a flag defined in our sources, false for absl's own.
bool IsOwnFlagFile(const std::string& path);

}  // namespace agentix::base
