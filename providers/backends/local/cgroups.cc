#include "providers/backends/local/cgroups.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace agentix::providers::local {

std::optional<std::string> OwnCgroup(absl::string_view proc_self_cgroup,
                                     absl::string_view controller) {
  for (absl::string_view line :
       absl::StrSplit(proc_self_cgroup, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    for (absl::string_view name : absl::StrSplit(parts[1], ',')) {
      if (name == controller) return std::string(parts[2]);
    }
  }
  return std::nullopt;
}

std::string SandboxCgroupPath(absl::string_view root,
                              absl::string_view controller,
                              absl::string_view own, absl::string_view parent,
                              absl::string_view sandbox_id) {
  std::string path(absl::StripSuffix(root, "/"));
  for (absl::string_view part : {controller, own, parent, sandbox_id}) {
    for (absl::string_view piece : absl::StrSplit(part, '/', absl::SkipEmpty())) {
      absl::StrAppend(&path, "/", piece);
    }
  }
  return path;
}

std::string CgroupUnusable(absl::string_view root, absl::string_view controller,
                           const std::optional<std::string>& own) {
  const std::string mount = absl::StrCat(absl::StripSuffix(root, "/"), "/", controller);
  if (!own.has_value() || ::access((mount + "/cgroup.procs").c_str(), F_OK) != 0) {
    return absl::StrCat("cgroup v1 controller '", controller,
                        "' is not mounted at ", mount);
  }
  const std::string dir = SandboxCgroupPath(root, controller, *own, "", "");
  if (::access(dir.c_str(), W_OK) != 0) {
    return absl::StrCat("cannot create cgroups under ", dir, ": ", strerror(errno));
  }
  return "";
}

absl::Status WriteCgroupFile(const std::string& dir, absl::string_view file,
                             absl::string_view value) {
  const std::string path = absl::StrCat(dir, "/", file);
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    std::string message = absl::StrCat("open ", path, ": ", strerror(error));
    return error == ENOENT ? absl::NotFoundError(message)
                           : absl::FailedPreconditionError(message);
  }
  ssize_t n = ::write(fd, value.data(), value.size());
  const int error = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(value.size())) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot set ", file, "=", value, ": ", strerror(error)));
  }
  return absl::OkStatus();
}

std::optional<std::string> ReadCgroupFile(const std::string& dir,
                                          absl::string_view file) {
  std::ifstream in(absl::StrCat(dir, "/", file));
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<pid_t> CgroupPids(const std::string& dir) {
  std::vector<pid_t> pids;
  auto text = ReadCgroupFile(dir, "cgroup.procs");
  if (!text) return pids;
  for (absl::string_view word : absl::StrSplit(*text, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
    int pid;
    if (absl::SimpleAtoi(word, &pid) && pid > 0) pids.push_back(pid);
  }
  return pids;
}

long OomKills(absl::string_view oom_control) {
  for (absl::string_view line : absl::StrSplit(oom_control, '\n')) {
    if (absl::ConsumePrefix(&line, "oom_kill ")) {
      long value = 0;
      if (absl::SimpleAtoi(line, &value)) return value;
    }
  }
  return 0;
}

absl::Status RemoveCgroup(const std::string& dir, int tries) {
  for (int i = 0;; ++i) {
    if (::rmdir(dir.c_str()) == 0 || errno == ENOENT) break;
    if (i + 1 >= tries) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot remove cgroup ", dir, ": ", strerror(errno)));
    }
    ::usleep(10000);  // exiting tasks leave the cgroup a moment after death
  }
  // The shared parent, once its last sandbox is gone (EBUSY/ENOTEMPTY else).
  const size_t slash = dir.rfind('/');
  if (slash != std::string::npos && slash > 0) ::rmdir(dir.substr(0, slash).c_str());
  return absl::OkStatus();
}

}  // namespace agentix::providers::local
