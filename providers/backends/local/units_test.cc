// Unit tests of the local backend's pure parts: the bwrap command line, the
// cgroup path logic and the log's rotation and offsets.
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include "providers/backends/local/bwrap_argv.h"
#include "providers/backends/local/cgroups.h"
#include "providers/backends/local/sandbox_log.h"
#include "testing/status_matchers.h"

namespace agentix::providers::local {
namespace {

std::string TempDir() {
  std::string base = getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp";
  std::string path = base + "/lbXXXXXX";
  REQUIRE(mkdtemp(path.data()) != nullptr);
  return path;
}

// Every value following `flag` (one argument each).
std::vector<std::string> After(const std::vector<std::string>& argv, const std::string& flag, int n = 1) {
  std::vector<std::string> out;
  for (size_t i = 0; i + n < argv.size(); ++i) {
    if (argv[i] != flag) continue;
    std::string joined;
    for (int k = 1; k <= n; ++k) joined += (k > 1 ? " " : "") + argv[i + k];
    out.push_back(joined);
  }
  return out;
}

TEST_CASE("bwrap argv: namespaces, fds, a tmpfs root of read-only binds, capped tmpfs") {
  const std::string root = TempDir();
  REQUIRE(mkdir((root + "/usr").c_str(), 0755) == 0);
  REQUIRE(mkdir((root + "/etc").c_str(), 0755) == 0);
  REQUIRE(mkdir((root + "/proc").c_str(), 0755) == 0);  // fresh, not bound
  REQUIRE(mkdir((root + "/tmp").c_str(), 0755) == 0);
  std::ofstream(root + "/marker") << "x";
  REQUIRE(symlink("usr/bin", (root + "/bin").c_str()) == 0);
  BwrapArgs args;
  args.bwrap = "/usr/bin/bwrap";
  args.sandbox_id = "sbx-1";
  args.root = root;
  args.nix_dir = "/b/nix";
  args.seccomp_fd = 3;
  args.token_fd = 4;
  args.info_fd = 5;
  args.tmp_bytes = 100 << 20;
  args.run_bytes = 4096;
  args.shm_bytes = 1 << 20;
  REQUIRE_OK_AND_ASSIGN(auto argv, BuildBwrapArgv(args));
  for (const char* flag : {"--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc",
                           "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent", "--new-session"}) {
    CHECK(std::count(argv.begin(), argv.end(), flag) == 1);
  }
  CHECK(After(argv, "--hostname") == std::vector<std::string>{"sbx-1"});
  CHECK(After(argv, "--cap-drop") == std::vector<std::string>{"ALL"});
  CHECK(After(argv, "--seccomp") == std::vector<std::string>{"3"});
  CHECK(After(argv, "--info-fd") == std::vector<std::string>{"5"});
  CHECK(After(argv, "--ro-bind", 2) == std::vector<std::string>{
      root + "/etc /etc", root + "/marker /marker", root + "/usr /usr", "/b/nix /nix"});
  CHECK(After(argv, "--symlink", 2) == std::vector<std::string>{"usr/bin /bin"});
  CHECK(After(argv, "--bind").empty());  // no host directory is writable
  CHECK(After(argv, "--tmpfs") == std::vector<std::string>{"/", "/dev/shm", "/tmp", "/run", "/run/agentix"});
  CHECK(After(argv, "--size", 3) == std::vector<std::string>{
      "1048576 --tmpfs /dev/shm", "104857600 --tmpfs /tmp", "4096 --tmpfs /run",
      "1048576 --tmpfs /run/agentix"});
  CHECK(After(argv, "--remount-ro") == std::vector<std::string>{"/dev", "/proc", "/"});
  // The entry point and its arguments come last; the token by fd path.
  std::vector<std::string> tail(argv.end() - 5, argv.end());
  CHECK(tail == std::vector<std::string>{"/nix/runtime/bootstrap.sh", "--listen",
                                         "unix:///run/agentix/agentix.sock",
                                         "--admin-token-file", "/proc/self/fd/4"});

  args.share_net = true;
  args.seccomp_fd = -1;
  args.token_flag = "--token-file";
  REQUIRE_OK_AND_ASSIGN(auto shared, BuildBwrapArgv(args));
  CHECK(std::count(shared.begin(), shared.end(), "--unshare-net") == 0);
  CHECK(std::count(shared.begin(), shared.end(), "--seccomp") == 0);
  CHECK(shared[shared.size() - 2] == "--token-file");

  args.root = root + "/absent";
  CHECK(BuildBwrapArgv(args).status().code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("the host root binds its top-level entries, never /proc /dev /sys /tmp /run") {
  BwrapArgs args;
  args.bwrap = "bwrap";
  args.sandbox_id = "s";
  args.root = "/";
  args.nix_dir = "/n";
  REQUIRE_OK_AND_ASSIGN(auto argv, BuildBwrapArgv(args));
  auto binds = After(argv, "--ro-bind", 2);
  CHECK(std::count(binds.begin(), binds.end(), "/etc /etc") == 1);
  for (const auto& bind : binds) {
    for (const char* fresh : {"/proc ", "/dev ", "/sys ", "/tmp ", "/run "}) {
      CHECK(bind.rfind(fresh, 0) != 0);
    }
  }
}

TEST_CASE("cgroup paths nest under providerd's own cgroup of each controller") {
  const std::string self =
      "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/abc\n1:cpu,cpuacct:/slice\n0::/\n";
  CHECK(OwnCgroup(self, "memory") == std::optional<std::string>("/process_api/abc"));
  CHECK(OwnCgroup(self, "pids") == std::optional<std::string>("/"));
  CHECK(OwnCgroup(self, "cpu") == std::optional<std::string>("/slice"));
  CHECK(OwnCgroup(self, "cpuacct") == std::optional<std::string>("/slice"));
  CHECK_FALSE(OwnCgroup(self, "freezer").has_value());
  CHECK(SandboxCgroupPath("/sys/fs/cgroup/", "memory", "/process_api/abc", "agentix", "s1") ==
        "/sys/fs/cgroup/memory/process_api/abc/agentix/s1");
  CHECK(SandboxCgroupPath("/sys/fs/cgroup", "pids", "/", "agentix", "s1") ==
        "/sys/fs/cgroup/pids/agentix/s1");
  CHECK(OomKills("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n") == 3);
  CHECK(OomKills("oom_kill_disable 0\nunder_oom 0\n") == 0);
}

TEST_CASE("an unmounted controller is reported unusable with the reason") {
  const std::string root = TempDir();
  std::string why = CgroupUnusable(root, "memory", std::string("/"));
  CHECK(why.find("is not mounted at " + root + "/memory") != std::string::npos);
  CHECK(CgroupUnusable(root, "memory", std::nullopt).find("not mounted") != std::string::npos);
  REQUIRE(mkdir((root + "/pids").c_str(), 0755) == 0);
  std::ofstream(root + "/pids/cgroup.procs") << "";
  CHECK(CgroupUnusable(root, "pids", std::string("/")).empty());
  // A plain directory stands in for a cgroup: rmdir of it and its empty parent.
  REQUIRE(mkdir((root + "/pids/agentix").c_str(), 0755) == 0);
  REQUIRE(mkdir((root + "/pids/agentix/s1").c_str(), 0755) == 0);
  REQUIRE_OK(RemoveCgroup(root + "/pids/agentix/s1"));
  CHECK(access((root + "/pids/agentix").c_str(), F_OK) != 0);
  REQUIRE_OK(RemoveCgroup(root + "/pids/agentix/s1"));  // missing: OK
  CHECK(WriteCgroupFile(root, "absent/file", "1").code() == absl::StatusCode::kNotFound);
}

TEST_CASE("the log rotates at half the cap and keeps offsets over the whole output") {
  const std::string dir = TempDir();
  SandboxLog log(dir, 64 << 10);  // 32 KiB per file
  const std::string chunk(4095, 'x');
  for (int i = 0; i < 1024; ++i) log.Append(chunk + "\n");  // 4 MiB
  log.Append("the last line\n");
  log.Close();
  const int64_t total = 1024 * 4096 + 14;
  CHECK(log.total() == total);
  struct stat a, b;
  REQUIRE(stat((dir + "/sandbox.log").c_str(), &a) == 0);
  REQUIRE(stat((dir + "/sandbox.log.1").c_str(), &b) == 0);
  CHECK(a.st_size <= 32 << 10);
  CHECK(b.st_size == 32 << 10);
  CHECK(a.st_size + b.st_size <= 64 << 10);
  CHECK(log.Tail(14) == "the last line\n");
  // From the start: rotated away, so it starts at the oldest byte kept.
  SandboxLog::Chunk first = log.Read(0, 1 << 20);
  CHECK(first.truncated);
  CHECK(first.offset == total - a.st_size - b.st_size);
  // Offsets are exact across the two files.
  SandboxLog::Chunk end = log.Read(total - 14, 100);
  CHECK_FALSE(end.truncated);
  CHECK(end.data == "the last line\n");
  CHECK(end.end);
  const int64_t boundary = total - a.st_size;  // first byte of sandbox.log
  SandboxLog::Chunk before = log.Read(boundary - 2, 2);
  CHECK(before.offset == boundary - 2);
  CHECK(before.data.size() == 2);
  SandboxLog::Chunk across = log.Read(boundary - 1, 100);
  CHECK(across.data.size() == 1);  // a read stops at the file boundary
  CHECK(log.Read(boundary, 1).offset == boundary);
  CHECK(log.Read(total + 50, 10).data.empty());
  // The tail reaches back across the boundary.
  const std::string all = log.Tail(40 << 10);  // more than is kept
  CHECK(all.size() == static_cast<size_t>(a.st_size + b.st_size));
  CHECK(all.substr(all.size() - 14) == "the last line\n");
  CHECK(all.find('\n') == static_cast<size_t>(4095 - (first.offset % 4096)));
}

TEST_CASE("a log whose directory is gone keeps counting (the pipe is drained)") {
  const std::string dir = TempDir();
  SandboxLog log(dir + "/absent", 1 << 20);
  log.Append("abc");
  CHECK(log.total() == 3);
  CHECK(log.Tail(10).empty());
  CHECK_FALSE(log.WaitBeyond(3, absl::Now() + absl::Milliseconds(20)));
  log.Close();
  CHECK(log.WaitBeyond(3, absl::Now() + absl::Milliseconds(20)));
}

}  // namespace
}  // namespace agentix::providers::local
