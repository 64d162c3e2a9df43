#include "sandbox/connection_guard.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/log.h"

namespace agentix::sandbox {
namespace {

// The real calls, bypassing libc's (and any sanitizer's) entry points that
// the definitions at the end of this file replace.
int RawAccept4(int fd, sockaddr* addr, socklen_t* len, int flags) {
  return static_cast<int>(syscall(SYS_accept4, fd, addr, len, flags));
}
int RawClose(int fd) { return static_cast<int>(syscall(SYS_close, fd)); }

// Per-descriptor state readable without the lock: close() and the
// authenticated fast path look here first. Descriptors at or above the
// table's size are never admitted.
constexpr int kTableSize = 1 << 20;
enum : uint8_t { kUntracked = 0, kUnauthenticated = 1, kAuthenticated = 2 };
std::atomic<uint8_t> g_state[kTableSize];

// Set in a fork()ed child, where the lock may be held by a thread that no
// longer exists: the child only ever closes descriptors.
std::atomic<bool> g_in_child{false};

thread_local int t_last_read_fd = -1;

// Accept-time errors that are about the pending connection, not the
// listener (accept4(2): "treat them like EAGAIN by retrying").
bool IsConnectionError(int err) {
  switch (err) {
    case ECONNABORTED: case EPROTO: case ENETDOWN: case ENOPROTOOPT:
    case EHOSTDOWN: case ENONET: case EHOSTUNREACH: case EOPNOTSUPP:
    case ENETUNREACH: case EPERM:
      return true;
    default:
      return false;
  }
}

// The cap key: the peer's IP address; every Unix-socket peer is one peer.
std::string PeerKey(const sockaddr_storage& addr) {
  char text[INET6_ADDRSTRLEN] = "";
  if (addr.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(addr);
    inet_ntop(AF_INET, &in.sin_addr, text, sizeof(text));
    return text;
  }
  if (addr.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(addr);
    if (IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr)) {
      inet_ntop(AF_INET, &in6.sin6_addr.s6_addr[12], text, sizeof(text));
    } else {
      inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof(text));
    }
    return text;
  }
  if (addr.ss_family == AF_UNIX) return "unix";
  return absl::StrCat("family-", addr.ss_family);
}

class Guard {
 public:
  void SetLimits(const ConnectionLimits& limits) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    limits_ = limits;
  }

  absl::Status ReserveFd() ABSL_LOCKS_EXCLUDED(drain_mu_) {
    absl::MutexLock lock(&drain_mu_);
    if (reserve_fd_ < 0) reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (reserve_fd_ < 0) {
      return absl::InternalError(absl::StrCat(
          "cannot reserve a descriptor for accepting when out of them: ",
          std::strerror(errno)));
    }
    return absl::OkStatus();
  }

  void StartReaper() {
    std::thread([this] {
      pthread_setname_np(pthread_self(), "agx-conn-guard");
      for (;;) absl::SleepFor(Reap());
    }).detach();
  }

  // accept4 as gRPC sees it: a connection within the caps, or -1.
  int Accept(int listen_fd, sockaddr* addr, socklen_t* len, int flags) {
    // Bounded so a listener in a persistent error state cannot spin here.
    for (int attempt = 0; attempt < 4096; ++attempt) {
      sockaddr_storage peer;
      socklen_t peer_len = sizeof(peer);
      const int fd = RawAccept4(listen_fd, reinterpret_cast<sockaddr*>(&peer),
                                &peer_len, flags);
      if (fd < 0) {
        const int err = errno;
        if (err == EMFILE || err == ENFILE) {
          if (DrainOne(listen_fd)) continue;
          errno = EAGAIN;
          return -1;
        }
        if (err == ENOBUFS || err == ENOMEM) {
          errno = EAGAIN;  // keep the listener; the next connection retries
          return -1;
        }
        if (IsConnectionError(err)) continue;
        errno = err;
        return -1;
      }
      if (!Admit(fd, peer)) {
        RawClose(fd);
        refused_.fetch_add(1, std::memory_order_relaxed);
        MaybeWarn();
        continue;
      }
      if (addr != nullptr && len != nullptr) {
        std::memcpy(addr, &peer, std::min<socklen_t>(*len, peer_len));
        *len = peer_len;
      }
      return fd;
    }
    errno = EAGAIN;
    return -1;
  }

  void OnClose(int fd) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(fd);
    if (it != entries_.end()) Forget(it);
    g_state[fd].store(kUntracked, std::memory_order_release);
  }

  // Moves `fd`'s entry to the handed-over count; the close that follows
  // finds nothing to forget.
  bool HandOver(int fd) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(fd);
    if (it == entries_.end()) return false;
    Forget(it);
    g_state[fd].store(kUntracked, std::memory_order_release);
    ++handed_over_;
    return true;
  }

  void ReleaseHandedOver() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (handed_over_ > 0) --handed_over_;
  }

  void MarkAuthenticated(int fd) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(fd);
    if (it == entries_.end() || it->second.authenticated) return;
    it->second.authenticated = true;
    DecrementPeer(it->second.peer);
    g_state[fd].store(kAuthenticated, std::memory_order_release);
  }

  void CountTimedOut(int fd) ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      auto it = entries_.find(fd);
      if (it == entries_.end() || it->second.authenticated ||
          it->second.shut_down) {
        return;
      }
      it->second.shut_down = true;  // its owner closes it; Reap leaves it
    }
    timed_out_.fetch_add(1, std::memory_order_relaxed);
    MaybeWarn();
  }

  ConnectionGuardStats Stats() ABSL_LOCKS_EXCLUDED(mu_) {
    ConnectionGuardStats stats;
    {
      absl::MutexLock lock(&mu_);
      stats.open = entries_.size() + handed_over_;
      stats.handed_over = handed_over_;
      for (const auto& [peer, count] : unauthenticated_by_peer_) {
        stats.unauthenticated += count;
      }
    }
    stats.refused = refused_.load(std::memory_order_relaxed);
    stats.dropped_no_fd = dropped_no_fd_.load(std::memory_order_relaxed);
    stats.timed_out = timed_out_.load(std::memory_order_relaxed);
    return stats;
  }

 private:
  struct Entry {
    dev_t dev;
    ino_t ino;
    std::string peer;
    absl::Time accepted;
    bool authenticated = false;
    bool shut_down = false;
  };
  using Map = absl::flat_hash_map<int, Entry>;

  // Out of descriptors: spends the reserved one to take the pending
  // connection off the queue and close it, so the listener is not left
  // with a connection it can never accept. False when none was pending or
  // the reserve could not be had.
  bool DrainOne(int listen_fd) ABSL_LOCKS_EXCLUDED(drain_mu_) {
    absl::MutexLock lock(&drain_mu_);
    if (reserve_fd_ < 0) reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (reserve_fd_ < 0) return false;
    RawClose(reserve_fd_);
    const int fd = RawAccept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) RawClose(fd);
    reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    dropped_no_fd_.fetch_add(1, std::memory_order_relaxed);
    MaybeWarn();
    return true;
  }

  bool Admit(int fd, const sockaddr_storage& peer) ABSL_LOCKS_EXCLUDED(mu_) {
    if (fd >= kTableSize) return false;
    struct stat st;
    if (::fstat(fd, &st) != 0) return false;
    std::string key = PeerKey(peer);
    absl::MutexLock lock(&mu_);
    // A stale entry: that descriptor was closed without passing close().
    if (auto it = entries_.find(fd); it != entries_.end()) Forget(it);
    if (entries_.size() + handed_over_ >= limits_.max_connections) return false;
    size_t& unauthenticated = unauthenticated_by_peer_[key];
    if (unauthenticated >= limits_.max_unauthenticated_per_peer) {
      if (unauthenticated == 0) unauthenticated_by_peer_.erase(key);
      return false;
    }
    ++unauthenticated;
    entries_.emplace(fd, Entry{st.st_dev, st.st_ino, std::move(key),
                               absl::Now()});
    g_state[fd].store(kUnauthenticated, std::memory_order_release);
    return true;
  }

  void Forget(Map::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!it->second.authenticated) DecrementPeer(it->second.peer);
    entries_.erase(it);
  }

  void DecrementPeer(const std::string& peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = unauthenticated_by_peer_.find(peer);
    if (it == unauthenticated_by_peer_.end()) return;
    if (--it->second == 0) unauthenticated_by_peer_.erase(it);
  }

  // Shuts down the connections past the timeout; returns how long to sleep.
  absl::Duration Reap() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    uint64_t shut = 0;
    for (auto it = entries_.begin(); it != entries_.end();) {
      auto next = std::next(it);
      Entry& entry = it->second;
      if (!entry.authenticated && !entry.shut_down &&
          now - entry.accepted >= limits_.auth_timeout) {
        // close() keeps the table exact; the inode check guards against a
        // descriptor closed some other way and reused for another socket.
        struct stat st;
        if (::fstat(it->first, &st) != 0 || st.st_ino != entry.ino ||
            st.st_dev != entry.dev) {
          g_state[it->first].store(kUntracked, std::memory_order_release);
          Forget(it);
        } else {
          ::shutdown(it->first, SHUT_RDWR);
          entry.shut_down = true;
          ++shut;
        }
      }
      it = next;
    }
    if (shut > 0) {
      timed_out_.fetch_add(shut, std::memory_order_relaxed);
      MaybeWarn();
    }
    return std::clamp(limits_.auth_timeout / 4, absl::Milliseconds(10),
                      absl::Seconds(1));
  }

  // One warning per interval at most: a flood must not flood the log.
  void MaybeWarn() {
    const int64_t now = absl::ToUnixNanos(absl::Now());
    int64_t last = last_warning_ns_.load(std::memory_order_relaxed);
    if (now - last < absl::ToInt64Nanoseconds(absl::Seconds(10)) ||
        !last_warning_ns_.compare_exchange_strong(last, now)) {
      return;
    }
    AGX_LOG(Warning,
            "connection limits: {} refused at a cap, {} closed for want of a "
            "file descriptor, {} shut down without an authenticated RPC "
            "or frame-wire HELLO (totals so far)",
            refused_.load(), dropped_no_fd_.load(), timed_out_.load());
  }

  absl::Mutex mu_;
  ConnectionLimits limits_ ABSL_GUARDED_BY(mu_);
  Map entries_ ABSL_GUARDED_BY(mu_);
  size_t handed_over_ ABSL_GUARDED_BY(mu_) = 0;  // HandOver, not released
  absl::flat_hash_map<std::string, size_t> unauthenticated_by_peer_
      ABSL_GUARDED_BY(mu_);

  absl::Mutex drain_mu_;
  int reserve_fd_ ABSL_GUARDED_BY(drain_mu_) = -1;

  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> dropped_no_fd_{0};
  std::atomic<uint64_t> timed_out_{0};
  std::atomic<int64_t> last_warning_ns_{0};
};

// Never destroyed: close() may run during exit, after static destructors.
std::atomic<Guard*> g_guard{nullptr};

Guard* ActiveGuard() {
  if (g_in_child.load(std::memory_order_relaxed)) return nullptr;
  return g_guard.load(std::memory_order_acquire);
}

}  // namespace

absl::Status StartConnectionGuard(const ConnectionLimits& limits) {
  if (limits.max_connections == 0 || limits.max_unauthenticated_per_peer == 0) {
    return absl::InvalidArgumentError("connection caps must be at least 1");
  }
  if (limits.auth_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the auth timeout must be positive");
  }
  static absl::Mutex start_mu(absl::kConstInit);
  absl::MutexLock lock(&start_mu);
  Guard* guard = g_guard.load(std::memory_order_acquire);
  const bool first = guard == nullptr;
  if (first) guard = new Guard();
  guard->SetLimits(limits);
  if (absl::Status reserved = guard->ReserveFd(); !reserved.ok()) {
    if (first) delete guard;
    return reserved;
  }
  if (first) {
    pthread_atfork(nullptr, nullptr,
                   [] { g_in_child.store(true, std::memory_order_relaxed); });
    guard->StartReaper();
    g_guard.store(guard, std::memory_order_release);
  }
  return absl::OkStatus();
}

void MarkCurrentConnectionAuthenticated() {
  const int fd = t_last_read_fd;
  if (fd < 0 || fd >= kTableSize ||
      g_state[fd].load(std::memory_order_acquire) != kUnauthenticated) {
    return;
  }
  if (Guard* guard = ActiveGuard()) guard->MarkAuthenticated(fd);
}

void CountConnectionTimedOut(int fd) {
  if (fd < 0 || fd >= kTableSize ||
      g_state[fd].load(std::memory_order_acquire) != kUnauthenticated) {
    return;
  }
  if (Guard* guard = ActiveGuard()) guard->CountTimedOut(fd);
}

bool HandOverConnection(int fd) {
  if (fd < 0 || fd >= kTableSize ||
      g_state[fd].load(std::memory_order_acquire) == kUntracked) {
    return false;
  }
  Guard* guard = ActiveGuard();
  return guard != nullptr && guard->HandOver(fd);
}

void ReleaseHandedOverConnection() {
  if (Guard* guard = ActiveGuard()) guard->ReleaseHandedOver();
}

ConnectionGuardStats GetConnectionGuardStats() {
  Guard* guard = ActiveGuard();
  return guard != nullptr ? guard->Stats() : ConnectionGuardStats{};
}

}  // namespace agentix::sandbox

// The interposed entry points. libgrpc calls these through its PLT; the
// linker exports them from the executable because a linked shared library
// references them.
extern "C" {

int accept4(int fd, sockaddr* addr, socklen_t* len, int flags) {
  using namespace agentix::sandbox;
  if (Guard* guard = ActiveGuard()) return guard->Accept(fd, addr, len, flags);
  return RawAccept4(fd, addr, len, flags);
}

int close(int fd) {
  using namespace agentix::sandbox;
  if (fd >= 0 && fd < kTableSize &&
      g_state[fd].load(std::memory_order_acquire) != kUntracked) {
    if (Guard* guard = ActiveGuard()) guard->OnClose(fd);
  }
  return RawClose(fd);
}

// Remembers which connection this thread read last: the token check that
// follows on the same thread marks that one (MarkCurrentConnectionAuthenticated).
ssize_t recvmsg(int fd, msghdr* msg, int flags) {
  agentix::sandbox::t_last_read_fd = fd;
  return syscall(SYS_recvmsg, fd, msg, flags);
}

}  // extern "C"
