#include "sandbox/connection_guard.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <catch2/catch.hpp>
#include <vector>

namespace agentix::sandbox {
namespace {

// A non-blocking loopback listener and its port.
std::pair<int, int> Listen() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::listen(fd, 64) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  return {fd, ntohs(addr.sin_port)};
}

int Connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  return fd;
}

// accept4 as gRPC calls it (the guard's, in this binary).
int Accept(int listener) {
  sockaddr_storage addr;
  socklen_t len = sizeof(addr);
  return ::accept4(listener, reinterpret_cast<sockaddr*>(&addr), &len,
                   SOCK_NONBLOCK | SOCK_CLOEXEC);
}

// Whether the server side closed or shut down `client` within `ms`.
bool PeerClosed(int client, int ms) {
  pollfd p = {client, POLLIN, 0};
  if (::poll(&p, 1, ms) != 1) return false;
  char byte;
  ssize_t n = ::recv(client, &byte, 1, MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

// The server side reads what `client` sent, as gRPC does before the token
// check, then the check marks it.
void Authenticate(int client, int server) {
  REQUIRE(::send(client, "x", 1, 0) == 1);
  pollfd p = {server, POLLIN, 0};
  REQUIRE(::poll(&p, 1, 2000) == 1);
  char byte;
  msghdr msg{};
  iovec iov = {&byte, 1};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  REQUIRE(::recvmsg(server, &msg, 0) == 1);
  MarkCurrentConnectionAuthenticated();
}

// Two connections accepted on `listener`: one that never authenticates and
// one that does (client and server ends of each).
std::array<int, 4> IdleAndAuthenticated(int listener, int port) {
  const int idle_client = Connect(port);
  const int idle_server = Accept(listener);
  const int good_client = Connect(port);
  const int good_server = Accept(listener);
  REQUIRE(idle_server >= 0);
  REQUIRE(good_server >= 0);
  Authenticate(good_client, good_server);
  return {idle_client, idle_server, good_client, good_server};
}

ConnectionLimits Limits(size_t total, size_t per_peer, absl::Duration timeout) {
  ConnectionLimits limits;
  limits.max_connections = total;
  limits.max_unauthenticated_per_peer = per_peer;
  limits.auth_timeout = timeout;
  return limits;
}

TEST_CASE("Out of descriptors, the pending connection is closed and the "
          "listener kept", "[connection_guard]") {
  REQUIRE(StartConnectionGuard(Limits(1000, 1000, absl::Minutes(1))).ok());
  auto [listener, port] = Listen();
  const int client = Connect(port);
  const uint64_t dropped_before = GetConnectionGuardStats().dropped_no_fd;

  rlimit saved;
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
  std::vector<int> filler;
  for (int fd; (fd = ::dup(0)) >= 0;) filler.push_back(fd);
  // A low soft limit: every descriptor below it is now taken.
  rlimit low = {static_cast<rlim_t>(filler.back() + 1), saved.rlim_max};
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  errno = 0;
  // Not EMFILE (gRPC 1.51 drops a listener on that): EAGAIN, and the pending
  // connection was taken off the queue and closed.
  CHECK(Accept(listener) == -1);
  CHECK(errno == EAGAIN);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &saved) == 0);
  for (int fd : filler) ::close(fd);
  CHECK(PeerClosed(client, 2000));
  CHECK(GetConnectionGuardStats().dropped_no_fd == dropped_before + 1);

  // The same listener accepts once descriptors are back.
  const int again = Connect(port);
  const int server = Accept(listener);
  CHECK(server >= 0);
  for (int fd : {client, again, server, listener}) ::close(fd);
}

TEST_CASE("Connections past the caps are closed at accept; authenticated "
          "ones leave the per-peer count", "[connection_guard]") {
  REQUIRE(StartConnectionGuard(Limits(3, 2, absl::Minutes(1))).ok());
  auto [listener, port] = Listen();
  const uint64_t refused_before = GetConnectionGuardStats().refused;
  std::vector<int> clients, servers;
  for (int i = 0; i < 3; ++i) clients.push_back(Connect(port));
  servers.push_back(Accept(listener));
  servers.push_back(Accept(listener));
  REQUIRE(servers[0] >= 0);
  REQUIRE(servers[1] >= 0);
  CHECK(Accept(listener) == -1);  // the third: per-peer cap of 2
  CHECK(errno == EAGAIN);
  CHECK(PeerClosed(clients[2], 2000));
  CHECK(GetConnectionGuardStats().refused == refused_before + 1);
  CHECK(GetConnectionGuardStats().unauthenticated == 2);

  Authenticate(clients[0], servers[0]);
  CHECK(GetConnectionGuardStats().unauthenticated == 1);
  clients.push_back(Connect(port));
  servers.push_back(Accept(listener));  // per-peer room again
  CHECK(servers.back() >= 0);
  CHECK(GetConnectionGuardStats().open == 3);

  clients.push_back(Connect(port));
  CHECK(Accept(listener) == -1);  // the total cap of 3
  CHECK(PeerClosed(clients.back(), 2000));

  ::close(servers[1]);  // close() gives the slot back
  CHECK(GetConnectionGuardStats().open == 2);
  clients.push_back(Connect(port));
  servers.push_back(Accept(listener));
  CHECK(servers.back() >= 0);
  for (int fd : clients) ::close(fd);
  for (size_t i = 0; i < servers.size(); ++i) {
    if (i != 1) ::close(servers[i]);
  }
  ::close(listener);
  CHECK(GetConnectionGuardStats().open == 0);
}

TEST_CASE("A connection without an authenticated RPC is shut down after the "
          "timeout", "[connection_guard]") {
  REQUIRE(StartConnectionGuard(Limits(100, 100, absl::Milliseconds(200))).ok());
  auto [listener, port] = Listen();
  const uint64_t timed_out_before = GetConnectionGuardStats().timed_out;
  const auto [idle_client, idle_server, good_client, good_server] =
      IdleAndAuthenticated(listener, port);

  CHECK(PeerClosed(idle_client, 3000));
  CHECK_FALSE(PeerClosed(good_client, 500));
  CHECK(GetConnectionGuardStats().timed_out == timed_out_before + 1);
  for (int fd : {idle_client, idle_server, good_client, good_server, listener}) {
    ::close(fd);
  }
}

TEST_CASE("A connection its listener ends for want of authentication is "
          "counted once, and only while unauthenticated", "[connection_guard]") {
  REQUIRE(StartConnectionGuard(Limits(100, 100, absl::Minutes(1))).ok());
  auto [listener, port] = Listen();
  const uint64_t timed_out_before = GetConnectionGuardStats().timed_out;
  const auto [idle_client, idle_server, good_client, good_server] =
      IdleAndAuthenticated(listener, port);

  CountConnectionTimedOut(idle_server);
  CountConnectionTimedOut(idle_server);  // once per connection
  CountConnectionTimedOut(good_server);  // authenticated: not counted
  CountConnectionTimedOut(listener);     // not a tracked connection
  CHECK(GetConnectionGuardStats().timed_out == timed_out_before + 1);
  // Still the listener's to close (the guard does not shut it down).
  CHECK_FALSE(PeerClosed(idle_client, 200));
  for (int fd : {idle_client, idle_server, good_client, good_server, listener}) {
    ::close(fd);
  }
  CHECK(GetConnectionGuardStats().open == 0);
}

TEST_CASE("Limits are validated", "[connection_guard]") {
  CHECK(StartConnectionGuard(Limits(0, 1, absl::Seconds(1))).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(StartConnectionGuard(Limits(1, 0, absl::Seconds(1))).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(StartConnectionGuard(Limits(1, 1, absl::ZeroDuration())).code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace agentix::sandbox
