#include "sandbox/socket_path.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/log.h"

namespace agentix::sandbox {
namespace {

absl::Mutex g_mu(absl::kConstInit);
// Leaked: unlink() may run during exit, after static destructors.
std::vector<std::string>* g_claims ABSL_GUARDED_BY(g_mu) = nullptr;

int RawUnlink(const char* path) {
  return static_cast<int>(syscall(SYS_unlinkat, AT_FDCWD, path, 0));
}

// Whether a process other than this one listens at `path`. Asked of the
// socket itself (the listener's credentials), not of the file's inode
// number, which the file system reuses at once for the next socket file.
bool AnotherProcessListensAt(const char* path) {
  sockaddr_un addr{};
  if (std::strlen(path) >= sizeof(addr.sun_path)) return false;
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, path);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return false;
  bool other = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    ucred cred{};
    socklen_t len = sizeof(cred);
    other = ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 &&
            cred.pid != ::getpid();
  } else {
    other = errno == EAGAIN;  // a live listener with a full backlog
  }
  ::close(fd);
  return other;
}

// Repeated slashes collapsed: gRPC unlinks "///a/b" for "unix:///a/b".
std::string CollapseSlashes(const char* path) {
  std::string out;
  for (const char* c = path; *c != '\0'; ++c) {
    if (*c != '/' || out.empty() || out.back() != '/') out.push_back(*c);
  }
  return out;
}

// Whether `path` may be unlinked: not claimed, or no other process's
// listener is there (ours, or a stale file).
bool MayUnlink(const char* path) ABSL_LOCKS_EXCLUDED(g_mu) {
  {
    absl::MutexLock lock(&g_mu);
    if (g_claims == nullptr ||
        std::find(g_claims->begin(), g_claims->end(),
                  CollapseSlashes(path)) == g_claims->end()) {
      return true;
    }
  }
  struct stat st;
  if (::lstat(path, &st) != 0 || !S_ISSOCK(st.st_mode)) return true;
  if (!AnotherProcessListensAt(path)) return true;
  AGX_LOG(Info, "leaving {}: it is no longer this daemon's socket", path);
  return false;
}

}  // namespace

bool ClaimSocketPath(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  absl::MutexLock lock(&g_mu);
  if (g_claims == nullptr) g_claims = new std::vector<std::string>();
  g_claims->push_back(CollapseSlashes(path.c_str()));
  return true;
}

void RemoveOwnSocketPaths() {
  std::vector<std::string> paths;
  {
    absl::MutexLock lock(&g_mu);
    if (g_claims == nullptr) return;
    paths = *g_claims;
  }
  for (const auto& path : paths) ::unlink(path.c_str());
}

}  // namespace agentix::sandbox

// libgrpc's unlink of a listener's path comes here (see the header).
extern "C" int unlink(const char* path) {
  if (path != nullptr && !agentix::sandbox::MayUnlink(path)) {
    errno = ENOENT;
    return -1;
  }
  return agentix::sandbox::RawUnlink(path);
}
