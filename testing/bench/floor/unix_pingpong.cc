// The machine's floor for a request/response over a Unix socket: two
// processes (fork) ping-pong length-prefixed messages of the benchmark's
// sizes over a socketpair, nothing else. See testing/bench/README.md.
//
//   unix_pingpong [--quick] [--small-bytes=64] [--big-mib=16]
//
// Prints one JSON line (floor_stats.h). The big message goes through in 1 MiB
// writes, as the remote-call wire cuts payloads.
#include <sys/socket.h>
#include <sys/wait.h>
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

// Echoes every message back until EOF.
void Echo(int fd) {
  std::string buffer;
  for (;;) {
    uint64_t size = 0;
    if (!ReadAll(fd, reinterpret_cast<char*>(&size), sizeof(size))) return;
    buffer.resize(size);
    if (!ReadAll(fd, buffer.data(), size)) return;
    if (!WriteAll(fd, reinterpret_cast<char*>(&size), sizeof(size)) ||
        !WriteAll(fd, buffer.data(), size)) {
      return;
    }
  }
}

double RoundTrip(int fd, const std::string& message, std::string* back) {
  const double start = Now();
  uint64_t size = message.size();
  if (!WriteAll(fd, reinterpret_cast<char*>(&size), sizeof(size)) ||
      !WriteAll(fd, message.data(), message.size()) ||
      !ReadAll(fd, reinterpret_cast<char*>(&size), sizeof(size))) {
    std::perror("ping-pong");
    std::exit(1);
  }
  back->resize(size);
  if (!ReadAll(fd, back->data(), size)) std::exit(1);
  return Now() - start;
}

int Main(int argc, char** argv) {
  const FloorArgs args = ParseFloorArgs(argc, argv);
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return 1;
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[0]);
    Echo(fds[1]);
    ::_exit(0);
  }
  ::close(fds[1]);
  const int fd = fds[0];
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
