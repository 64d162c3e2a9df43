// Test fixtures for the C++ client's tests against the real daemon
// (client_test.cc, conformance_test.cc): agentix-sandboxd with the real
// worker, and a proxy that cuts connections. Runfiles relative to the
// current directory (Bazel's test cwd).
#ifndef AGENTIX_HOST_CC_TEST_DAEMON_H_
#define AGENTIX_HOST_CC_TEST_DAEMON_H_

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "agentix/client.h"
#include "base/child_process.h"
#include "testing/status_matchers.h"

extern char** environ;

namespace agentix {
namespace testing {

// Timing bounds are generous: 2 shared cores, and sanitizer builds.
#if defined(__SANITIZE_ADDRESS__)
constexpr int kSlow = 4;
#else
constexpr int kSlow = 1;
#endif

// Socket paths must fit sun_path (108 bytes): not under $TEST_TMPDIR.
class TempDir {
 public:
  TempDir() : path_("/tmp/agentix-cc-test-XXXXXX") {
    REQUIRE(::mkdtemp(path_.data()) != nullptr);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline bool CanConnect(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

inline std::string Runfile(const std::string& relative) {
  return (std::filesystem::current_path() / relative).string();
}

inline std::string Wheel() {
  for (const auto& entry : std::filesystem::directory_iterator(Runfile("host/python"))) {
    if (entry.path().extension() == ".whl") return entry.path().string();
  }
  FAIL("no agentix wheel in the runfiles");
  return "";
}

// agentix-sandboxd with the real worker; the worker imports e2e_targets and
// agentix (the wheel). Killed by the destructor. With `calls_socket`, its
// frame wire (socket() + ".calls") is up too when the constructor returns.
class Daemon {
 public:
  explicit Daemon(const std::string& token = "", bool calls_socket = true,
                  const std::vector<std::string>& extra_args = {}) {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    base::SpawnOptions spawn;
    spawn.path = Runfile("sandbox/agentix-sandboxd");
    spawn.argv = {spawn.path,
                  "--listen", "unix://" + socket_,
                  "--worker=" + Runfile("worker/agentix-worker"),
                  "--python_path=" + Runfile("testing/fixtures/remote_targets") + ":" + Wheel(),
                  "--log_level=warning"};
    if (!calls_socket) spawn.argv.push_back("--nocalls_socket");
    spawn.argv.insert(spawn.argv.end(), extra_args.begin(), extra_args.end());
    if (!token.empty()) {
      const std::string file = dir_ / "token";
      FILE* f = std::fopen(file.c_str(), "w");
      REQUIRE(f != nullptr);
      std::fputs(token.c_str(), f);
      std::fclose(f);
      REQUIRE(::chmod(file.c_str(), 0600) == 0);
      spawn.argv.push_back("--token_file=" + file);
    }
    spawn.env = env;
    REQUIRE_OK_AND_ASSIGN(child_, base::ChildProcess::Spawn(spawn));
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (!CanConnect(socket_) || (calls_socket && !CanConnect(calls_socket_path()))) {
      if (child_.TryWait().has_value()) FAIL("agentix-sandboxd exited");
      if (absl::Now() > deadline) FAIL("agentix-sandboxd not up in 20 s");
      absl::SleepFor(absl::Milliseconds(5));
    }
  }

  const std::string& socket() const { return socket_; }
  std::string calls_socket_path() const { return socket_ + ".calls"; }
  std::string url() const { return "unix://" + socket_; }
  const TempDir& dir() const { return dir_; }
  pid_t pid() const { return child_.pid(); }

 private:
  TempDir dir_;
  std::string socket_ = dir_ / "sandboxd.sock";
  base::ChildProcess child_;
};

// A Unix-socket proxy that can cut every connection through it at once (as
// testing/proxy/cutting_proxy.py does for the Python host): the client sees
// a broken transport, the daemon a dropped stream.
class CuttingProxy {
 public:
  CuttingProxy(std::string listen_path, std::string upstream)
      : listen_path_(std::move(listen_path)), upstream_(std::move(upstream)) {
    listener_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr = Address(listen_path_);
    REQUIRE(::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(::listen(listener_, 16) == 0);
    acceptor_ = std::thread([this] { Accept(); });
  }
  ~CuttingProxy() {
    stopping_ = true;
    ::shutdown(listener_, SHUT_RDWR);
    acceptor_.join();
    Cut();
    for (std::thread& pump : pumps_) pump.join();
    ::close(listener_);
  }
  std::string url() const { return "unix://" + listen_path_; }
  // Connections accepted so far.
  int accepted() const { return accepted_.load(); }
  // Where connections accepted from now on go.
  void SetUpstream(std::string upstream) {
    absl::MutexLock lock(&mu_);
    upstream_ = std::move(upstream);
  }

  // Aborts every open connection; returns how many fds were cut.
  int Cut() {
    absl::MutexLock lock(&mu_);
    for (int fd : open_) ::shutdown(fd, SHUT_RDWR);
    const int n = static_cast<int>(open_.size());
    open_.clear();
    return n;
  }

 private:
  static sockaddr_un Address(const std::string& path) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
    return addr;
  }
  void Accept() {
    for (;;) {
      const int client = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0 || stopping_) {
        if (client >= 0) ::close(client);
        return;
      }
      ++accepted_;
      const int upstream = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_un addr;
      {
        absl::MutexLock lock(&mu_);
        addr = Address(upstream_);
      }
      if (::connect(upstream, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        ::close(upstream);
        ::close(client);
        continue;
      }
      {
        absl::MutexLock lock(&mu_);
        open_.insert(client);
        open_.insert(upstream);
      }
      auto live = std::make_shared<std::atomic<int>>(2);
      auto pump = [this, live](int from, int to) {
        char buffer[1 << 16];
        for (;;) {
          const ssize_t n = ::read(from, buffer, sizeof(buffer));
          if (n <= 0) break;
          ssize_t off = 0;
          while (off < n) {
            const ssize_t w = ::send(to, buffer + off, n - off, MSG_NOSIGNAL);
            if (w <= 0) break;
            off += w;
          }
          if (off < n) break;
        }
        ::shutdown(from, SHUT_RDWR);
        ::shutdown(to, SHUT_RDWR);
        if (--*live == 0) {
          absl::MutexLock lock(&mu_);
          open_.erase(from);
          open_.erase(to);
          ::close(from);
          ::close(to);
        }
      };
      absl::MutexLock lock(&mu_);
      pumps_.emplace_back(pump, client, upstream);
      pumps_.emplace_back(pump, upstream, client);
    }
  }

  std::string listen_path_;
  std::string upstream_;  // guarded by mu_
  std::atomic<int> accepted_{0};
  int listener_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  absl::Mutex mu_;
  std::set<int> open_;
  std::vector<std::thread> pumps_;
};

inline std::unique_ptr<Client> ConnectTo(const std::string& url, const std::string& token = "",
                                         CallsWire wire = CallsWire::kAuto) {
  ConnectOptions options;
  options.target = url;
  options.token = token;
  options.calls_wire = wire;
  options.reconnect_delay = absl::Milliseconds(50);
  auto client = Client::Connect(options);
  REQUIRE_OK(client.status());
  return *std::move(client);
}

}  // namespace testing
}  // namespace agentix

#endif  // AGENTIX_HOST_CC_TEST_DAEMON_H_
