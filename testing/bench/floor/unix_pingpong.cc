// The machine's floor for a request/response over a Unix socket: two
// processes (fork) ping-pong length-prefixed messages of the benchmark's
// sizes over a socketpair, nothing else. See testing/bench/README.md.
//
//   unix_pingpong [--quick] [--small-bytes=64] [--big-mib=1,16,64]
//                 [--concurrency=16,64]
//   unix_pingpong [--quick] --stream-records=N --record-bytes=S
//   unix_pingpong [--quick] --relay [--relay-poll] [the ping-pong flags]
//   unix_pingpong --one-cpu [the ping-pong flags]
//
// Prints one JSON line (floor_stats.h). The echo streams a message back in
// pieces of at most 1 MiB as they arrive (as the daemon relays chunks), and
// the measuring side writes and reads at once (poll), so a big message is
// not stored and forwarded whole. --concurrency=N keeps N small messages in
// flight on the one socket (calls_per_s_c<N>: the floor of N callers sharing
// one connection). --stream-records measures a one-way stream instead: N
// length-prefixed records of S bytes to a reader that counts them, packed
// into 64 KiB writes (records_per_s) and one write per record
// (records_per_s_unbatched) -- the floor of a log or span stream.
// --one-cpu pins the ping-pong (both processes) to the CPU it starts on: the
// floor when the scheduler keeps the pair on one CPU, which it does in some
// runs and not in others (16 against 31 µs on these VMs; docs/PERFORMANCE.md
// "stop-44: the floor's two placements").
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
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

// Forwards whatever arrives on `from` to `to` until EOF, then shuts `to`
// down for writing so EOF travels on. `poll_first`: wait in poll(POLLIN)
// before each read, as the daemon's relay threads do (a reader blocked in
// read() is also woken by the socket's write-space wake-ups).
void Forward(int from, int to, bool poll_first) {
  std::string buffer(1 << 20, '\0');
  for (;;) {
    pollfd ready{from, POLLIN, 0};
    if (poll_first && ::poll(&ready, 1, -1) < 0) break;
    const ssize_t got = ::read(from, buffer.data(), buffer.size());
    if (got <= 0 || !WriteAll(to, buffer.data(), static_cast<size_t>(got))) break;
  }
  ::shutdown(to, SHUT_WR);
}

// The relay process: `client` <-> `server`, one thread per direction.
void Relay(int client, int server, bool poll_first) {
  std::thread back([&] { Forward(server, client, poll_first); });
  Forward(client, server, poll_first);
  back.join();
}

// Counts `expected` records (u64 size + body) arriving in any pieces, then
// answers one byte.
void Sink(int fd, uint64_t expected) {
  std::string buffer(64 << 10, '\0');
  uint64_t seen = 0, need = 0;  // need: body bytes left of the current record
  std::string header;
  while (seen < expected) {
    const ssize_t got = ::read(fd, buffer.data(), buffer.size());
    if (got <= 0) return;
    size_t at = 0;
    while (at < static_cast<size_t>(got)) {
      if (need > 0) {
        const size_t take = std::min<uint64_t>(need, got - at);
        at += take;
        need -= take;
        if (need == 0) ++seen;
        continue;
      }
      const size_t take = std::min<size_t>(sizeof(uint64_t) - header.size(), got - at);
      header.append(buffer.data() + at, take);
      at += take;
      if (header.size() == sizeof(uint64_t)) {
        std::memcpy(&need, header.data(), sizeof(need));
        header.clear();
        if (need == 0) ++seen;
      }
    }
  }
  const char done = 1;
  WriteAll(fd, &done, 1);
}

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "ping-pong: %s\n", what);
  std::exit(1);
}

// Reads exactly n bytes from a non-blocking fd.
void ReadFull(int fd, char* data, size_t n) {
  while (n > 0) {
    const ssize_t got = ::read(fd, data, n);
    if (got == 0) Die("the echo process went away");
    if (got < 0) {
      pollfd p{fd, POLLIN, 0};
      ::poll(&p, 1, -1);
      continue;
    }
    data += got;
    n -= static_cast<size_t>(got);
  }
}

// Writes exactly n bytes to a non-blocking fd.
void WriteFull(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t put = ::write(fd, data, std::min<size_t>(n, 1 << 20));
    if (put < 0) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, -1);
      continue;
    }
    data += put;
    n -= static_cast<size_t>(put);
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
      if (got == 0) Die("the echo process went away");
      if (got > 0) received += static_cast<size_t>(got);
    }
  }
  back->erase(0, sizeof(size));
  return Now() - start;
}

std::string Frame(const std::string& body) {
  const uint64_t size = body.size();
  return std::string(reinterpret_cast<const char*>(&size), sizeof(size)) + body;
}

// `depth` small messages in flight: each echo that comes back sends the next.
// Returns completed round trips per second over the measuring window.
double Pipelined(int fd, size_t bytes, size_t depth, const FloorArgs& args) {
  const std::string frame = Frame(std::string(bytes, 'x'));
  std::string in(frame.size(), '\0');
  for (size_t i = 0; i < depth; ++i) WriteFull(fd, frame.data(), frame.size());
  const double start = Now();
  const double from = start + args.window_warmup_s(), until = from + args.window_s();
  uint64_t counted = 0;
  double now = start, first = 0;
  while (now < until) {
    ReadFull(fd, in.data(), in.size());
    WriteFull(fd, frame.data(), frame.size());
    now = Now();
    if (now >= from) {
      if (counted++ == 0) first = now;
    }
  }
  for (size_t i = 0; i < depth; ++i) ReadFull(fd, in.data(), in.size());  // drain
  return counted > 1 ? (counted - 1) / (now - first) : 0;
}

// A connected pair with socket buffers as large as gRPC's transport asks
// for (a few MiB), so a big message is not cut into a context switch per
// 200 KiB.
void BigSocketPair(int fds[2]) {
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) Die("socketpair");
  for (int i = 0; i < 2; ++i) {
    const int bytes = 4 << 20;
    ::setsockopt(fds[i], SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
    ::setsockopt(fds[i], SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
  }
}

// Forks a child that runs `body` and exits; it dies with its parent.
template <typename Body>
pid_t ForkChild(Body body) {
  const pid_t child = ::fork();
  if (child < 0) Die("fork");
  if (child == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    body();
    ::_exit(0);
  }
  return child;
}

// Pins this process, and so the children it forks, to the CPU it runs on.
void PinToThisCpu() {
  const int cpu = sched_getcpu();
  if (cpu < 0) Die("sched_getcpu");
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) Die("sched_setaffinity");
}

int PingPong(const FloorArgs& args, bool relay, bool relay_poll, bool one_cpu) {
  if (one_cpu) PinToThisCpu();
  int fds[2];
  BigSocketPair(fds);
  std::vector<pid_t> children;
  if (!relay) {
    children.push_back(ForkChild([&] {
      ::close(fds[0]);
      Echo(fds[1]);
    }));
  } else {
    int inner[2];  // relay <-> echo
    BigSocketPair(inner);
    children.push_back(ForkChild([&] {
      ::close(fds[0]);
      ::close(fds[1]);
      ::close(inner[0]);
      Echo(inner[1]);
    }));
    children.push_back(ForkChild([&] {
      ::close(fds[0]);
      ::close(inner[1]);
      Relay(fds[1], inner[0], relay_poll);
    }));
    ::close(inner[0]);
    ::close(inner[1]);
  }
  ::close(fds[1]);
  const int fd = fds[0];
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  JsonLine json;
  json.Str("kind", !relay ? "unix_socket" : relay_poll ? "unix_socket_relay_poll" : "unix_socket_relay");
  json.Str("cpus", one_cpu ? "one" : "any");
  json.Num("small_bytes", args.small_bytes);
  std::string back;
  const std::string small(args.small_bytes, 'x');
  for (int i = 0; i < args.warmup(); ++i) RoundTrip(fd, small, &back);
  CpuMeter cpu(children);
  std::vector<double> small_rtts;
  for (int i = 0; i < args.calls(); ++i) small_rtts.push_back(RoundTrip(fd, small, &back));
  AddSmall(&json, small_rtts, cpu.SelfSeconds(), cpu.PeerSeconds());
  for (size_t depth : args.concurrency) {
    json.Num("calls_per_s_c" + std::to_string(depth), Pipelined(fd, args.small_bytes, depth, args));
  }
  for (size_t mib : args.big_mib) {
    std::string big(mib << 20, '\0');
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131);
    RoundTrip(fd, big, &back);  // warm-up
    cpu.Restart();
    std::vector<double> big_rtts;
    for (int i = 0; i < args.big_reps(); ++i) big_rtts.push_back(RoundTrip(fd, big, &back));
    if (back != big) Die("echo returned different bytes");
    AddBig(&json, mib, big_rtts, cpu.SelfSeconds() + cpu.PeerSeconds());
  }
  ::close(fd);
  for (pid_t child : children) {
    int status = 0;
    ::waitpid(child, &status, 0);
  }
  json.Print();
  return 0;
}

// One pass of the stream floor: seconds until the sink has all records.
double StreamPass(uint64_t records, size_t record_bytes, bool batched, double* cpu_s) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) Die("socketpair");
  const pid_t child = ::fork();
  if (child == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::close(fds[0]);
    Sink(fds[1], records);
    ::_exit(0);
  }
  ::close(fds[1]);
  const int fd = fds[0];
  const std::string frame = Frame(std::string(record_bytes, 'r'));
  std::string batch;
  CpuMeter cpu(child);
  const double start = Now();
  for (uint64_t i = 0; i < records; ++i) {
    if (!batched) {
      if (!WriteAll(fd, frame.data(), frame.size())) Die("stream write");
      continue;
    }
    batch += frame;
    if (batch.size() + frame.size() > (64 << 10) || i + 1 == records) {
      if (!WriteAll(fd, batch.data(), batch.size())) Die("stream write");
      batch.clear();
    }
  }
  char done = 0;
  if (!ReadAll(fd, &done, 1)) Die("the sink went away");
  const double took = Now() - start;
  *cpu_s = cpu.SelfSeconds() + cpu.PeerSeconds();
  ::close(fd);
  int status = 0;
  ::waitpid(child, &status, 0);
  return took;
}

int Stream(const FloorArgs& args, uint64_t records, size_t record_bytes) {
  JsonLine json;
  json.Str("kind", "unix_socket_stream");
  json.Num("records", records);
  json.Num("record_bytes", record_bytes);
  double cpu_s = 0;
  StreamPass(std::max<uint64_t>(records / 10, 1), record_bytes, true, &cpu_s);  // warm-up
  double took = StreamPass(records, record_bytes, true, &cpu_s);
  json.Num("records_per_s", records / took);
  json.Num("cpu_us_per_record", cpu_s / records * 1e6);
  took = StreamPass(records, record_bytes, false, &cpu_s);
  json.Num("records_per_s_unbatched", records / took);
  json.Num("cpu_us_per_record_unbatched", cpu_s / records * 1e6);
  json.Print();
  return 0;
}

int Main(int argc, char** argv) {
  uint64_t records = 0;
  size_t record_bytes = 200;
  bool relay = false;
  bool relay_poll = false;
  bool one_cpu = false;
  const FloorArgs args = ParseFloorArgs(argc, argv, [&](const char* a) {
    if (std::strncmp(a, "--stream-records=", 17) == 0) {
      records = std::strtoull(a + 17, nullptr, 10);
    } else if (std::strncmp(a, "--record-bytes=", 15) == 0) {
      record_bytes = std::strtoull(a + 15, nullptr, 10);
    } else if (std::strcmp(a, "--relay") == 0) {
      relay = true;
    } else if (std::strcmp(a, "--relay-poll") == 0) {
      relay = relay_poll = true;
    } else if (std::strcmp(a, "--one-cpu") == 0) {
      one_cpu = true;
    } else {
      return false;
    }
    return true;
  });
  return records > 0 ? Stream(args, records, record_bytes) : PingPong(args, relay, relay_poll, one_cpu);
}

}  // namespace
}  // namespace agentix::bench

int main(int argc, char** argv) { return agentix::bench::Main(argc, argv); }
