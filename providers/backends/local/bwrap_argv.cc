#include "providers/backends/local/bwrap_argv.h"

#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"

namespace agentix::providers::local {
namespace {

// Top-level entries of the root the sandbox gets fresh instead of from it.
const std::set<std::string>& FreshTopLevel() {
  static const auto* fresh =
      new std::set<std::string>{"dev", "proc", "sys", "tmp", "run", "nix"};
  return *fresh;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> BuildBwrapArgv(const BwrapArgs& args) {
  std::vector<std::string> argv = {
      args.bwrap,
      // A user namespace: without it bwrap run by root keeps the host's
      // capability bounding set. Its uid 0 maps to providerd's uid.
      "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
      "--unshare-cgroup-try",
  };
  if (!args.share_net) argv.push_back("--unshare-net");
  argv.insert(argv.end(), {"--hostname", args.sandbox_id, "--die-with-parent",
                           "--new-session", "--cap-drop", "ALL"});
  // Applied last by bwrap, to the namespace's init too.
  if (args.seccomp_fd >= 0) {
    argv.insert(argv.end(), {"--seccomp", std::to_string(args.seccomp_fd)});
  }
  if (args.info_fd >= 0) {
    argv.insert(argv.end(), {"--info-fd", std::to_string(args.info_fd)});
  }
  // The root: an empty tmpfs holding read-only binds of the image's
  // top-level entries, remounted read-only at the end, so /nix and
  // /run/agentix can be mount points even where the image lacks them.
  argv.insert(argv.end(), {"--tmpfs", "/"});
  DIR* dir = ::opendir(args.root.c_str());
  if (dir == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot list root ", args.root, ": ", strerror(errno)));
  }
  std::vector<std::string> names;
  while (dirent* entry = ::readdir(dir)) {
    std::string name = entry->d_name;
    if (name == "." || name == ".." || FreshTopLevel().count(name)) continue;
    names.push_back(std::move(name));
  }
  ::closedir(dir);
  std::sort(names.begin(), names.end());
  const std::string base = args.root == "/" ? "" : args.root;
  for (const std::string& name : names) {
    const std::string path = absl::StrCat(base, "/", name);
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) continue;
    if (S_ISLNK(st.st_mode)) {
      char target[4096];
      ssize_t n = ::readlink(path.c_str(), target, sizeof(target));
      if (n <= 0 || n >= static_cast<ssize_t>(sizeof(target))) continue;
      argv.insert(argv.end(), {"--symlink", std::string(target, n), "/" + name});
    } else if (S_ISDIR(st.st_mode) || S_ISREG(st.st_mode)) {
      argv.insert(argv.end(), {"--ro-bind", path, "/" + name});
    }
  }
  argv.insert(argv.end(), {
      "--ro-bind", args.nix_dir, "/nix",
      "--proc", "/proc",
      // A tmpfs of device nodes, read-only (the devices stay usable).
      "--dev", "/dev",
      "--remount-ro", "/dev",
      "--size", std::to_string(args.shm_bytes), "--tmpfs", "/dev/shm",
      // Every writable mount is a capped tmpfs; no host directory is writable.
      "--size", std::to_string(args.tmp_bytes), "--tmpfs", "/tmp",
      "--size", std::to_string(args.run_bytes), "--tmpfs", "/run",
      // A mount point: the sandbox cannot rename or replace it, so
      // providerd's path through /proc/<init>/root always reaches it.
      "--size", std::to_string(kSocketDirBytes), "--tmpfs", kSandboxRunDir,
      // uid 0 without capabilities: /proc/sys is owned by uid 0 and global.
      "--remount-ro", "/proc",
      "--remount-ro", "/",
      "--chdir", "/tmp",
  });
  argv.insert(argv.end(), args.extra_args.begin(), args.extra_args.end());
  argv.insert(argv.end(), {kEntryPoint, "--listen", kSandboxListen});
  if (args.token_fd >= 0) {
    argv.insert(argv.end(), {args.token_flag,
                             absl::StrCat("/proc/self/fd/", args.token_fd)});
  }
  return argv;
}

}  // namespace agentix::providers::local
