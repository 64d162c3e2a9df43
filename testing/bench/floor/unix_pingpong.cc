// The machine's floor for a request/response over a Unix socket: two
// processes (fork) ping-pong length-prefixed messages of the benchmark's
// sizes over a socketpair, nothing else. See testing/bench/README.md.
//
//   unix_pingpong [--quick] [--small-bytes=64] [--big-mib=16]
//
// Prints one JSON line (floor_stats.h). The echo streams a message back in
// pieces of at most 1 MiB as they arrive (as the daemon relays chunks), and
// the measuring side writes and reads at once (poll), so a big message is
// not stored and forwarded whole.
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <csignal>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "testing/bench/floor/floor_stats.h"

namespace agentix::bench {
namespace {

bool ReadAll(int fd, char* data, size_t n) {
  while (n > 0) {
    const ssize_t got = ::read(fd, data, n);
    if (got <= 0) return false;
    data += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

bool WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t put = ::write(fd, data, std::min<size_t>(n, 1 << 20));
    if (put <= 0) return false;
    data += put;
    n -= static_cast<size_t>(put);
  }
  return true;
}

// Echoes every message back until EOF, each piece as soon as it arrived.
void Echo(int fd) {
  std::string buffer(1 << 20, '\0');
  for (;;) {
    uint64_t size = 0;
    if (!ReadAll(fd, reinterpret_cast<char*>(&size), sizeof(size))) return;
    if (!WriteAll(fd, reinterpret_cast<char*>(&size), sizeof(size))) return;
    while (size > 0) {
      const ssize_t got = ::read(fd, buffer.data(), std::min<uint64_t>(size, buffer.size()));
      if (got <= 0 || !WriteAll(fd, buffer.data(), static_cast<size_t>(got))) return;
      size -= static_cast<uint64_t>(got);
    }
  }
}

// Sends `message` (size-prefixed) and reads the echo into `back`, writing
// and reading as the socket allows (fd is non-blocking).
double RoundTrip(int fd, const std::string& message, std::string* back) {
  const double start = Now();
  uint64_t size = message.size();
  std::string out(reinterpret_cast<char*>(&size), sizeof(size));
  const size_t total_out = sizeof(size) + message.size();
  size_t sent = 0, received = 0;
  back->resize(sizeof(size) + message.size());
  while (received < back->size()) {
    pollfd p{fd, static_cast<short>(POLLIN | (sent < total_out ? POLLOUT : 0)), 0};
    if (::poll(&p, 1, -1) < 0) continue;
    if (sent < total_out && (p.revents & POLLOUT)) {
      const char* data = sent < sizeof(size) ? out.data() + sent
                                             : message.data() + (sent - sizeof(size));
      const size_t n = sent < sizeof(size) ? sizeof(size) - sent
                                           : std::min<size_t>(total_out - sent, 1 << 20);
      const ssize_t put = ::write(fd, data, n);
      if (put > 0) sent += static_cast<size_t>(put);
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      const ssize_t got = ::read(fd, back->data() + received, back->size() - received);
      if (got == 0) {
        std::fprintf(stderr, "ping-pong: the echo process went away\n");
        std::exit(1);
      }
      if (got > 0) received += static_cast<size_t>(got);
    }
  }
  back->erase(0, sizeof(size));
  return Now() - start;
}

int Main(int argc, char** argv) {
  const FloorArgs args = ParseFloorArgs(argc, argv);
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return 1;
  // Socket buffers as large as gRPC's transport asks for (a few MiB), so a
  // big message is not cut into a context switch per 200 KiB.
  for (int fd : fds) {
    const int bytes = 4 << 20;
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
  }
  const pid_t child = ::fork();
  if (child == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::close(fds[0]);
    Echo(fds[1]);
    ::_exit(0);
  }
  ::close(fds[1]);
  const int fd = fds[0];
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  std::string back;
  const std::string small(args.small_bytes, 'x');
  for (int i = 0; i < args.warmup(); ++i) RoundTrip(fd, small, &back);
  std::vector<double> small_rtts;
  for (int i = 0; i < args.calls(); ++i) small_rtts.push_back(RoundTrip(fd, small, &back));
  std::string big(args.big_bytes, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131);
  RoundTrip(fd, big, &back);  // warm-up
  std::vector<double> big_rtts;
  for (int i = 0; i < args.big_reps(); ++i) big_rtts.push_back(RoundTrip(fd, big, &back));
  if (back != big) {
    std::fprintf(stderr, "echo returned different bytes\n");
    return 1;
  }
  ::close(fd);
  int status = 0;
  ::waitpid(child, &status, 0);
  PrintFloor("unix_socket", args, small_rtts, big_rtts);
  return 0;
}

}  // namespace
}  // namespace agentix::bench

int main(int argc, char** argv) { return agentix::bench::Main(argc, argv); }
