#include "base/cpu_quota.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace agentix::base {
namespace {

// The file's text, or nullopt when it cannot be opened.
std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// `dir` and each ancestor up to `root` (root included), deepest first.
std::vector<std::string> DirAndAncestors(const std::string& root,
                                         absl::string_view cgroup_path) {
  std::vector<std::string> out;
  std::string path(absl::StripSuffix(cgroup_path, "/"));
  while (true) {
    out.push_back(root + path);
    if (path.empty()) break;
    const size_t slash = path.rfind('/');
    path.resize(slash == std::string::npos ? 0 : slash);
  }
  return out;
}

void KeepTightest(std::optional<double>& tightest, double cpus) {
  if (!tightest || cpus < *tightest) tightest = cpus;
}

absl::Status Unparsable(const std::string& path, absl::string_view text) {
  return absl::InvalidArgumentError(
      absl::StrCat("cannot parse ", path, ": \"", absl::StripAsciiWhitespace(text), "\""));
}

// cgroup v2: "QUOTA PERIOD" or "max PERIOD".
absl::Status ReadV2(const std::string& dir, std::optional<double>& tightest) {
  const std::string path = dir + "/cpu.max";
  std::optional<std::string> text = ReadFile(path);
  if (!text) return absl::OkStatus();
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::StripAsciiWhitespace(*text), ' ', absl::SkipEmpty());
  int64_t quota = 0, period = 0;
  if (fields.size() != 2 || !absl::SimpleAtoi(fields[1], &period) || period <= 0) {
    return Unparsable(path, *text);
  }
  if (fields[0] == "max") return absl::OkStatus();
  if (!absl::SimpleAtoi(fields[0], &quota) || quota <= 0) return Unparsable(path, *text);
  KeepTightest(tightest, static_cast<double>(quota) / static_cast<double>(period));
  return absl::OkStatus();
}

// cgroup v1: cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us.
absl::Status ReadV1(const std::string& dir, std::optional<double>& tightest) {
  const std::string quota_path = dir + "/cpu.cfs_quota_us";
  std::optional<std::string> quota_text = ReadFile(quota_path);
  if (!quota_text) return absl::OkStatus();
  int64_t quota = 0, period = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*quota_text), &quota) ||
      quota == 0 || quota < -1) {
    return Unparsable(quota_path, *quota_text);
  }
  if (quota == -1) return absl::OkStatus();
  const std::string period_path = dir + "/cpu.cfs_period_us";
  std::optional<std::string> period_text = ReadFile(period_path);
  if (!period_text || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*period_text), &period) ||
      period <= 0) {
    return Unparsable(period_path, period_text.value_or(""));
  }
  KeepTightest(tightest, static_cast<double>(quota) / static_cast<double>(period));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::optional<double>> CpuQuota(absl::string_view proc_self_cgroup,
                                                const std::string& cgroup_root) {
  std::optional<double> tightest;
  for (absl::string_view line : absl::StrSplit(proc_self_cgroup, '\n', absl::SkipEmpty())) {
    // "ID:CONTROLLERS:PATH"; the path may itself hold ':'.
    std::vector<absl::string_view> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot parse /proc/self/cgroup line \"", line, "\""));
    }
    if (parts[0] == "0" && parts[1].empty()) {
      // v2 (unified); mounted at the root alone, or under "unified" beside v1.
      for (const std::string& mount : {cgroup_root, cgroup_root + "/unified"}) {
        for (const std::string& dir : DirAndAncestors(mount, parts[2])) {
          if (absl::Status s = ReadV2(dir, tightest); !s.ok()) return s;
        }
      }
      continue;
    }
    std::vector<absl::string_view> controllers = absl::StrSplit(parts[1], ',');
    bool cpu = false;
    for (absl::string_view c : controllers) cpu = cpu || c == "cpu";
    if (!cpu) continue;
    // v1: mounted as "cpu,cpuacct" (or "cpuacct,cpu") with a "cpu" link, or "cpu" alone.
    for (const std::string& mount : {absl::StrCat(cgroup_root, "/", parts[1]),
                                     absl::StrCat(cgroup_root, "/cpu")}) {
      for (const std::string& dir : DirAndAncestors(mount, parts[2])) {
        if (absl::Status s = ReadV1(dir, tightest); !s.ok()) return s;
      }
    }
  }
  return tightest;
}

absl::StatusOr<std::optional<double>> OwnCpuQuota() {
  std::optional<std::string> text = ReadFile("/proc/self/cgroup");
  if (!text) return std::optional<double>();  // no cgroups: no quota
  return CpuQuota(*text, "/sys/fs/cgroup");
}

}  // namespace agentix::base
