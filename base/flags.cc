#include "base/flags.h"

#include <algorithm>

#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace agentix::base {

std::vector<char*> NormalizeFlagNames(int argc, char** argv,
                                      std::vector<std::string>& storage) {
  storage.assign(argv, argv + argc);
  for (size_t i = 1; i < storage.size(); ++i) {
    std::string& arg = storage[i];
    if (arg == "--") break;
    if (arg.size() < 3 || arg[0] != '-') continue;
    const size_t name_start = arg[1] == '-' ? 2 : 1;
    const size_t name_end = std::min(arg.find('='), arg.size());
    std::replace(arg.begin() + name_start, arg.begin() + name_end, '-', '_');
  }
  std::vector<char*> out;
  for (std::string& arg : storage) out.push_back(arg.data());
  out.push_back(nullptr);
  return out;
}

bool IsOwnFlagFile(const std::string& path) {
  return !absl::StrContains(path, "absl/");
}

void SetFlagsUsage(const std::string& usage, const std::string& version_line) {
  absl::SetProgramUsageMessage(
      usage + "\n\nFlags may be written with dashes or underscores "
              "(--log-level or --log_level).");
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [](absl::string_view path) {
    return IsOwnFlagFile(std::string(path));
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  config.contains_helppackage_flags = config.contains_help_flags;
  config.version_string = [version_line] { return version_line + "\n"; };
  absl::SetFlagsUsageConfig(config);
}

std::vector<std::string> ExtractRepeatedFlag(absl::string_view flag, int& argc,
                                             char** argv) {
  std::vector<std::string> values;
  const std::string with_value = absl::StrCat(flag, "=");
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") {  // the rest is not flags
      while (i < argc) argv[out++] = argv[i++];
      break;
    }
    if (arg == flag && i + 1 < argc) {
      values.emplace_back(argv[++i]);
    } else if (absl::StartsWith(arg, with_value)) {
      values.emplace_back(arg.substr(with_value.size()));
    } else {
      argv[out++] = argv[i];
    }
  }
  argc = out;
  return values;
}

}  // namespace agentix::base
