#include "sandbox/socket_path.h"

#include <sys/socket.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>

namespace agentix::sandbox {
namespace {

int BindUnix(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  return fd;
}

bool IsSocket(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

std::string TempDir() {
  char dir[] = "/tmp/agentix-socket-path-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  return dir;
}

TEST_CASE("A newer process's socket at a claimed path is not unlinked",
          "[socket_path]") {
  const std::string dir = TempDir();
  const std::string path = dir + "/d.sock";
  const int ours = BindUnix(path);
  REQUIRE(::listen(ours, 4) == 0);
  REQUIRE(ClaimSocketPath(path));
  // Another daemon takes the path over: unlinks our file, listens on its own
  // (often with the inode number our file had).
  REQUIRE(::unlink(path.c_str()) == 0);
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t other = ::fork();
  REQUIRE(other >= 0);
  if (other == 0) {
    const int theirs = BindUnix(path);
    ::listen(theirs, 4);
    ::write(ready[1], "x", 1);
    ::pause();
    ::_exit(0);
  }
  char byte;
  REQUIRE(::read(ready[0], &byte, 1) == 1);
  // What gRPC does when our listener closes (with the URI's slashes), and
  // what shutdown does.
  CHECK(::unlink(("//" + path).c_str()) == -1);
  CHECK(::unlink(path.c_str()) == -1);
  RemoveOwnSocketPaths();
  CHECK(IsSocket(path));
  ::kill(other, SIGKILL);
  ::waitpid(other, nullptr, 0);
  // With no other listener there, the stale file goes.
  RemoveOwnSocketPaths();
  CHECK_FALSE(IsSocket(path));
  for (int fd : {ours, ready[0], ready[1]}) ::close(fd);
}

TEST_CASE("Our own socket is removed; unclaimed paths unlink as usual",
          "[socket_path]") {
  const std::string dir = TempDir();
  const std::string path = dir + "/own.sock";
  const int fd = BindUnix(path);
  REQUIRE(ClaimSocketPath(path));
  RemoveOwnSocketPaths();
  CHECK_FALSE(IsSocket(path));
  const std::string other = dir + "/other.sock";
  const int other_fd = BindUnix(other);
  CHECK(::unlink(other.c_str()) == 0);
  CHECK_FALSE(ClaimSocketPath(dir + "/missing.sock"));
  ::close(fd);
  ::close(other_fd);
  ::rmdir(dir.c_str());
}

}  // namespace
}  // namespace agentix::sandbox
