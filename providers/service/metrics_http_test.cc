#include "providers/service/metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include <atomic>
#include <catch2/catch.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/unique_fd.h"
#include "testing/status_matchers.h"

namespace agentix::providers {
namespace {

base::UniqueFd Connect(int port) {
  base::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr),
                    sizeof(addr)) == 0);
  return fd;
}

// Everything the server sends until it closes (bounded: 5 s).
std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  while (true) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) {
      FAIL("server neither answered nor closed within 5 s");
    }
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

std::string Exchange(int port, const std::string& request) {
  base::UniqueFd fd = Connect(port);
  REQUIRE(::send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(request.size()));
  return ReadAll(fd.get());
}

struct Fixture {
  std::atomic<int> scrapes{0};
  std::unique_ptr<MetricsHttpServer> server;
  explicit Fixture(MetricsHttpOptions options = {}) {
    if (options.address.empty()) options.address = "127.0.0.1:0";
    REQUIRE_OK_AND_ASSIGN(server,
                          MetricsHttpServer::Start(options, [this] {
                            ++scrapes;
                            return std::string("agentix_up 1\n");
                          }));
    REQUIRE(server->port() > 0);
  }
};

TEST_CASE("GET /metrics answers the rendered text, then closes", "[metrics]") {
  Fixture f;
  const std::string response =
      Exchange(f.server->port(),
               "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n");
  CHECK(response ==
        "HTTP/1.1 200 OK\r\n"
        "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
        "Content-Length: 13\r\nConnection: close\r\n\r\nagentix_up 1\n");
  CHECK(f.scrapes == 1);
  // A query string is ignored; the request may arrive in pieces.
  base::UniqueFd fd = Connect(f.server->port());
  for (const char* piece : {"GET /metrics?x=1 HT", "TP/1.0\r\n", "\r\n"}) {
    ::send(fd.get(), piece, strlen(piece), MSG_NOSIGNAL);
    ::usleep(20000);
  }
  CHECK(ReadAll(fd.get()).rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
}

TEST_CASE("Other paths, methods and garbage get definite errors", "[metrics]") {
  Fixture f;
  CHECK(Exchange(f.server->port(), "GET / HTTP/1.1\r\n\r\n")
            .rfind("HTTP/1.1 404 Not Found\r\n", 0) == 0);
  CHECK(Exchange(f.server->port(), "POST /metrics HTTP/1.1\r\n\r\n")
            .rfind("HTTP/1.1 405 Method Not Allowed\r\n", 0) == 0);
  CHECK(Exchange(f.server->port(), "hello\r\n\r\n")
            .rfind("HTTP/1.1 400 Bad Request\r\n", 0) == 0);
  CHECK(f.scrapes == 0);
  const std::string head = Exchange(f.server->port(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  CHECK(head.find("Content-Length: 13\r\n") != std::string::npos);
  CHECK(head.substr(head.size() - 4) == "\r\n\r\n");  // no body
}

TEST_CASE("An oversized request head is refused and memory stays bounded",
          "[metrics]") {
  Fixture f;
  base::UniqueFd fd = Connect(f.server->port());
  const std::string junk(MetricsHttpServer::kMaxRequestBytes + 10, 'a');
  ::send(fd.get(), junk.data(), junk.size(), MSG_NOSIGNAL);
  CHECK(ReadAll(fd.get()).rfind("HTTP/1.1 431 ", 0) == 0);
  // Still serving.
  CHECK(Exchange(f.server->port(), "GET /metrics HTTP/1.1\r\n\r\n")
            .rfind("HTTP/1.1 200 OK", 0) == 0);
}

TEST_CASE("Silent and surplus connections are closed", "[metrics]") {
  MetricsHttpOptions options;
  options.max_connections = 2;
  options.idle_timeout = absl::Milliseconds(300);
  Fixture f(options);
  base::UniqueFd a = Connect(f.server->port());
  base::UniqueFd b = Connect(f.server->port());
  ::usleep(50000);
  base::UniqueFd c = Connect(f.server->port());  // beyond the cap
  CHECK(ReadAll(c.get()).empty());
  const absl::Time start = absl::Now();
  CHECK(ReadAll(a.get()).empty());  // closed by the timeout
  CHECK(ReadAll(b.get()).empty());
  CHECK(absl::Now() - start < absl::Seconds(2));
  CHECK(Exchange(f.server->port(), "GET /metrics HTTP/1.1\r\n\r\n")
            .rfind("HTTP/1.1 200 OK", 0) == 0);
}

TEST_CASE("Bad listen addresses are refused", "[metrics]") {
  auto render = [] { return std::string(); };
  CHECK(MetricsHttpServer::Start({"nocolon"}, render).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(MetricsHttpServer::Start({"127.0.0.1:99999"}, render).status().code() ==
        absl::StatusCode::kInvalidArgument);
  Fixture f;
  CHECK(MetricsHttpServer::Start(
            {absl::StrCat("127.0.0.1:", f.server->port())}, render)
            .status()
            .code() == absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace agentix::providers
