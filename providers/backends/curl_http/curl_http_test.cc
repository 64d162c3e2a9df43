// CurlClient over a Unix socket against a one-connection-at-a-time HTTP
// server in this process: what reaches the server (method, headers, body),
// keep-alive reuse, the body bound, a stream cancelled from another thread,
// and transport errors naming the peer and what connect said.
#include "providers/backends/curl_http/curl_http.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace agentix::providers::curl_http {
namespace {

std::string TempSocketPath() {
  char dir[] = "/tmp/curlhttp-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  return std::string(dir) + "/s.sock";
}

// Serves connections one after the other; answers each request with
// `answer(request)`; records requests and accepted connections.
class TinyServer {
 public:
  explicit TinyServer(std::string path, std::function<std::string(const std::string&)> answer)
      : path_(std::move(path)), answer_(std::move(answer)) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path_.c_str());
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(::listen(fd_, 4) == 0);
    thread_ = std::thread([this] { Serve(); });
  }
  ~TinyServer() {
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  std::string last_request() {
    absl::MutexLock lock(&mu_);
    return last_;
  }
  int connections() const { return connections_.load(); }

 private:
  void Serve() {
    for (;;) {
      int conn = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (conn < 0) return;
      connections_++;
      std::string buffer;
      char chunk[4096];
      for (;;) {
        size_t head = buffer.find("\r\n\r\n");
        if (head != std::string::npos) {
          size_t length = 0;
          size_t at = buffer.find("Content-Length: ");
          if (at != std::string::npos && at < head) {
            (void)absl::SimpleAtoi(buffer.substr(at + 16, buffer.find("\r\n", at) - at - 16), &length);
          }
          if (buffer.size() >= head + 4 + length) {
            std::string request = buffer.substr(0, head + 4 + length);
            buffer.erase(0, head + 4 + length);
            {
              absl::MutexLock lock(&mu_);
              last_ = request;
            }
            std::string reply = answer_(request);
            if (reply.empty()) break;  // hold: the client cancels
            if (::send(conn, reply.data(), reply.size(), MSG_NOSIGNAL) < 0) break;
            continue;
          }
        }
        ssize_t n = ::recv(conn, chunk, sizeof(chunk), 0);
        if (n <= 0) break;
        buffer.append(chunk, n);
      }
      // A held stream (or a client done with the connection): wait for the
      // client to go away.
      while (::recv(conn, chunk, sizeof(chunk), 0) > 0) {
      }
      ::close(conn);
    }
  }

  std::string path_;
  std::function<std::string(const std::string&)> answer_;
  int fd_ = -1;
  std::thread thread_;
  absl::Mutex mu_;
  std::string last_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> connections_{0};
};

std::string Reply(int status, const std::string& body) {
  return absl::StrCat("HTTP/1.1 ", status, " X\r\nContent-Type: application/json\r\nContent-Length: ",
                      body.size(), "\r\n\r\n", body);
}

CurlClientOptions Options(const std::string& socket) {
  CurlClientOptions options;
  options.base_url = "http://localhost/v9";
  options.unix_socket = socket;
  options.peer = "test server at unix://" + socket;
  options.max_body_bytes = 1024;
  options.configure = [](void*, std::vector<std::string>* headers) {
    headers->push_back("X-Configured: yes");
  };
  return options;
}

TEST_CASE("a request sends method, path, headers and body, and reuses its connection") {
  std::string socket = TempSocketPath();
  TinyServer server(socket, [](const std::string&) { return Reply(201, "{\"ok\":true}"); });
  CurlClient client(Options(socket));
  auto made = client.Request("PATCH", "/things/a?x=1", "{\"a\":1}", "application/merge-patch+json",
                             absl::Seconds(5));
  REQUIRE(made.ok());
  CHECK(made->status == 201);
  CHECK(made->body == "{\"ok\":true}");
  std::string request = server.last_request();
  CHECK(absl::StartsWith(request, "PATCH /v9/things/a?x=1 HTTP/1.1\r\n"));
  CHECK(absl::StrContains(request, "Content-Type: application/merge-patch+json\r\n"));
  CHECK(absl::StrContains(request, "X-Configured: yes\r\n"));
  CHECK(absl::EndsWith(request, "\r\n\r\n{\"a\":1}"));
  auto deleted = client.Request("DELETE", "/things/a", "", "", absl::Seconds(5));
  REQUIRE(deleted.ok());
  CHECK(absl::StartsWith(server.last_request(), "DELETE /v9/things/a HTTP/1.1\r\n"));
  CHECK_FALSE(absl::StrContains(server.last_request(), "Content-Type"));
  CHECK(server.connections() == 1);  // the pooled handle kept its connection
}

TEST_CASE("an answer over the bound is RESOURCE_EXHAUSTED") {
  std::string socket = TempSocketPath();
  TinyServer server(socket, [](const std::string&) { return Reply(200, std::string(4096, 'x')); });
  CurlClient client(Options(socket));
  auto got = client.Request("GET", "/big", "", "", absl::Seconds(5));
  REQUIRE(got.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(got.status().message(), "exceeds 1024 bytes"));
}

TEST_CASE("a stream hands data over until cancelled from another thread") {
  std::string socket = TempSocketPath();
  TinyServer server(socket, [](const std::string&) {
    // Headers and a first chunk, then nothing: the client must cancel.
    return std::string("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n");
  });
  CurlClient client(Options(socket));
  StreamCanceller canceller;
  std::string seen;
  long status = 0;
  std::string error;
  absl::Time start = absl::Now();
  std::thread cancel([&] {
    absl::SleepFor(absl::Milliseconds(300));
    canceller.Cancel();
  });
  absl::Status streamed = client.Stream(
      "/events",
      [&](absl::string_view data) {
        seen.append(data.data(), data.size());
        return true;
      },
      &canceller, &status, &error);
  cancel.join();
  CHECK(streamed.ok());
  CHECK(status == 200);
  CHECK(seen == "hello");
  CHECK(absl::Now() - start < absl::Seconds(5));
}

TEST_CASE("no socket and a refused one are UNAVAILABLE saying what connect said") {
  std::string socket = TempSocketPath();
  CurlClient missing(Options(socket));
  auto got = missing.Request("GET", "/x", "", "", absl::Seconds(2));
  REQUIRE(got.status().code() == absl::StatusCode::kUnavailable);
  CHECK(absl::StrContains(got.status().message(), "test server at unix://"));
  CHECK(absl::StrContains(got.status().message(), "connect: No such file or directory"));

  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);  // bound, never listening
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", socket.c_str());
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  auto refused = missing.Request("GET", "/x", "", "", absl::Seconds(2));
  REQUIRE(refused.status().code() == absl::StatusCode::kUnavailable);
  CHECK(absl::StrContains(refused.status().message(), "connect: Connection refused"));
  ::close(fd);
  ::unlink(socket.c_str());
}

TEST_CASE("An API error body gives its JSON message, else its own first KiB",
          "[curl_http]") {
  CHECK(JsonErrorMessage(R"({"message": "no such image", "kind": "x"})") == "no such image");
  CHECK(JsonErrorMessage("{\"message\": 7}\n") == "{\"message\": 7}");  // not a string
  CHECK(JsonErrorMessage("page not found\r\n\n") == "page not found");
  CHECK(JsonErrorMessage("").empty());
  const std::string long_text(5000, 'e');
  CHECK(JsonErrorMessage(long_text) == long_text.substr(0, 1024));
}

}  // namespace
}  // namespace agentix::providers::curl_http
