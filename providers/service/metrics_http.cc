#include "providers/service/metrics_http.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "providers/service/metrics_text.h"

namespace agentix::providers {
namespace {

struct Connection {
  base::UniqueFd fd;
  std::string in;
  std::string out;  // the response, once the request head is complete
  size_t written = 0;
  absl::Time deadline;
};

std::string Response(absl::string_view status, absl::string_view content_type,
                     absl::string_view body, bool head_only) {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(),
                      "\r\nConnection: close\r\n\r\n",
                      head_only ? absl::string_view() : body);
}

// The response to a complete request head (up to the blank line).
std::string Answer(absl::string_view head,
                   const std::function<std::string()>& render) {
  absl::string_view line = head.substr(0, head.find("\r\n"));
  std::vector<absl::string_view> parts =
      absl::StrSplit(line, ' ', absl::SkipEmpty());
  constexpr char kText[] = "text/plain; charset=utf-8";
  if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/1.")) {
    return Response("400 Bad Request", kText, "bad request line\n", false);
  }
  const bool head_only = parts[0] == "HEAD";
  if (parts[0] != "GET" && !head_only) {
    return Response("405 Method Not Allowed", kText, "only GET\n", false);
  }
  absl::string_view path = parts[1].substr(0, parts[1].find('?'));
  if (path != "/metrics") {
    return Response("404 Not Found", kText, "not found; try /metrics\n",
                    head_only);
  }
  return Response("200 OK", kPrometheusContentType, render(), head_only);
}

absl::StatusOr<base::UniqueFd> Listen(const std::string& address, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics-listen ", address, ": want HOST:PORT, [V6]:PORT or :PORT"));
  }
  std::string host = address.substr(0, colon);
  const std::string port_text = address.substr(colon + 1);
  int port_number = 0;
  if (!absl::SimpleAtoi(port_text, &port_number) || port_number < 0 ||
      port_number > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-listen ", address, ": bad port"));
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(),
                               port_text.c_str(), &hints, &found);
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics-listen ", address, ": ", ::gai_strerror(rc)));
  }
  std::string error = "no address";
  base::UniqueFd fd;
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    base::UniqueFd candidate(::socket(
        ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!candidate.valid()) continue;
    int one = 1;
    ::setsockopt(candidate.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(candidate.get(), ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::listen(candidate.get(), 64) == 0) {
      fd = std::move(candidate);
      break;
    }
    error = std::strerror(errno);
  }
  ::freeaddrinfo(found);
  if (!fd.valid()) {
    return absl::UnavailableError(
        absl::StrCat("--metrics-listen ", address, ": ", error));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len);
  *port = bound.ss_family == AF_INET6
              ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
              : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    MetricsHttpOptions options, std::function<std::string()> render) {
  int port = 0;
  absl::StatusOr<base::UniqueFd> listen = Listen(options.address, &port);
  if (!listen.ok()) return listen.status();
  base::UniqueFd wake(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake.valid()) {
    return absl::InternalError(
        absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  return std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(std::move(options), std::move(render),
                            std::move(*listen), std::move(wake), port));
}

MetricsHttpServer::MetricsHttpServer(MetricsHttpOptions options,
                                     std::function<std::string()> render,
                                     base::UniqueFd listen,
                                     base::UniqueFd wake, int port)
    : options_(std::move(options)),
      render_(std::move(render)),
      listen_(std::move(listen)),
      wake_(std::move(wake)),
      port_(port) {
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "agx-metrics");
    Loop();
  });
}

MetricsHttpServer::~MetricsHttpServer() {
  const uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
  thread_.join();
}

void MetricsHttpServer::Loop() {
  std::vector<Connection> connections;
  std::vector<pollfd> fds;
  while (true) {
    fds.clear();
    fds.push_back({wake_.get(), POLLIN, 0});
    fds.push_back({listen_.get(), POLLIN, 0});
    absl::Time next_deadline = absl::InfiniteFuture();
    for (const Connection& c : connections) {
      fds.push_back({c.fd.get(),
                     static_cast<short>(c.out.empty() ? POLLIN : POLLOUT), 0});
      next_deadline = std::min(next_deadline, c.deadline);
    }
    int timeout_ms = -1;
    if (next_deadline != absl::InfiniteFuture()) {
      timeout_ms = static_cast<int>(std::max<int64_t>(
          0, absl::ToInt64Milliseconds(next_deadline - absl::Now()) + 1));
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      return;
    }
    if (fds[0].revents != 0) return;
    const absl::Time now = absl::Now();
    // Existing connections first (their pollfds follow the first two).
    std::vector<Connection> kept;
    for (size_t i = 0; i < connections.size(); ++i) {
      Connection& c = connections[i];
      const short revents = fds[i + 2].revents;
      bool done = false;
      if (revents & (POLLERR | POLLNVAL)) {
        done = true;
      } else if (c.out.empty() && (revents & (POLLIN | POLLHUP))) {
        char buf[4096];
        const ssize_t n = ::recv(c.fd.get(), buf, sizeof(buf), 0);
        if (n > 0) {
          c.in.append(buf, static_cast<size_t>(n));
          const size_t end = c.in.find("\r\n\r\n");
          if (end != std::string::npos && end + 4 <= kMaxRequestBytes) {
            c.out = Answer(absl::string_view(c.in).substr(0, end), render_);
          } else if (c.in.size() > kMaxRequestBytes) {
            c.out = Response("431 Request Header Fields Too Large",
                             "text/plain; charset=utf-8",
                             "request head too large\n", false);
          }
        } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
          done = true;  // closed before a complete request
        }
      } else if (!c.out.empty() && (revents & (POLLOUT | POLLHUP))) {
        const ssize_t n = ::send(c.fd.get(), c.out.data() + c.written,
                                 c.out.size() - c.written, MSG_NOSIGNAL);
        if (n > 0) {
          c.written += static_cast<size_t>(n);
          done = c.written == c.out.size();
        } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
          done = true;
        }
      }
      if (!done && now >= c.deadline) done = true;
      if (done) {
        ::shutdown(c.fd.get(), SHUT_WR);
      } else {
        kept.push_back(std::move(c));
      }
    }
    connections = std::move(kept);
    if (fds[1].revents & POLLIN) {
      while (true) {
        base::UniqueFd fd(
            ::accept4(listen_.get(), nullptr, nullptr,
                      SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (!fd.valid()) break;  // EAGAIN, or out of fds: retried next poll
        if (connections.size() >= options_.max_connections) continue;
        Connection c;
        c.fd = std::move(fd);
        c.deadline = now + options_.idle_timeout;
        connections.push_back(std::move(c));
      }
    }
  }
}

}  // namespace agentix::providers
